"""Where a suite runs and how it is timed: the GPU (CUDA events), the host (perf_counter).

Each device offers the same members: the array and sparse modules (``xp``, ``sp``), the card's
name and a short name for result files (``slug``), ``timed`` (milliseconds of a run of calls),
``summary`` (the statistic a row reports), synchronisation, memory release and peak memory.
"""

import os
import platform
import re
import statistics
import time
import tracemalloc

import numpy as np
from arrays import short_error


class GPU:
    """CuPy arrays, cupyx.scipy.sparse, CUDA-event timing, median of the runs."""

    gpu = True
    sparse_name = "cupyx"
    statistic = "median"
    #: The first call compiles and caches; a second, untimed call sizes the repetitions.
    plan_from_first = False
    measures_peak = True

    def __init__(self, sync_each):
        import cupy
        import cupyx.scipy.sparse

        self.cp = self.xp = cupy
        self.sp = cupyx.scipy.sparse
        self.sync_each = sync_each
        self.torch = None
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"?")
        self.card = name.decode() if isinstance(name, bytes) else str(name)
        self.props = {
            "name": self.card,
            "compute_capability": f"{props.get('major')}.{props.get('minor')}",
            "multiprocessors": props.get("multiProcessorCount"),
            "memory_bytes": props.get("totalGlobalMem"),
            "l2_bytes": props.get("l2CacheSize"),
            "clock_khz": props.get("clockRate"),
            "memory_clock_khz": props.get("memoryClockRate"),
            "memory_bus_bits": props.get("memoryBusWidth"),
        }
        self.l2_bytes = int(props.get("l2CacheSize") or 50 << 20)
        # "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100-sxm4-80gb"
        words = re.sub(r"(?i)^nvidia\s+", "", self.card).split() or ["gpu"]
        self.slug = re.sub(r"[^a-z0-9]+", "-", words[0].lower()).strip("-") or "gpu"

    def versions(self):
        cp = self.cp
        v = {"cupy": cp.__version__}
        for key, fn in (("cuda_runtime", cp.cuda.runtime.runtimeGetVersion),
                        ("cuda_driver", cp.cuda.runtime.driverGetVersion)):
            try:
                v[key] = fn()
            except Exception as exc:  # noqa: BLE001 - record, never fail on metadata
                v[key] = short_error(exc)
        try:
            v["nvrtc"] = ".".join(map(str, cp.cuda.nvrtc.getVersion()))
        except Exception as exc:  # noqa: BLE001
            v["nvrtc"] = short_error(exc)
        return v

    def timing_method(self):
        return ("CUDA events, one pair per run, "
                + ("synchronised after each run" if self.sync_each else
                   "runs queued back to back") + "; median")

    def summary(self, times):
        return statistics.median(times)

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def healthy(self):
        """False once the CUDA context is broken (an illegal access poisons it for good)."""
        try:
            float(self.cp.ones(4, dtype=np.float32).sum())
            self.sync()
            return True
        except Exception:  # noqa: BLE001
            return False

    def timed(self, fn, nbuf, first, reps):
        """Milliseconds of ``reps`` calls ``fn(i)``, one CUDA event pair each.

        Without ``--sync-each`` the calls are queued back to back (the host runs ahead,
        launch overheads overlap) and one synchronisation ends the loop.
        """
        cp = self.cp
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
        for r, (start, stop) in enumerate(events):
            start.record()
            fn((first + r) % nbuf)
            stop.record()
            if self.sync_each:
                stop.synchronize()
        events[-1][1].synchronize()
        return [cp.cuda.get_elapsed_time(start, stop) for start, stop in events]

    def free_bytes(self):
        """Device memory free after returning CuPy's and PyTorch's cached blocks."""
        self.release()
        return int(self.cp.cuda.runtime.memGetInfo()[0])

    def release(self):
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    def copy_fn(self, a, b):
        nbytes = a.nbytes

        def copy(_):
            b.data.copy_from_device_async(a.data, nbytes)  # cudaMemcpyAsync, device to device
        return copy

    def peak_bytes(self, fn):
        """Most device memory ``fn()`` holds at once beyond what was allocated before it.

        CuPy's default pool (:func:`pool_peak_bytes`) plus, when PyTorch is loaded, PyTorch's
        caching allocator (:func:`torch_peak_bytes`): a sum of two peaks, but every contender
        here allocates through one of the two only. Returns the cached blocks first.
        """
        self.release()
        if self.torch is None:
            return pool_peak_bytes(self.cp, fn)[1]
        (_, torch_peak), cupy_peak = pool_peak_bytes(
            self.cp, lambda: torch_peak_bytes(self.torch, fn))
        return cupy_peak + torch_peak


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class DryRun:
    """NumPy arrays, scipy.sparse, perf_counter timing: the GPU suite's control flow on the
    CPU at tiny sizes. Its numbers measure nothing."""

    gpu = False
    sparse_name = "scipy"
    sync_each = True
    torch = None
    statistic = "median"
    plan_from_first = False
    measures_peak = True

    def __init__(self):
        import scipy.sparse

        self.xp = np
        self.sp = scipy.sparse
        self.cores = _cores()
        self.processor = platform.processor() or platform.machine()
        self.card = f"CPU dry run ({self.cores} cores, {self.processor})"
        self.slug = "dry-run"
        self.props = {"name": self.card, "cores": self.cores, "processor": self.processor}
        self.l2_bytes = 1 << 20

    def versions(self):
        return {}

    def timing_method(self):
        return f"perf_counter, synchronised after each run; {self.statistic}"

    def summary(self, times):
        return statistics.median(times)

    def sync(self):
        pass

    def healthy(self):
        return True

    def timed(self, fn, nbuf, first, reps):
        times = []
        for r in range(reps):
            t = time.perf_counter()
            fn((first + r) % nbuf)
            times.append((time.perf_counter() - t) * 1e3)
        return times

    def free_bytes(self):
        return 8 << 30

    def release(self):
        pass

    def copy_fn(self, a, b):
        def copy(_):
            np.copyto(b, a)
        return copy

    def peak_bytes(self, fn):
        """Most host memory ``fn()`` holds at once beyond what was allocated before it.

        Measured with tracemalloc, to which NumPy reports its buffers (a CPU PyTorch's are not
        seen): the dry run's stand-in for the GPU's counting allocator.
        """
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            result = fn()
            peak = tracemalloc.get_traced_memory()[1]
            del result
        finally:
            if not tracing:
                tracemalloc.stop()
        return peak - before


class Host(DryRun):
    """The CPU suite: NumPy and scipy.sparse in one process, perf_counter, best of the runs.

    The first (checked) call is the warm-up and sizes the repetitions. No peak memory:
    tracemalloc would slow the calls it watches.
    """

    statistic = "best"
    plan_from_first = True
    measures_peak = False

    def __init__(self):
        super().__init__()
        self.card = f"{self.cores}-core CPU ({self.processor})"
        self.slug = f"{self.cores}core"
        self.props = {"name": self.card, "cores": self.cores, "processor": self.processor,
                      "os_cpu_count": os.cpu_count()}

    def timing_method(self):
        return "perf_counter around each call, one process; best of the runs"

    def summary(self, times):
        return min(times)

    def versions(self):
        import scipy

        return {"scipy": scipy.__version__}


def pool_peak_bytes(cp, fn):
    """``(fn(), peak)``: the most bytes of CuPy's default pool in use during ``fn()``, less
    those in use before it.

    For this one call, a thread-local allocator forwards every allocation to the pool and notes
    the pool's bytes in use after it; the pool's use can only grow at an allocation, so the
    largest note is the peak. The output counts (it is alive at the end), the input does not
    (it was allocated before). Memory that bypasses CuPy's allocator is not seen.
    """
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    before = peak = pool.used_bytes()

    def malloc(size):
        nonlocal peak
        mem = pool.malloc(size)
        peak = max(peak, pool.used_bytes())
        return mem

    with cp.cuda.using_allocator(malloc):
        result = fn()
        cp.cuda.get_current_stream().synchronize()
    return result, peak - before


def torch_peak_bytes(torch, fn):
    """``(fn(), peak)`` for PyTorch's CUDA caching allocator, as :func:`pool_peak_bytes`."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before
