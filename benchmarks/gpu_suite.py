"""The GPU suite: its plan of cases, the kernels compiled before any timing, the ceilings
measured in the same run (copy bandwidth, GEMM rates) and the loop over the cases.

With ``--cpu-dry-run`` the same control flow runs on NumPy and scipy at tiny sizes.
"""

import time
import traceback

import numpy as np
from arrays import DTYPES, RNG, cast, matmul_same, short_error
from contenders import to_torch
from gpu_activations import run_activation_case
from gpu_sci import run_sci_case
from harness import Case
from workloads import (
    LAYER_SWEEP,
    ffn_inputs32,
    hot_inputs32,
    n_buffers,
    poisson2d,
    powerlaw_graph,
)

import twell


def _gemm_rate(bench, name, size, g):
    """TFLOP/s of a size^3 GEMM in dtype ``name`` (cupy.matmul; torch too for bf16)."""
    xp, torch = bench.xp, bench.torch
    dt = DTYPES[name]
    x = cast(xp, g.normal((size, size)), dt)
    y = cast(xp, g.normal((size, size)), dt)
    rates = {}
    try:
        rates["cupy.matmul"] = 2 * size ** 3 / bench.time_only(
            lambda _: matmul_same(xp, x, y)) / 1e9
    except Exception as exc:  # noqa: BLE001
        bench.notes.append(f"{name} GEMM ceiling (cupy) failed: {short_error(exc)}")
    if torch is not None and name == "bf16":
        try:
            tx, ty = to_torch(torch, x), to_torch(torch, y)
            rates["torch.matmul"] = 2 * size ** 3 / bench.time_only(lambda _: tx @ ty) / 1e9
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{name} GEMM ceiling (torch) failed: {short_error(exc)}")
    if rates:
        bench.ceilings[f"{name}_gemm_TFLOPs"] = max(rates.values())
        bench.ceilings[f"{name}_gemm"] = {"size": size, "TFLOPs": rates}


def warm_twell(bench):
    """Compile twell's kernels before anything is timed (each .cu file compiles as a whole).

    Returns the seconds it took; recorded as ``meta.compile_s``.
    """
    xp = bench.xp
    t = time.perf_counter()
    g = RNG(xp, 1)
    for name in ("bf16", "fp32"):
        try:
            x = g.normal((64, 600))
            x = cast(xp, xp.where(x > 1.0, x, np.float32(0)), DTYPES[name])
            a = twell.TwELLMatrix(x, slots=4)  # some overflow: every packing pass runs
            a.toarray()
            a @ cast(xp, g.normal((600, 64)), DTYPES[name])
            a @ cast(xp, g.normal((600,)), DTYPES[name])
            if name == "fp32":  # scipy and cupyx hold no 16-bit values
                a.tocsr()
                twell.TwELLMatrix(bench.sp.csr_matrix(x), slots=4)
            bench.dev.sync()
        except Exception as exc:  # noqa: BLE001 - the measurements will report it per row
            bench.notes.append(f"warm-up of twell ({name}) failed: {short_error(exc)}")
    return time.perf_counter() - t


def measure_ceilings(bench):
    """Copy bandwidth (bytes read + written) and GEMM rates, measured in this run."""
    xp, dev = bench.xp, bench.dev
    c = bench.ceilings
    n = (1 << 30) if dev.gpu else (1 << 25)
    try:
        a = xp.arange(n // 4, dtype=np.uint32)  # not zeros
        b = xp.empty_like(a)
        ms = bench.time_only(dev.copy_fn(a, b), reps=20)
        c.update(copy_GBps=2 * n / ms / 1e6, copy_bytes=n, copy_ms=ms)
        del a, b
    except Exception as exc:  # noqa: BLE001
        bench.notes.append(f"copy ceiling failed: {short_error(exc)}")
    sizes = {"bf16": 8192, "fp32": 4096, "fp64": 4096} if dev.gpu else \
        {"bf16": 128, "fp32": 256, "fp64": 256}
    g = RNG(xp, 123)
    for name, size in sizes.items():
        _gemm_rate(bench, name, size, g)
    dev.release()


def plan_cases(args):
    """(workload, key, dtype) of every case, in run order, for the progress bar."""
    plan = []
    dts = args.wl_dtypes
    if "ffn" in args.workloads:
        plan += [("ffn", s, d) for s in args.sparsities for d in dts["ffn"]]
    if "sweep" in args.workloads:
        done = set(args.sparsities) if "ffn" in args.workloads and "bf16" in dts["ffn"] else set()
        plan += [("sweep", s, "bf16") for s in args.sweep if s not in done]
    if "hot" in args.workloads:
        plan += [("hot", s, d) for s in args.sparsities for d in dts["hot"]]
    if "sci" in args.workloads:
        plan += [("sci", mat, d) for mat in args.sci_matrices for d in dts["sci"]]
    return plan


def run(bench, plan):
    args = bench.args
    m, k, n = args.m, args.k, args.n

    def skip_all(items, why):
        for wl, key, dname in items:
            c = Case(f"{wl}-{key}-{dname}", wl, dname, str(key))
            c.info["skipped"] = why
            bench.cases.append(c)
            bench.progress.done()

    def nbuf_rule(nbytes):
        return n_buffers(bench, nbytes)

    # Group the plan by (workload, key): inputs are generated once and cast per dtype.
    groups = {}
    for item in plan:
        groups.setdefault(item[:2], []).append(item)
    for (wl, key), items in groups.items():
        if bench.stopped():
            skip_all(items, "CUDA context broken" if bench.broken else "over the time budget")
            continue
        seed = args.seed + int(1000 * float(key)) if wl != "sci" else args.seed
        try:
            if wl in ("ffn", "sweep"):
                nb = nbuf_rule(m * k * (1 - key) * 8 + k * n * 4)
                inp = ffn_inputs32(bench.xp, m, k, n, key, nb, seed,
                                   with_x=(wl == "ffn" or float(key) in LAYER_SWEEP))
                extra = {}
            elif wl == "hot":
                nb = nbuf_rule(m * k * (1 - key) * 8 + k * n * 4)
                inp, extra = hot_inputs32(bench.xp, m, k, n, key, nb, seed)
            else:
                inp, extra = None, {}
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{wl} {key}: input generation failed: {short_error(exc)}")
            skip_all(items, f"input generation failed: {short_error(exc)}")
            bench.dev.release()
            continue
        for item in items:
            if bench.stopped():
                skip_all([item], "CUDA context broken" if bench.broken else "over the time budget")
                continue
            dname = item[2]
            label = f"s={key:g}" if wl != "sci" else str(key)
            case = Case(f"{wl}-{key}-{dname}", wl, dname, label,
                        sparsity=None if wl == "sci" else float(key),
                        matrix=key if wl == "sci" else None, info=dict(extra))
            bench.progress.start(f"{wl} {dname} {label}")
            t = time.perf_counter()
            try:
                if wl == "sci":
                    if key == "poisson":
                        a, info = poisson2d(bench.xp, bench.sp, args.grid, DTYPES[dname])
                    else:
                        a, info = powerlaw_graph(bench.xp, bench.sp, args.graph_n,
                                                 args.graph_degree, args.graph_alpha,
                                                 args.seed + 5, DTYPES[dname])
                    case.info.update(info)
                    run_sci_case(bench, case, a, DTYPES[dname], args.rhs, args.sci_tile_widths,
                                 nbuf_rule)
                    del a
                else:
                    run_activation_case(bench, case, inp, DTYPES[dname],
                                        with_gemm=(wl in ("ffn", "hot")),
                                        sweep=(wl == "sweep"),
                                        layer=(wl == "sweep" and float(key) in LAYER_SWEEP))
            except Exception as exc:  # noqa: BLE001 - setup failure: keep the other cases
                case.info["error"] = short_error(exc)
                case.info["traceback"] = traceback.format_exc(limit=6)[-2000:]
                bench.notes.append(f"{case.id}: case setup failed: {short_error(exc)}")
                if not bench.dev.healthy():
                    bench.broken = True
            case.info["wall_s"] = round(time.perf_counter() - t, 2)
            bench.dev.release()
            bench.finish_case(case)
            bench.progress.done()
        del inp
        bench.dev.release()


def prepare(bench):
    """Compile twell's kernels, then measure the ceilings; the time budget starts after the
    compilation (it trims measurements, not compiling)."""
    bench.progress.start("compiling twell kernels")
    bench.meta["compile_s"] = round(warm_twell(bench), 1)
    bench.budget_t0 = time.perf_counter()
    bench.progress.start("ceilings")
    measure_ceilings(bench)
