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


def rel_err(got, want):
    got, want = (np.asarray(_host(a), dtype=np.float64) for a in (got, want))
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


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
        return _record("dask-local", 1, A, median, times, rel_err(y.compute(), reference))


def run_cluster(w, dtype, workers, reference):
    """LocalCUDACluster, one worker per GPU."""
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client, futures_of, wait

    import twell.dask

    _pickle_by_value()
    devices = ",".join(str(i) for i in range(workers))
    with LocalCUDACluster(n_workers=workers, CUDA_VISIBLE_DEVICES=devices) as cluster, \
            Client(cluster) as client:
        A = twell.dask.from_dask_array(
            dask_matrix(w, workers * w["blocks_per_gpu"], on_gpu=True),
            tile_width=w["tile_width"], dtype=dtype).persist()
        wait(futures_of(A.to_delayed()))
        B = da.map_blocks(lambda block_id=None: make_rhs(w["k"], w["n"], True, dtype),
                          chunks=((w["k"],), (w["n"],)),
                          meta=cast(_xp(True), _xp(True).empty((0, 0), dtype=np.float32),
                                    dtype)).persist()
        wait(B)
        client.replicate(futures_of(B))  # every worker holds B before the clock starts

        def step():
            y = (A @ B).persist()
            wait(y)
            client.run(lambda: sync(True))  # tasks return at launch: wait for every GPU
            return y

        median, times, y = timed(step, w["reps"])
        return _record(f"cluster-{workers}", workers, A, median, times,
                       rel_err(y.compute(), reference))


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
                       rel_err(y.compute(), reference))


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
    lines = [f"{'config':<22} {'workers':>7} {'blocks':>6} {'median s':>10} {'speed-up':>8} "
             f"{'efficiency':>10} {'rel err':>9}"]
    for r in records:
        speedup = r.get("speedup")
        eff = r.get("efficiency")
        lines.append(
            f"{r['config']:<22} {r['workers']:>7} {r.get('blocks', 1):>6} {r['seconds']:>10.4f} "
            f"{'' if speedup is None else f'{speedup:.2f}':>8} "
            f"{'' if eff is None else f'{eff:.1%}':>10} "
            f"{r.get('rel_err_vs_single', 0.0):>9.1e}")
    return "\n".join(lines)


def workload(args):
    """The Dask suite's workload from the command line (tiny sizes for the dry run)."""
    m, k, n = args.shape or DEFAULT_SHAPE
    w = {"m": m, "k": k, "n": n, "density": args.density, "dtype": args.dask_dtype,
         "tile_width": args.tile_width, "blocks_per_gpu": args.blocks_per_gpu,
         "reps": args.reps}
    if args.cpu_dry_run:
        w.update(m=min(m, 600), k=min(k, 700), n=min(n, 16), density=max(args.density, 0.05),
                 reps=min(args.reps, 2))
    return w


def run(args, card=None):
    """Run the Dask suite; write its JSON and table to ``args.out``; return the document."""
    w = workload(args)
    dtype = DTYPES[w["dtype"]]
    on_gpu = not args.cpu_dry_run
    n_gpus = gpu_count()
    if args.max_gpus is not None:
        n_gpus = min(n_gpus, args.max_gpus)
    notes = []

    single, reference = run_single(w, dtype, on_gpu)
    records = [single, run_dask_local(w, dtype, on_gpu, reference)]

    scaling = []
    if args.cpu_dry_run:
        scaling = [run_threads(w, dtype, n, reference) for n in (1, 2)]
        notes.append("CPU dry run: NumPy blocks, tiny sizes, threads for workers; numbers "
                     "measure nothing")
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
            scaling = [run_cluster(w, dtype, n, reference) for n in worker_counts(n_gpus)]
    if scaling:
        t1 = scaling[0]["seconds"]
        for r in scaling:
            r["speedup"] = t1 / r["seconds"]
            r["efficiency"] = t1 / (r["workers"] * r["seconds"])
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
