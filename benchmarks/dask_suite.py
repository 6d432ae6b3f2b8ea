"""The Dask suite (``--dask``): ``A @ B`` with a row-partitioned TwELL matrix (:mod:`twell.dask`),
on one GPU and on several.

Workload: A is an activation-like M x K matrix (``--shape M,K,N``, default 65536 x 5632, B
K x 2048) with non-zeros spread uniformly at ``--density`` (entry (r, c) a hash of (r, c), so
the same matrix however it is chunked), generated block by block where the block lives; B is
dense. Strong scaling: the same problem on every configuration.

Configurations, in order:

single
    One :class:`twell.TwELLMatrix` of the whole matrix on GPU 0, ``a @ b``: the baseline
    without Dask.
dask-local
    :mod:`twell.dask` with CuPy blocks on GPU 0 and Dask's synchronous scheduler: the cost of
    the partitioning and of Dask itself.
cluster-W
    When ``dask_cuda`` imports: a ``LocalCUDACluster`` with one worker per GPU, for W = 1, 2,
    4, ... up to the visible GPUs. Scaling efficiency is ``t(1) / (W * t(W))`` against the
    one-worker cluster. A and B are built and kept on the workers (B copied to every worker
    first); the timed part is the product, kept on the workers, until every GPU has finished
    (``cudaDeviceSynchronize`` on each worker).
cluster-W csr
    The same product with A's blocks as cupyx CSR matrices (float32 and float64), on the same
    cluster: the contender.
weak-W (``--weak``)
    Weak scaling: W workers multiply a matrix of W times the rows, each GPU holding as much as
    the one-worker run; efficiency ``t(1) / t(W)``. Row r of A is the same in every matrix,
    so the first M rows of each product are checked against the one-worker product.
fault-W (``--fault``)
    The product on the largest cluster with one worker's process killed (SIGKILL) while it
    runs one of the product's tasks: the nanny restarts it and Dask recomputes what it held,
    or the product fails; the record says which, and checks a completed product.

``--memory-fraction F`` sizes M so that A (as TwELL), B and C take about F of GPU 0's memory
with one worker, and generates A in blocks small enough for its dense temporaries; the single
and ``dask-local`` baselines, which need the dense A whole, are left out when it would not
fit, and the one-worker cluster's product is then the reference.

Times are wall clock (``perf_counter``) around each run after a warm-up, median of ``--reps``
(default 5); the product of each configuration is checked once against the single-matrix
result. ``--cpu-dry-run`` runs the same steps with NumPy blocks at tiny sizes, Dask's threaded
scheduler standing in for the cluster (W = 1 and 2 threads); its numbers measure nothing.

The JSON (schema ``twell-dask/1``) holds the workload, one record per configuration and notes;
the table goes beside it as text.
"""

import datetime
import json
import pathlib
import platform
import statistics
import sys
import time
import uuid

import numpy as np
from arrays import DTYPES, cast
from harness import git

import twell

SCHEMA = "twell-dask/1"
DEFAULT_SHAPE = (65536, 5632, 2048)


# -- the workload (runs where the blocks live: a worker's GPU, or the host) --------------------

def _mix(z):
    """splitmix64's finaliser on uint64 arrays (wrapping products): a counter-based hash."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def make_rows(block_id=None, *, row_starts, chunk_rows, k, density, on_gpu, seed=1234):
    """One row chunk of A, float32, entry (r, c) a hash of (r, c) alone.

    The matrix is the same however it is chunked: every configuration multiplies the same A.
    A non-zero, with probability ``density``, uniformly spread, lies in [0.25, 1.25).
    """
    xp = _xp(on_gpu)
    i = block_id[0]
    r = xp.arange(row_starts[i], row_starts[i] + chunk_rows[i], dtype=np.uint64)[:, None]
    c = xp.arange(k, dtype=np.uint64)[None, :]
    u = (_mix(r * np.uint64(k) + c + np.uint64(seed)) >> np.uint64(40)).astype(np.float32)
    u *= np.float32(2.0**-24)  # uniform in [0, 1)
    return xp.where(u < np.float32(density), u / np.float32(density) + np.float32(0.25),
                    np.float32(0))


def make_rhs(k, n, on_gpu, dtype, seed=99):
    xp = _xp(on_gpu)
    b = xp.random.RandomState(seed).standard_normal((k, n)).astype(np.float32)
    return cast(xp, b / np.float32(np.sqrt(k)), dtype)


def _xp(on_gpu):
    if on_gpu:
        import cupy

        return cupy
    return np


def dask_matrix(w, n_blocks, on_gpu):
    """A as a Dask array of float32 chunks, ``n_blocks`` row chunks, generated lazily."""
    import dask.array as da

    base, extra = divmod(w["m"], n_blocks)
    rows = tuple(base + (i < extra) for i in range(n_blocks))
    meta = _xp(on_gpu).empty((0, 0), dtype=np.float32)
    starts = tuple(int(v) for v in np.cumsum((0,) + rows[:-1]))
    return da.map_blocks(make_rows, chunks=(rows, (w["k"],)), dtype=np.float32, meta=meta,
                         row_starts=starts, chunk_rows=rows, k=w["k"], density=w["density"],
                         on_gpu=on_gpu)


def sync(on_gpu):
    if on_gpu:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def timed(fn, reps):
    """Median wall time of ``fn()`` after one warm-up call, and the warm-up's result."""
    result = fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def rel_err(got, want, rows=1 << 20):
    """``||got - want|| / ||want||`` in float64, a block of ``rows`` rows at a time (a
    product sized to a GPU's memory would otherwise take several float64 copies on the
    host)."""
    got, want = _host(got), _host(want)
    num = den = 0.0
    for r0 in range(0, max(len(want), 1), rows):
        g = np.asarray(got[r0:r0 + rows], dtype=np.float64)
        t = np.asarray(want[r0:r0 + rows], dtype=np.float64)
        num += float(np.sum((g - t) ** 2))
        den += float(np.sum(t ** 2))
    return float(np.sqrt(num) / max(np.sqrt(den), 1e-30))


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def host_result(y):
    """The dask array ``y`` gathered into one NumPy array, each block copied to the host on
    its worker: gathered as CuPy blocks, a product sized to a GPU's memory would be
    deserialized onto the client's GPU, beside the workers' (on one GPU it does not fit)."""
    meta = np.empty((0,) * y.ndim, dtype=y.dtype)
    return y.map_blocks(_host, dtype=y.dtype, meta=meta).compute()


def _record(config, workers, A, median, times, err):
    stats = A.stats()
    return {"config": config, "workers": workers, "blocks": A.numblocks, "seconds": median,
            "times": times, "nnz": stats["nnz"], "slots": stats["slots"],
            "overflow_nnz": stats["overflow_nnz"], "rel_err_vs_single": err}


# -- configurations ----------------------------------------------------------------------------

def run_single(w, dtype, on_gpu):
    """Baseline: one TwELLMatrix, no Dask."""
    x = make_rows((0, 0), row_starts=(0,), chunk_rows=(w["m"],), k=w["k"],
                  density=w["density"], on_gpu=on_gpu)
    a = twell.TwELLMatrix(x, tile_width=w["tile_width"], dtype=dtype)
    del x
    b = make_rhs(w["k"], w["n"], on_gpu, dtype)

    def step():
        y = a @ b
        sync(on_gpu)
        return y

    median, times, y = timed(step, w["reps"])
    record = {"config": "single", "workers": 1, "seconds": median, "times": times,
              "nnz": a.nnz, "slots": a.slots, "overflow_nnz": a.overflow_nnz}
    return record, y


def run_dask_local(w, dtype, on_gpu, reference):
    """twell.dask on one device, Dask's synchronous scheduler."""
    import dask

    import twell.dask

    with dask.config.set(scheduler="synchronous"):
        A = twell.dask.from_dask_array(dask_matrix(w, w["blocks_per_gpu"], on_gpu),
                                       tile_width=w["tile_width"], dtype=dtype).persist()
        b = make_rhs(w["k"], w["n"], on_gpu, dtype)

        def step():
            (y,) = dask.persist(A @ b)
            sync(on_gpu)
            return y

        median, times, y = timed(step, w["reps"])
        return _record("dask-local", 1, A, median, times, rel_err(host_result(y), reference))


def csr_block(chunk):
    """A dense chunk as the contender's block: scipy's CSR on the host, cupyx's on a GPU."""
    if isinstance(chunk, np.ndarray):
        import scipy.sparse as sp

        return sp.csr_matrix(chunk)
    import cupyx.scipy.sparse as cs

    return cs.csr_matrix(chunk)


def _block_product(a, b):
    return a @ b


def csr_matrix(w, n_blocks, on_gpu):
    """A as a Dask array of CSR blocks (:func:`csr_block`) of the same chunks as
    :func:`dask_matrix`."""
    import dask.array as da

    if on_gpu:
        import cupyx.scipy.sparse as cs

        meta = cs.csr_matrix((0, 0), dtype=np.float32)
    else:
        import scipy.sparse as sp

        meta = sp.csr_matrix((0, 0), dtype=np.float32)
    return da.map_blocks(csr_block, dask_matrix(w, n_blocks, on_gpu), dtype=np.float32,
                         meta=meta)


def csr_product(A, B, n, on_gpu):
    """``A @ B`` block by block for CSR blocks ``A`` and ``B`` of one block, under a new name
    at each call, as twell.dask's products are: map_blocks names its tasks by their inputs,
    and a repeated product whose result is still held by the cluster would return it without
    computing anything (the timed reps run while the warm-up's result is alive)."""
    import dask.array as da

    return da.map_blocks(_block_product, A, B, chunks=(A.chunks[0], (n,)), dtype=B.dtype,
                         meta=_xp(on_gpu).empty((0, 0), dtype=B.dtype),
                         name=f"csr-product-{uuid.uuid4().hex}")


def run_cluster(w, dtype, workers, reference, *, weak=False, fault=False):
    """LocalCUDACluster, one worker per GPU: the records of twell's product (``cluster-W``),
    the CSR contender's (``cluster-W csr``, float32 and float64), weak scaling's (``weak-W``)
    and a worker killed mid-product (``fault-W``), as asked. ``reference`` is the single
    product (None: the first record's product becomes it). Returns ``(records, reference)``.
    """
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    _pickle_by_value()
    devices = ",".join(str(i) for i in range(workers))
    with LocalCUDACluster(n_workers=workers, CUDA_VISIBLE_DEVICES=devices) as cluster, \
            Client(cluster) as client:
        return _cluster_records(client, w, dtype, workers, reference, weak, fault, True,
                                f"cluster-{workers}")


def _cluster_records(client, w, dtype, workers, reference, weak, fault, on_gpu, name):
    """The records of :func:`run_cluster` on ``client`` (GPU workers, or CPU processes for
    the dry run)."""
    import dask.array as da
    from distributed import futures_of, wait

    import twell.dask

    records = []
    B = da.map_blocks(lambda block_id=None: make_rhs(w["k"], w["n"], on_gpu, dtype),
                      chunks=((w["k"],), (w["n"],)),
                      meta=cast(_xp(on_gpu), _xp(on_gpu).empty((0, 0), dtype=np.float32),
                                dtype)).persist()
    wait(B)
    client.replicate(futures_of(B))  # every worker holds B before the clock starts

    def product_step(make):
        def step():
            y = make().persist()
            wait(y)
            client.run(sync, on_gpu)  # tasks return at launch: wait for every GPU
            return y
        return step

    def twell_matrix(rows_w):
        A = twell.dask.from_dask_array(
            dask_matrix(rows_w, workers * rows_w["blocks_per_gpu"], on_gpu=on_gpu),
            tile_width=w["tile_width"], dtype=dtype).persist()
        wait(futures_of(A.to_delayed()))
        return A

    _log(f"{name}: packing A ({workers * w['blocks_per_gpu']} blocks of {w['m']} rows in all)")
    A = twell_matrix(w)
    _log(f"{name}: A packed; timing A @ B")
    median, times, y = timed(product_step(lambda: A @ B), w["reps"])
    product = host_result(y)
    del y
    if reference is None:
        reference = product
    records.append(_record(name, workers, A, median, times, rel_err(product, reference)))
    _log(f"{name}: {median:.4f} s")
    del product
    if fault:
        _log(f"fault-{workers}: killing a worker mid-product")
        records.append(_fault_record(client, A, B, workers, reference))
        _log(f"fault-{workers}: {records[-1].get('outcome')}")
    del A  # the contender's blocks take its place on the GPUs
    if np.dtype(dtype) in (np.float32, np.float64):
        C = csr_matrix(w, workers * w["blocks_per_gpu"], on_gpu).persist()
        wait(futures_of(C))
        median, times, y = timed(product_step(lambda: csr_product(C, B, w["n"], on_gpu)),
                                 w["reps"])
        records.append({"config": f"{name} csr", "workers": workers, "blocks": C.numblocks[0],
                        "seconds": median, "times": times,
                        "rel_err_vs_single": rel_err(host_result(y), reference)})
        _log(f"{name} csr: {median:.4f} s")
        del C, y
    if weak:
        big = {**w, "m": w["m"] * workers}
        _log(f"weak-{workers}: packing A ({big['m']} rows)")
        A = twell_matrix(big)
        median, times, y = timed(product_step(lambda: A @ B), w["reps"])
        first = host_result(y[:w["m"]])
        records.append(_record(f"weak-{workers}", workers, A, median, times,
                               rel_err(first, reference)))
        records[-1]["weak"] = True
        _log(f"weak-{workers}: {median:.4f} s")
    return records, reference


def _log(message):
    """A progress line on stderr with the seconds since the suite began: a run cut short by
    a time limit still tells which step took the time."""
    print(f"[{time.perf_counter() - _started:8.1f} s] {message}", file=sys.stderr, flush=True)


_started = time.perf_counter()  # reset by run()


def _fault_record(client, A, B, workers, reference):
    """``A @ B`` with the process of a worker running one of its tasks killed (SIGKILL):
    completed (and checked) or failed (the error), never silently short."""
    import os
    import signal

    from distributed import futures_of, wait

    pids = client.run(os.getpid)
    y = (A @ B).persist()
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline:
        for worker, running in client.processing().items():
            if running:
                os.kill(pids[worker], signal.SIGKILL)
                killed = worker
                break
        else:
            if all(f.done() for f in futures_of(y)):
                break  # the product finished before any worker was seen running it
            time.sleep(0.005)
    record = {"config": f"fault-{workers}", "workers": workers, "blocks": A.numblocks,
              "seconds": float("nan"), "killed": killed}
    try:
        wait(y, timeout=600)
        err = rel_err(host_result(y), reference)
        record.update(outcome="completed", rel_err_vs_single=err)
    except Exception as exc:  # noqa: BLE001 - a failed product is this record's result
        record.update(outcome=f"failed: {type(exc).__name__}: {exc}")
    return record


def _pickle_by_value():
    """Ship this suite's functions to the workers by value: a worker need not find the
    benchmarks folder on its path."""
    try:
        import cloudpickle

        for name in ("dask_suite", "arrays"):
            cloudpickle.register_pickle_by_value(sys.modules[name])
    except (ImportError, AttributeError, KeyError, ValueError):
        pass  # an older cloudpickle: the workers import the modules (spawned with our path)


def run_threads(w, dtype, workers, reference):
    """CPU dry run stand-in for the cluster: Dask's threaded scheduler, ``workers`` threads."""
    import dask

    import twell.dask

    with dask.config.set(scheduler="threads", num_workers=workers):
        A = twell.dask.from_dask_array(dask_matrix(w, workers * w["blocks_per_gpu"], False),
                                       tile_width=w["tile_width"], dtype=dtype).persist()
        B = make_rhs(w["k"], w["n"], False, dtype)

        def step():
            (y,) = dask.persist(A @ B)
            return y

        median, times, y = timed(step, w["reps"])
        return _record(f"threads-{workers} (dry run)", workers, A, median, times,
                       rel_err(host_result(y), reference))


# -- driver ------------------------------------------------------------------------------------

def gpu_count():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: no GPU
        return 0


def card_slug():
    """The short name of GPU 0 for result files: "NVIDIA H200" -> "h200"."""
    from devices import GPU

    return GPU(sync_each=False).slug


def worker_counts(n):
    counts, w = [], 1
    while w <= n:
        counts.append(w)
        w *= 2
    if counts[-1] != n:
        counts.append(n)
    return counts


def table(records):
    lines = [f"{'config':<28} {'workers':>7} {'blocks':>6} {'median s':>10} {'speed-up':>8} "
             f"{'efficiency':>10} {'rel err':>9}"]
    for r in records:
        speedup = r.get("speedup")
        eff = r.get("efficiency")
        lines.append(
            f"{r['config']:<28} {r['workers']:>7} {r.get('blocks', 1):>6} {r['seconds']:>10.4f} "
            f"{'' if speedup is None else f'{speedup:.2f}':>8} "
            f"{'' if eff is None else f'{eff:.1%}':>10} "
            + (f"{r['rel_err_vs_single']:>9.1e}" if "rel_err_vs_single" in r else " " * 9)
            + (f"  {r['outcome']}" if "outcome" in r else ""))
    return "\n".join(lines)


#: Bytes of device memory per element of a dense chunk while :func:`make_rows` makes it (its
#: uint64 hash temporaries and the float32 result), and the share of the device one chunk's
#: temporaries may take.
GENERATE_BYTES = 48
GENERATE_SHARE = 0.15


def row_bytes(k, n, density, tile_width, itemsize):
    """Estimated device bytes a row of A (as TwELL with ``slots="auto"``, from the binomial
    histogram of its per-tile counts), of B's share and of C take."""
    from scipy.stats import binom

    tiles = -(-k // tile_width)
    hist = np.round(binom.pmf(np.arange(tile_width + 1), tile_width, density) * 1e9)
    slots = twell.auto_slots(hist.astype(np.int64), tile_width)
    return tiles * (4 + slots * (itemsize + 2)) + 8 + n * itemsize


def workload(args, device_bytes=None):
    """The Dask suite's workload from the command line (tiny sizes for the dry run), M from
    ``--memory-fraction`` of ``device_bytes`` when given, the blocks per GPU raised so that a
    block's dense temporaries take at most GENERATE_SHARE of the device."""
    m, k, n = args.shape or DEFAULT_SHAPE
    w = {"m": m, "k": k, "n": n, "density": args.density, "dtype": args.dask_dtype,
         "tile_width": args.tile_width, "blocks_per_gpu": args.blocks_per_gpu,
         "reps": args.reps}
    if args.cpu_dry_run:
        w.update(m=min(m, 600), k=min(k, 700), n=min(n, 16), density=max(args.density, 0.05),
                 reps=min(args.reps, 2))
        return w
    if device_bytes:
        itemsize = np.dtype(DTYPES[args.dask_dtype]).itemsize
        if args.memory_fraction:
            per_row = row_bytes(k, n, args.density, args.tile_width, itemsize)
            w["m"] = int(args.memory_fraction * device_bytes // per_row)
            w["memory_fraction"] = args.memory_fraction
        block_rows = max(1, int(GENERATE_SHARE * device_bytes // (GENERATE_BYTES * k)))
        w["blocks_per_gpu"] = max(w["blocks_per_gpu"], -(-w["m"] // block_rows))
    return w


def dense_fits(w, device_bytes):
    """Whether the single baselines' dense A (and its temporaries) fits the device."""
    return device_bytes is None or w["m"] * w["k"] * GENERATE_BYTES <= 0.5 * device_bytes


def _device_bytes():
    import cupy

    return int(cupy.cuda.runtime.memGetInfo()[1])


def _efficiencies(records):
    """Speed-up and efficiency of each scaling record against its series' one-worker record:
    strong scaling ``t(1) / (W t(W))``, weak ``t(1) / t(W)``; the CSR contender's against
    its own one-worker run."""
    first = {}
    for r in records:
        series = r["config"].split("-")[0] + (" csr" if " csr" in r["config"] else "")
        if "seconds" not in r or not np.isfinite(r["seconds"]) or series == "fault":
            continue
        t1 = first.setdefault(series, r["seconds"])
        r["speedup"] = t1 / r["seconds"]
        r["efficiency"] = t1 / r["seconds"] if r.get("weak") else t1 / (
            r["workers"] * r["seconds"])


def run_processes(w, dtype, reference, weak, fault):
    """CPU dry run of the cluster records (:func:`_cluster_records`): a ``distributed``
    LocalCluster of 2 single-threaded worker processes with NumPy blocks."""
    import dask
    import distributed

    _pickle_by_value()
    with dask.config.set({"distributed.scheduler.worker-ttl": None}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=":0", silence_logs=40) as cluster, \
            distributed.Client(cluster) as client:
        records, _ = _cluster_records(client, w, dtype, 2, reference, weak, fault, False,
                                      "processes-2")
    for r in records:
        r["config"] += " (dry run)"
    return records


def run(args, card=None):
    """Run the Dask suite; write its JSON and table to ``args.out``; return the document."""
    global _started
    _started = time.perf_counter()
    on_gpu = not args.cpu_dry_run
    device_bytes = _device_bytes() if on_gpu else None
    w = workload(args, device_bytes)
    dtype = DTYPES[w["dtype"]]
    n_gpus = gpu_count()
    if args.max_gpus is not None:
        n_gpus = min(n_gpus, args.max_gpus)
    notes = []

    records, reference = [], None
    if dense_fits(w, device_bytes):
        single, reference = run_single(w, dtype, on_gpu)
        records += [single, run_dask_local(w, dtype, on_gpu, reference)]
        reference = _host(reference)
        if on_gpu:  # the cluster's workers need the device memory this process pooled
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
    else:
        notes.append(f"A's dense form ({w['m']} x {w['k']}) does not fit one GPU: no single "
                     "or dask-local baseline; the one-worker cluster's product is the "
                     "reference")

    scaling = []
    if args.cpu_dry_run:
        scaling = [run_threads(w, dtype, n, reference) for n in (1, 2)]
        try:
            scaling += run_processes(w, dtype, reference, args.weak, args.fault)
        except ImportError:
            notes.append("distributed is not installed: no process cluster in the dry run")
        notes.append("CPU dry run: NumPy blocks, tiny sizes, threads and processes for "
                     "workers; numbers measure nothing")
    else:
        try:
            import dask_cuda  # noqa: F401
            import distributed  # noqa: F401

            have_dask_cuda = True
        except ImportError:
            have_dask_cuda = False
        if not have_dask_cuda:
            notes.append("dask-cuda is not installed: multi-GPU runs left out")
        elif n_gpus < 2:
            notes.append(f"{n_gpus} GPU visible: multi-GPU runs left out (LocalCUDACluster "
                         "with 1 worker only)")
        if have_dask_cuda:
            counts = worker_counts(n_gpus)
            for n in counts:
                got, reference = run_cluster(w, dtype, n, reference, weak=args.weak,
                                             fault=args.fault and n == counts[-1])
                scaling += got
    _efficiencies(scaling)
    records += scaling

    text = table(records)
    result = {
        "schema": SCHEMA,
        "benchmark": "twell.dask A @ B",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": args.commit or git("rev-parse", "--short", "HEAD"),
        "twell": twell.__version__,
        "python": platform.python_version(),
        "card": card,
        "gpus_visible": n_gpus,
        "cpu_dry_run": args.cpu_dry_run,
        "workload": {**w, "dtype": str(dtype)},
        "records": records,
        "notes": notes,
    }
    print(text)
    for note in notes:
        print("note:", note)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    print("wrote", out)
    return result
