"""Fused GEMM -> TwELL development bench: twell_matmul_pack against its composed parts.

One process, the same inputs for every contender, CUDA events after warm-up, median. The
paper's up projection: x (M = 16384, D = 2048), w (H = 5632, D), bf16 (``--dtype float16``
for fp16), sparsity set by the bias-column trick. Prints one line per contender with its
TFLOP/s (2 M D H flops).
Usage (GPU machine, repository root): PYTHONPATH=. python benchmarks/ffn_dev.py [--stages]
[--gated] [--once] [--dtype float16]
"""

import argparse
import functools

import _dev
import cupy
import numpy as np

import twell
from twell import _cupy_backend as gb

p = argparse.ArgumentParser()
p.add_argument("--m", type=int, default=16384)
p.add_argument("--d", type=int, default=2048)
p.add_argument("--h", type=int, default=5632)
p.add_argument("--sparsities", default="0.99,0.95,0.9")
p.add_argument("--reps", type=int, default=20)
p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
p.add_argument("--stages", action="store_true",
               help="also time each step of matmul_to_twell's slots='auto' path")
p.add_argument("--gated", action="store_true",
               help="time each step of the gated FFN instead, its up projection both ways (a "
                    "dot product per gate entry, or cuBLAS's whole product read at the entries)")
p.add_argument("--once", action="store_true",
               help="only run matmul_to_twell once with slots='auto' and once with 13 slots at "
                    "the first sparsity, then exit: a short process for a profiler, e.g. "
                    "ncu --clock-control none -k regex:twell_matmul_pack -c 2 python3 "
                    "benchmarks/ffn_dev.py --once")
args = p.parse_args()
dtype = twell.bfloat16 if args.dtype == "bfloat16" else np.float16
timed = functools.partial(_dev.timed, reps=args.reps)
flops = 2 * args.m * args.d * args.h

x, w0, wu, wd = _dev.ffn_operands(args.m, args.d, args.h, dtype)
card = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
print(f"M={args.m} D={args.d} H={args.h} {args.dtype}, {card}")


def contenders(w, smax):
    """``{name: callable}``: every way to get relu(x @ w.T), dense or in TwELL."""
    return {
        "cupy.matmul (GEMM alone)": lambda: x @ w.T,
        "cupy.matmul + relu": lambda: cupy.maximum(x @ w.T, 0),
        f"matmul + relu + TwELL pack, S={smax}":
            lambda: twell.TwELLMatrix(cupy.maximum(x @ w.T, 0), slots=smax),
        "matmul + relu + TwELL pack, auto":
            lambda: twell.TwELLMatrix(cupy.maximum(x @ w.T, 0)),
        f"twell.matmul_to_twell fused, S={smax}":
            lambda: twell.matmul_to_twell(x, w, slots=smax),
        f"twell.matmul_to_twell fused, S={max(smax // 2, 1)} (overflow)":
            lambda: twell.matmul_to_twell(x, w, slots=max(smax // 2, 1)),
        "twell.matmul_to_twell fused, auto": lambda: twell.matmul_to_twell(x, w),
        f"kernel alone (gb.matmul_pack), S={smax}": lambda: gb.matmul_pack(x, w, 256, smax),
        f"mma.sync kernel alone (variant='mma'), S={smax}":
            lambda: gb.matmul_pack(x, w, 256, smax, variant="mma"),
        "gated FFN, dense (3 cupy GEMMs)":
            lambda: (cupy.maximum(x @ w.T, 0) * (x @ wu.T)) @ wd.T,
        f"gated FFN, twell.sparse_ffn S={smax}":
            lambda: twell.sparse_ffn(x, w, wu, wd, slots=smax),
        "gated FFN, twell.sparse_ffn auto": lambda: twell.sparse_ffn(x, w, wu, wd),
    }


if args.once:
    w = _dev.gate_weight(w0, float(args.sparsities.split(",")[0]), dtype)
    auto = twell.matmul_to_twell(x, w)
    given = twell.matmul_to_twell(x, w, slots=13)
    cupy.cuda.Device().synchronize()
    print(f"auto: {auto.slots} slots, nnz {auto.nnz}; given: 13 slots, nnz {given.nnz}")
    raise SystemExit(0)

if not args.gated:  # --gated times the gated FFN's steps only
    print(f"{'sparsity':>8} {'contender':<40} {'ms':>8} {'TFLOP/s':>8}")
    for s in map(float, args.sparsities.split(",")):
        w = _dev.gate_weight(w0, s, dtype)
        ref = twell.TwELLMatrix(cupy.maximum(x @ w.T, 0))
        smax = int(ref.tile_nnz().max())
        fused = twell.matmul_to_twell(x, w, slots=smax)
        rows = contenders(w, smax)
        err = float(cupy.abs(fused.toarray().astype(np.float32)
                             - ref.toarray().astype(np.float32)).max())
        density = ref.nnz / ref.shape[0] / ref.shape[1]
        print(f"# sparsity {s}: density {density:.4f}, max tile {smax}, "
              f"fused vs cuBLAS max |diff| {err:.3g}, fused nnz {fused.nnz} vs {ref.nnz}")
        for name, fn in rows.items():
            t = timed(fn)
            print(f"{s:>8} {name:<40} {t:8.3f} {flops / t / 1e9:8.1f}", flush=True)


def auto_stages(w):
    """The parts of matmul_to_twell(x, w) with slots="auto", each timed alone (ms): the
    provisional kernel alone with and without its zero fill (no read, no rerun), the fused
    launch at the provisional slots, the whole auto launcher (launch, histogram, one read,
    twell_reslot) and the plain launcher at the slots it picks."""
    provisional = 256 // gb._PROVISIONAL_SHARE
    _, slots, _ = gb.matmul_pack_auto(x, w, 256)
    plan = gb.matmul_plan(x, w, 256)
    parts = gb._empty_parts(x.shape[0], plan.totals.shape[1], provisional, x.dtype,
                            zeroed=False, overflow=False)

    def kernel(zero_fill):
        return lambda: gb._launch_matmul_pack(
            x, w, plan.variant, 256, provisional, plan.totals, parts, plan.spill_start,
            plan.spill_capacity, plan.spill_indices, plan.spill_data, zero_fill=zero_fill)

    return slots, {
        f"kernel alone at the provisional S={provisional}, zero fill": kernel(True),
        f"kernel alone at the provisional S={provisional}, no fill": kernel(False),
        f"matmul_pack at the provisional S={provisional}": lambda: gb.matmul_pack(
            x, w, 256, provisional),
        "matmul_pack_auto (launch, histogram, read, reslot)": lambda: gb.matmul_pack_auto(
            x, w, 256),
        f"matmul_pack with the chosen S={slots}": lambda: gb.matmul_pack(x, w, 256, slots),
        "matmul_to_twell(x, w) (auto)": lambda: twell.matmul_to_twell(x, w),
    }


if args.stages:
    w = _dev.gate_weight(w0, 0.99, dtype)
    slots, stages = auto_stages(w)
    print(f"# slots='auto' at 99%: S={slots}")
    for name, fn in stages.items():
        print(f"{name:<48} {timed(fn):8.3f} ms", flush=True)


def swapped(name, value, fn):
    """``fn`` run with ``twell._cupy_backend.<name>`` replaced by ``value`` for the call."""
    def run():
        kept = getattr(gb, name)
        setattr(gb, name, value)
        try:
            return fn()
        finally:
            setattr(gb, name, kept)
    return run


def gated_stages(w):
    """The gated FFN's steps at the gate relu(x @ w.T), each timed alone (ms), its up
    projection both ways, and the whole layer with each way forced."""
    gate = twell.matmul_to_twell(x, w)
    parts, shape = gate._parts, gate.shape
    h = twell.TwELLMatrix._from_parts(gb.gated_up(parts, shape, 256, x, wu), shape, 256,
                                      gate.nnz)
    up = gb._gemm_nt_float32(x, wu)

    def whole():
        return gb.gated_up(parts, shape, 256, x, wu, variant="dense")

    def layer():
        return twell.sparse_ffn(x, w, wu, wd)

    return gate, {
        "gate: matmul_to_twell (auto)": lambda: twell.matmul_to_twell(x, w),
        "up, dot per entry (twell_gated_up)": lambda: gb.gated_up(parts, shape, 256, x, wu,
                                                                  variant="dot"),
        "up, whole (GemmEx float32 + twell_gated_take)": whole,
        "  GemmEx float32 alone": lambda: gb._gemm_nt_float32(x, wu),
        "  cupy.matmul bf16 (for scale)": lambda: x @ wu.T,
        "  twell_gated_take alone (the product given)": swapped(
            "_gemm_nt_float32", lambda *_: up, whole),
        "down: h @ w_down.T (twell's choice)": lambda: h @ wd.T,
        "layer, up forced dot": swapped("gated_up_way", lambda *_: "dot", layer),
        "layer, up forced whole": swapped("gated_up_way", lambda *_: "dense", layer),
        "layer, twell.sparse_ffn (its choice)": layer,
        "layer, dense (3 cupy GEMMs)": lambda: (cupy.maximum(x @ w.T, 0) * (x @ wu.T)) @ wd.T,
    }


if args.gated:
    for s in map(float, args.sparsities.split(",")):
        w = _dev.gate_weight(w0, s, dtype)
        gate, stages = gated_stages(w)
        density = gate.nnz / gate.shape[0] / gate.shape[1]
        print(f"# gated FFN at {s}: gate density {density:.4f}, S={gate.slots}, model picks "
              f"{gb.gated_up_way(args.m, args.h, args.d, x.dtype, gate.nnz)}")
        for name, fn in stages.items():
            print(f"{s:>8} {name:<48} {timed(fn):8.3f} ms", flush=True)
