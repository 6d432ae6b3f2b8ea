#!/usr/bin/env python3
"""twell benchmark suite: every contender, one process, the same inputs.

Suites:

GPU (default)
    twell's CuPy backend against dense cuBLAS (cupy.matmul, torch.matmul), cuSPARSE (through
    cupyx.scipy.sparse and torch.sparse) and, with ``--reference DIR``, the reference TwELL
    kernels, on the feed-forward activations of the paper's 2B model (``ffn``, ``sweep``,
    ``hot``) and on scientific matrices (``sci``). CUDA events, median of ``--reps``.
    ``--cpu-dry-run`` runs its control flow on the CPU at tiny sizes.
CPU (``--cpu``)
    twell's NumPy backend against scipy.sparse CSR on activations, a 2-D Poisson matrix and
    a power-law graph, float32 and float64: products, transpose, conversions and bytes.
    perf_counter, best of ``--reps`` (7).
Dask (``--dask``)
    ``A @ B`` through twell.dask on one GPU and, with dask-cuda, on several.

Each writes JSON (schema ``twell-bench/1``; the Dask suite ``twell-dask/1``) to ``--out``, and
the printed table beside it with the suffix ``.txt``. A full run's default is
``benchmarks/results/<suite>-<card>.json``. See benchmarks/README.md.

Usage (repository root)::

    python benchmarks/bench.py [--quick] [--reference DIR] [--out FILE]   # GPU
    python benchmarks/bench.py --cpu
    python benchmarks/bench.py --dask
    python benchmarks/bench.py --cpu-dry-run     # the GPU suite's control flow on the CPU
"""

import argparse
import datetime
import math
import os
import pathlib
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere in the checkout
    sys.path.insert(0, str(REPO))

import cpu_suite  # noqa: E402
import dask_suite  # noqa: E402
import gpu_suite  # noqa: E402
from arrays import DTYPES, short_error  # noqa: E402
from harness import Bench, Progress, collect_meta, load_average  # noqa: E402
from report import report  # noqa: E402
from targets import CPU_TARGETS  # noqa: E402
from workloads import (  # noqa: E402
    FFN_K,
    FFN_M,
    FFN_N,
    FFN_SPARSITIES,
    SCI_GRAPH_ALPHA,
    SCI_GRAPH_DEGREE,
    SCI_GRAPH_N,
    SCI_GRID,
    SCI_RHS,
    SCI_TILE_WIDTHS,
    SWEEP,
)

import twell  # noqa: E402

GPU_OPS = ("pack", "gemm+pack", "gated ffn", "csr->twell", "twell->csr", "twell->dense", "spmm",
           "spmv", "cg", "gmres")
#: The CPU suite's operations: those with targets, then scipy API operations it tracks.
CPU_OPS = tuple(CPU_TARGETS) + ("sum", "columns")
OPS = GPU_OPS + tuple(op for op in CPU_OPS if op not in GPU_OPS)
WORKLOADS = ("ffn", "sweep", "hot", "sci")

#: Options that narrow or reshape a run: with any of them (or --quick, or a dry run) the
#: default output goes to a temporary folder, not over the committed full result.
NARROWING = ("workloads", "ops", "dtypes", "sparsities", "sweep", "rhs", "sci_matrices",
             "sci_tile_widths", "shape", "scale", "graph_alpha", "cpu_matrices", "density",
             "dask_dtype", "tile_width", "blocks_per_gpu", "max_gpus")


def _floats(text):
    return tuple(float(v) for v in text.split(",") if v.strip())


def _ints(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


def _names(text, allowed, what):
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in names if v not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad}; choose from {list(allowed)}")
    return names


def build_parser(prog="bench.py"):
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Suites: GPU (default), --cpu, --dask; see benchmarks/README.md.")
    suite = p.add_argument_group("suite").add_mutually_exclusive_group()
    suite.add_argument("--cpu", action="store_true",
                       help="the CPU suite: twell's NumPy backend against scipy.sparse")
    suite.add_argument("--dask", action="store_true",
                       help="the Dask suite: A @ B through twell.dask on one GPU or several")

    p.add_argument("--ops", type=lambda s: _names(s, OPS, "op"),
                   help=f"operations to time (default: all of the suite's; GPU "
                        f"{','.join(GPU_OPS)}; CPU {','.join(CPU_OPS)})")
    p.add_argument("--dtypes", type=lambda s: _names(s, DTYPES, "dtype"),
                   help="override the dtypes of every workload (bf16,fp16,fp32,fp64; the CPU "
                        "suite and the sci matrices take fp32,fp64)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="scale the rows of every matrix (default 1)")
    p.add_argument("--graph-alpha", type=float, default=SCI_GRAPH_ALPHA,
                   help="Pareto tail index of the power-law graph's degrees (default "
                        "%(default)s; 1.5 gives heavier hubs, where slots=\"auto\" is capped)")
    p.add_argument("--shape", type=_ints,
                   help=f"the activations' M,K,N (default {FFN_M},{FFN_K},{FFN_N}; M then "
                        f"scales); Dask suite "
                        f"{','.join(map(str, dask_suite.DEFAULT_SHAPE))})")
    p.add_argument("--reps", type=int,
                   help="timed runs per contender (default: GPU 20, CPU 7, Dask 5)")
    p.add_argument("--min-reps", type=int,
                   help="runs of a slow contender, also past the time budget (default: GPU 5, "
                        "CPU 3)")
    p.add_argument("--warmup", type=int,
                   help="calls before the timed runs, the checked one included (default: GPU "
                        "3, CPU 1)")
    p.add_argument("--max-timing-s", type=float,
                   help="cap on one contender's timed loop; fewer reps for slow calls "
                        "(default: GPU 1.5, CPU 10)")
    p.add_argument("--time-budget", type=float,
                   help="seconds after the set-up; past it a contender's timed runs are capped "
                        "at 0.05 s (at least --min-reps), past 1.4x it cases are skipped "
                        "(default: GPU 300, --quick 75; CPU 360)")
    p.add_argument("--commit", help="git commit to record when the checkout has no .git")
    p.add_argument("--out", help="JSON path; the table goes to the same path with .txt "
                                 "(default: $OUT/<suite>-<card>.json when OUT is set, else "
                                 "benchmarks/results/<suite>-<card>.json for a full run and a "
                                 "temporary folder otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="the GPU or Dask suite's control flow on the CPU at tiny sizes (no GPU "
                        "needed); its numbers measure nothing")

    g = p.add_argument_group("GPU suite")
    g.add_argument("--workloads", default=",".join(WORKLOADS),
                   type=lambda s: _names(s, WORKLOADS, "workload"),
                   help="comma list of %(default)s")
    g.add_argument("--sparsities", type=_floats, help="ffn/hot sparsities (default 0.99,0.95,0.9)")
    g.add_argument("--sweep", type=_floats, help="sweep sparsities (default 0.90 ... 0.999)")
    g.add_argument("--rhs", type=_ints, help="sci right-hand-side counts (default 64,256,512)")
    g.add_argument("--sci-matrices", default="poisson,graph",
                   type=lambda s: _names(s, ("poisson", "graph"), "matrix"))
    g.add_argument("--sci-tile-widths", type=_ints,
                   help="tile widths tried on the sci matrices after the automatic one "
                        "(default 65536,4096,256)")
    g.add_argument("--quick", action="store_true",
                   help="a ~1-minute subset: bf16/fp32 at 99%%/90%%, few sweep points, one hot "
                        "case, sci fp32 N=64, M and n scaled by 1/4, fewer reps")
    g.add_argument("--buffers", type=int, default=3,
                   help="input sets rotated where one set is under 4x the L2 size")
    g.add_argument("--sync-each", action="store_true",
                   help="synchronise after every timed run instead of queueing runs back to "
                        "back")
    g.add_argument("--reference", default=os.environ.get("TWELL_REFERENCE_DIR"),
                   help="folder with the reference twell.py and .cu files "
                        "(default $TWELL_REFERENCE_DIR)")
    g.add_argument("--no-torch", action="store_true", help="skip the PyTorch contenders")

    c = p.add_argument_group("CPU suite (--cpu)")
    c.add_argument("--cpu-matrices", default=",".join(cpu_suite.MATRICES),
                   type=lambda s: _names(s, cpu_suite.MATRICES, "matrix"),
                   help="comma list of %(default)s")

    d = p.add_argument_group("Dask suite (--dask)")
    d.add_argument("--density", type=float, default=0.01, help="non-zero share of A (0.01)")
    d.add_argument("--dask-dtype", choices=sorted(DTYPES), default="fp32")
    d.add_argument("--tile-width", type=int, default=256)
    d.add_argument("--blocks-per-gpu", type=int, default=2,
                   help="row blocks per GPU (per worker in the cluster runs; default 2)")
    d.add_argument("--max-gpus", type=int, help="use at most this many GPUs")
    d.add_argument("--memory-fraction", type=float,
                   help="size M so that A, B and C take this share of one GPU's memory")
    d.add_argument("--weak", action="store_true",
                   help="also weak scaling: W workers, W times the rows")
    d.add_argument("--fault", action="store_true",
                   help="also kill a worker mid-product on the largest cluster")
    return p


def _defaults(args, **values):
    for key, value in values.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def finalize_args(parser, args):
    """Resolve the per-suite defaults; usage errors exit with status 2."""
    error = parser.error
    defaults = parser.parse_args([])
    args.narrowed = any(getattr(args, k) != getattr(defaults, k) for k in NARROWING)
    if args.cpu and args.cpu_dry_run:
        error("--cpu-dry-run applies to the GPU and Dask suites; --cpu runs on the CPU itself")
    if args.shape and len(args.shape) != 3:
        error("--shape takes M,K,N")
    if not args.graph_alpha > 1:
        error(f"--graph-alpha must be above 1 (a finite mean degree); got {args.graph_alpha}")
    if not args.scale > 0:
        error(f"--scale must be above 0; got {args.scale}")
    if args.dask:
        _defaults(args, reps=5)
        return args
    if args.cpu:
        return _finalize_cpu(args, error)
    return _finalize_gpu(args, error)


def _finalize_cpu(args, error):
    if args.dtypes and set(args.dtypes) - {"fp32", "fp64"}:
        error(f"the CPU suite compares with scipy.sparse: --dtypes takes fp32,fp64; got "
              f"{','.join(args.dtypes)}")
    args.cpu_dtypes = args.dtypes or cpu_suite.CPU_DTYPES
    args.ops = args.ops or CPU_OPS
    _defaults(args, reps=7, min_reps=3, warmup=1, max_timing_s=10.0, time_budget=360.0)
    args.min_reps = max(1, min(args.min_reps, args.reps))
    args.act_m = max(256, int(round(cpu_suite.ACT_M * args.scale)))
    args.cpu_grid = max(8, int(round(cpu_suite.POISSON_GRID * math.sqrt(args.scale))))
    args.cpu_graph_n = max(1000, int(round(cpu_suite.GRAPH_N * args.scale)))
    return args


def _finalize_gpu(args, error):
    q, dry = args.quick, args.cpu_dry_run
    wl_dtypes = {"ffn": ("bf16", "fp16", "fp32"), "hot": ("bf16", "fp32"),
                 "sci": ("fp32", "fp64"), "sweep": ("bf16",)}
    if q:
        wl_dtypes.update(ffn=("bf16", "fp32"), hot=("bf16",), sci=("fp32",))
    if args.dtypes:
        sci = tuple(d for d in args.dtypes if d in ("fp32", "fp64"))  # cupyx input: fp32/64
        wl_dtypes.update(ffn=args.dtypes, hot=args.dtypes, sci=sci)
    args.wl_dtypes = wl_dtypes
    args.ops = args.ops or GPU_OPS
    args.sparsities = args.sparsities or ((0.99, 0.90) if q else FFN_SPARSITIES)
    args.sweep = args.sweep or ((0.95, 0.999) if q else SWEEP)
    args.rhs = args.rhs or ((64,) if q else SCI_RHS)
    args.sci_tile_widths = args.sci_tile_widths or ((65536,) if q else SCI_TILE_WIDTHS)
    if q and args.scale == 1.0:
        args.scale = 0.25
    _defaults(args, reps=10 if q else 20, min_reps=5, warmup=3, max_timing_s=1.5,
              time_budget=75.0 if q else 300.0)
    if dry:
        args.m, args.k, args.n = args.shape or (256, 768, 64)
        args.grid, args.graph_n, args.graph_degree = 40, 2000, 8.0
        args.rhs = (4, 8)
        args.reps, args.min_reps, args.warmup = 3, 2, 3
        args.time_budget = min(args.time_budget, 240.0)
    else:
        m, args.k, args.n = args.shape or (FFN_M, FFN_K, FFN_N)
        args.m = max(256, int(round(m * args.scale / 256)) * 256) if m >= 256 else m
        args.grid = max(8, int(round(SCI_GRID * math.sqrt(args.scale))))
        args.graph_n = max(1000, int(round(SCI_GRAPH_N * args.scale)))
        args.graph_degree = SCI_GRAPH_DEGREE
    args.min_reps = max(1, min(args.min_reps, args.reps))
    return args


def default_out(args, suite, slug):
    """``$OUT/<suite>-<card>.json``; else the committed result's path for a full run, and a
    temporary file for a quick, narrowed or dry run."""
    name = f"{suite}-{slug}.json"
    if os.environ.get("OUT"):
        return os.path.join(os.environ["OUT"], name)
    if args.quick or args.cpu_dry_run or args.narrowed:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return os.path.join(tempfile.gettempdir(), f"twell-bench-{suite}-{slug}-{stamp}.json")
    return str(REPO / "benchmarks" / "results" / name)


def main(argv=None, prog="bench.py"):
    """Run a suite; returns 0 (missed targets included), 1 if the run aborted, 130 if
    interrupted. Exits with 2 on a usage error or when no GPU is visible to a GPU suite."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = finalize_args(parser, parser.parse_args(argv))
    no_gpu = (f"{prog}: error: no CUDA GPU visible to CuPy; use --cpu for the CPU suite, or "
              "--cpu-dry-run to exercise the control flow on the CPU\n")
    if args.dask:
        if args.cpu_dry_run:
            slug = "dry-run"
        elif dask_suite.gpu_count() == 0:
            parser.exit(2, no_gpu)
        else:
            slug = dask_suite.card_slug()
        args.out = args.out or default_out(args, "dask", slug)
        dask_suite.run(args, card=None if args.cpu_dry_run else slug)
        return 0

    from devices import GPU, DryRun, Host

    torch = torch_why = ref = ref_error = None
    if args.cpu:
        suite, module, dev = "cpu", cpu_suite, Host()
    else:
        suite, module = "gpu", gpu_suite
        if args.cpu_dry_run:
            dev = DryRun()
        elif not twell.cuda_available():
            parser.exit(2, no_gpu)
        else:
            dev = GPU(args.sync_each)
        torch, torch_why, ref, ref_error = _gpu_contenders(args)
        dev.torch = torch
    args.out = args.out or default_out(args, suite, dev.slug)
    bench = Bench(args, dev, suite, torch, ref)
    bench.torch_why, bench.ref_error = torch_why, ref_error
    bench.meta = collect_meta(bench, argv)
    if ref_error:
        bench.notes.append(f"reference kernels unavailable: {ref_error}")

    plan = module.plan_cases(args)
    bench.progress = Progress(len(plan), not args.no_progress)
    status = 0
    try:
        module.prepare(bench)
        bench.save()
        module.run(bench, plan)
    except KeyboardInterrupt:
        status = 130
        bench.notes.append("interrupted: partial results")
    except Exception as exc:  # noqa: BLE001 - a bug here must still leave the table and JSON
        status = 1
        bench.notes.append(f"run aborted: {short_error(exc)}")
        traceback.print_exc()
    finally:
        bench.progress.close()
        bench.meta["elapsed_s"] = round(bench.elapsed(), 1)
        bench.meta["load_average_end"] = load_average()
        bench.save()
    report(bench)
    return status


def _gpu_contenders(args):
    """PyTorch and the reference kernels, where available: (torch, why not, ref, why not)."""
    from contenders import Reference, load_torch

    torch, torch_why = load_torch(args)
    ref = ref_error = None
    if args.reference:
        if torch is None:
            ref_error = f"--reference needs PyTorch ({torch_why})"
        else:
            try:
                print(f"building the reference extension from {args.reference} ...",
                      file=sys.stderr, flush=True)
                t = time.perf_counter()
                ref = Reference(args.reference, torch)
                print(f"built in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            except Exception as exc:  # noqa: BLE001
                ref_error = short_error(exc, 600)
    return torch, torch_why, ref, ref_error


if __name__ == "__main__":
    sys.exit(main())
