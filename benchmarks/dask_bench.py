#!/usr/bin/env python3
"""twell.dask benchmark: ``A @ B`` with a row-partitioned TwELL matrix, on one GPU and on several.

Workload: A is an activation-like M x K matrix with non-zeros spread uniformly at the requested
density (entry (r, c) a hash of (r, c), so the same matrix however it is chunked), generated
block by block where the block lives; B is a dense K x N matrix.
Strong scaling: the same problem on every configuration.

Runs, in order:

single
    One :class:`twell.TwELLMatrix` of the whole matrix on GPU 0, ``a @ b``: the baseline
    without Dask.
dask-local
    :mod:`twell.dask` with CuPy blocks on GPU 0 and Dask's synchronous scheduler: the cost of
    the partitioning and of Dask itself.
cluster-W
    When ``dask_cuda`` imports and several GPUs are visible: a ``LocalCUDACluster`` with one
    worker per GPU, for W = 1, 2, 4, ... up to the visible GPUs. Scaling efficiency is
    ``t(1) / (W * t(W))`` against the one-worker cluster. A and B are built and kept on the
    workers (B copied to every worker first); the timed part is the product, kept on the
    workers, until every GPU has finished (``cudaDeviceSynchronize`` on each worker).

Times are wall clock (``perf_counter``) around each run after a warm-up, median of ``--reps``;
the product of each configuration is checked once against the single-matrix result.
Writes JSON to ``--out`` (default ``$OUT/dask_bench.json`` when ``OUT`` is set, else
``benchmarks/results/dask-<date>.json``) and prints a table.

Usage (GPU machine, repository root)::

    PYTHONPATH=. python benchmarks/dask_bench.py [--m 65536 --k 5632 --n 2048] [--density 0.01]
    PYTHONPATH=. python benchmarks/dask_bench.py --cpu-dry-run   # control flow, NumPy, tiny

``--cpu-dry-run`` runs the same steps on the CPU with NumPy blocks at tiny sizes, with Dask's
threaded scheduler standing in for the cluster (W = 1 and 2 threads); its numbers measure
nothing. It needs only ``twell[dask]``.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(REPO))

import twell  # noqa: E402
import twell.dask  # noqa: E402

DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
          "bfloat16": twell.bfloat16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=65536, help="rows of A (default 65536)")
    p.add_argument("--k", type=int, default=5632, help="columns of A (default 5632)")
    p.add_argument("--n", type=int, default=2048, help="columns of B (default 2048)")
    p.add_argument("--density", type=float, default=0.01, help="non-zero share of A (0.01)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--tile-width", type=int, default=256)
    p.add_argument("--blocks-per-gpu", type=int, default=2,
                   help="row blocks per GPU (per worker in the cluster runs; default 2)")
    p.add_argument("--reps", type=int, default=5, help="timed runs per configuration (5)")
    p.add_argument("--max-gpus", type=int, default=None, help="use at most this many GPUs")
    p.add_argument("--out", default=None, help="JSON output path")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="NumPy blocks, tiny sizes, threads instead of GPUs: tests the script")
    args = p.parse_args(argv)
    if args.cpu_dry_run:
        args.m, args.k, args.n = min(args.m, 600), min(args.k, 700), min(args.n, 16)
        args.density, args.reps = max(args.density, 0.05), min(args.reps, 2)
    return args


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


def make_rhs(k, n, on_gpu, seed=99):
    xp = _xp(on_gpu)
    b = xp.random.RandomState(seed).standard_normal((k, n)).astype(np.float32)
    return b / np.float32(np.sqrt(k))


def _xp(on_gpu):
    if on_gpu:
        import cupy

        return cupy
    return np


def cast(x, dtype):
    """Cast with twell's backend (CuPy has no bfloat16 of its own)."""
    from twell import _backend

    return _backend.backend(_backend.array_module(x)).cast(x, dtype)


def dask_matrix(args, n_blocks, on_gpu):
    """A as a Dask array of float32 chunks, ``n_blocks`` row chunks, generated lazily."""
    import dask.array as da

    base, extra = divmod(args.m, n_blocks)
    rows = tuple(base + (i < extra) for i in range(n_blocks))
    meta = _xp(on_gpu).empty((0, 0), dtype=np.float32)
    starts = tuple(int(v) for v in np.cumsum((0,) + rows[:-1]))
    return da.map_blocks(make_rows, chunks=(rows, (args.k,)), dtype=np.float32, meta=meta,
                         row_starts=starts, chunk_rows=rows, k=args.k, density=args.density,
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


# -- configurations ----------------------------------------------------------------------------

def run_single(args, dtype, on_gpu):
    """Baseline: one TwELLMatrix, no Dask."""
    x = make_rows((0, 0), row_starts=(0,), chunk_rows=(args.m,), k=args.k,
                  density=args.density, on_gpu=on_gpu)
    a = twell.TwELLMatrix(x, tile_width=args.tile_width, dtype=dtype)
    del x
    b = cast(make_rhs(args.k, args.n, on_gpu), dtype)

    def step():
        y = a @ b
        sync(on_gpu)
        return y

    median, times, y = timed(step, args.reps)
    record = {"config": "single", "workers": 1, "seconds": median, "times": times,
              "nnz": a.nnz, "slots": a.slots, "overflow_nnz": a.overflow_nnz}
    return record, a, b, y


def run_dask_local(args, dtype, on_gpu, reference):
    """twell.dask on one device, Dask's synchronous scheduler."""
    import dask

    with dask.config.set(scheduler="synchronous"):
        A = twell.dask.from_dask_array(dask_matrix(args, args.blocks_per_gpu, on_gpu),
                                       tile_width=args.tile_width, dtype=dtype).persist()
        b = cast(make_rhs(args.k, args.n, on_gpu), dtype)

        def step():
            (y,) = dask.persist(A @ b)
            sync(on_gpu)
            return y

        median, times, y = timed(step, args.reps)
        stats = A.stats()
        err = rel_err(y.compute(), reference)
    return {"config": "dask-local", "workers": 1, "blocks": A.numblocks, "seconds": median,
            "times": times, "nnz": stats["nnz"], "slots": stats["slots"],
            "overflow_nnz": stats["overflow_nnz"], "rel_err_vs_single": err}


def run_cluster(args, dtype, workers, reference):
    """LocalCUDACluster, one worker per GPU."""
    from dask_cuda import LocalCUDACluster
    from distributed import Client, futures_of, wait

    devices = ",".join(str(i) for i in range(workers))
    with LocalCUDACluster(n_workers=workers, CUDA_VISIBLE_DEVICES=devices) as cluster, \
            Client(cluster) as client:
        A = twell.dask.from_dask_array(
            dask_matrix(args, workers * args.blocks_per_gpu, on_gpu=True),
            tile_width=args.tile_width, dtype=dtype).persist()
        wait(futures_of(A.to_delayed()))
        import dask.array as da

        B = da.map_blocks(lambda block_id=None: cast(make_rhs(args.k, args.n, True), dtype),
                          chunks=((args.k,), (args.n,)),
                          meta=cast(_xp(True).empty((0, 0), dtype=np.float32), dtype)).persist()
        wait(B)
        client.replicate(futures_of(B))  # every worker holds B before the clock starts

        def step():
            y = (A @ B).persist()
            wait(y)
            client.run(lambda: sync(True))  # tasks return at launch: wait for every GPU
            return y

        median, times, y = timed(step, args.reps)
        err = rel_err(y.compute(), reference)
        stats = A.stats()
    return {"config": f"cluster-{workers}", "workers": workers, "blocks": A.numblocks,
            "seconds": median, "times": times, "nnz": stats["nnz"], "slots": stats["slots"],
            "overflow_nnz": stats["overflow_nnz"], "rel_err_vs_single": err}


def run_threads(args, dtype, workers, reference):
    """CPU dry run stand-in for the cluster: Dask's threaded scheduler, ``workers`` threads."""
    import dask

    with dask.config.set(scheduler="threads", num_workers=workers):
        A = twell.dask.from_dask_array(dask_matrix(args, workers * args.blocks_per_gpu, False),
                                       tile_width=args.tile_width, dtype=dtype).persist()
        B = cast(make_rhs(args.k, args.n, False), dtype)

        def step():
            (y,) = dask.persist(A @ B)
            return y

        median, times, y = timed(step, args.reps)
        err = rel_err(y.compute(), reference)
        stats = A.stats()
    return {"config": f"threads-{workers} (dry run)", "workers": workers, "blocks": A.numblocks,
            "seconds": median, "times": times, "nnz": stats["nnz"], "slots": stats["slots"],
            "overflow_nnz": stats["overflow_nnz"], "rel_err_vs_single": err}


# -- driver ------------------------------------------------------------------------------------

def gpu_count():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: no GPU
        return 0


def worker_counts(n):
    counts, w = [], 1
    while w <= n:
        counts.append(w)
        w *= 2
    if counts[-1] != n:
        counts.append(n)
    return counts


def commit_of(args):
    if args.commit:
        return args.commit
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


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


def main(argv=None):
    args = parse_args(argv)
    dtype = DTYPES[args.dtype]
    on_gpu = not args.cpu_dry_run
    n_gpus = gpu_count()
    if on_gpu and n_gpus == 0:
        sys.exit("dask_bench.py: no GPU visible (CuPy with a CUDA device is needed); "
                 "use --cpu-dry-run to test the script on the CPU")
    if args.max_gpus is not None:
        n_gpus = min(n_gpus, args.max_gpus)
    notes = []

    single, _, _, reference = run_single(args, dtype, on_gpu)
    records = [single, run_dask_local(args, dtype, on_gpu, reference)]

    scaling = []
    if args.cpu_dry_run:
        scaling = [run_threads(args, dtype, w, reference) for w in (1, 2)]
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
            scaling = [run_cluster(args, dtype, w, reference) for w in worker_counts(n_gpus)]
    if scaling:
        t1 = scaling[0]["seconds"]
        for r in scaling:
            r["speedup"] = t1 / r["seconds"]
            r["efficiency"] = t1 / (r["workers"] * r["seconds"])
    records += scaling

    text = table(records)
    result = {
        "benchmark": "twell.dask A @ B",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit_of(args),
        "twell": twell.__version__,
        "python": platform.python_version(),
        "gpus_visible": n_gpus,
        "cpu_dry_run": args.cpu_dry_run,
        "workload": {"m": args.m, "k": args.k, "n": args.n, "density": args.density,
                     "dtype": args.dtype, "tile_width": args.tile_width,
                     "blocks_per_gpu": args.blocks_per_gpu, "reps": args.reps},
        "records": records,
        "notes": notes,
    }
    print(text)
    for note in notes:
        print("note:", note)
    out = args.out
    if out is None and not args.cpu_dry_run:
        stamp = datetime.date.today().isoformat()
        out = (os.path.join(os.environ["OUT"], "dask_bench.json") if os.environ.get("OUT")
               else str(REPO / "benchmarks" / "results" / f"dask-{stamp}.json"))
    if out:
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        pathlib.Path(out).with_suffix(".txt").write_text(text + "\n")
        print("wrote", out)
    return result


if __name__ == "__main__":
    main()
