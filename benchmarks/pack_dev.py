"""Pack development bench: where dense -> TwELL time goes, stage by stage.

One process, the same input for every stage, CUDA events after warm-up, median. The FFN
activation shape of the paper (M = 16384, K = 5632, bf16 unless ``--dtype`` says otherwise,
sparsity 99% by the bias-column trick). Prints one line per stage and the fraction of the
copy bandwidth each reaches; "staged chunks" is the slots pass with
``_kernels.PACK_STAGED_CHUNKS`` (it differs from the default only where a tile of 256 takes
2-4 vector loads: ``--dtype float32`` or ``float64``).
Usage (GPU machine, repository root): PYTHONPATH=. python benchmarks/pack_dev.py [--dtype D]
"""

import argparse
import functools

import _dev
import cupy
import numpy as np

import twell
from twell import _cupy_backend as gb
from twell import _kernels, _layout

p = argparse.ArgumentParser()
p.add_argument("--m", type=int, default=16384)
p.add_argument("--k", type=int, default=5632)
p.add_argument("--sparsity", type=float, default=0.99)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--dtype", choices=("bfloat16", "float16", "float32", "float64"),
               default="bfloat16")
args = p.parse_args()
timed = functools.partial(_dev.timed, reps=args.reps)

z = _dev.activations(args.m, args.k, 2048, args.sparsity, np.random.default_rng(0))
z = z.astype(twell.bfloat16 if args.dtype == "bfloat16" else np.dtype(args.dtype))
a = twell.TwELLMatrix(z)
s = a.slots
nt = _layout.n_tiles(args.k, 256)
print(f"M={args.m} K={args.k} density={float((z != 0).mean()):.4f} auto slots={s} "
      f"overflow={a.overflow_nnz}")
totals = cupy.empty((args.m, nt), dtype=_layout.COUNT_DTYPE)
parts = gb._empty_parts(args.m, nt, s, z.dtype, zeroed=False)
counter = gb._overflow_counter()


def slots_pass():
    gb._launch_pack_dense(z, 256, s, gb._MODE_SLOTS, totals, parts, parts.overflow_indptr,
                          counter)


gb._launch_pack_dense(z, 256, s, gb._MODE_SLOTS, totals, parts, parts.overflow_indptr, counter)
real_offset, row_starts = gb._overflow_offsets(totals, s)
over = gb._with_overflow(parts, row_starts, max(a.overflow_nnz, 1))
counts = gb.tile_counts_dense(z, 256)


def slots_pass_pairs(pairs):
    saved, _kernels.PACK_PAIRS = _kernels.PACK_PAIRS, pairs
    try:
        slots_pass()
    finally:
        _kernels.PACK_PAIRS = saved


def slots_pass_staged():
    """The slots pass with _kernels.PACK_STAGED_CHUNKS: the staged kernel with 2-4 loads per
    pair where a tile of 256 needs that many (float32, float64)."""
    saved, _kernels.PACK_STAGED_CHUNKS = _kernels.PACK_STAGED_CHUNKS, True
    try:
        slots_pass()
    finally:
        _kernels.PACK_STAGED_CHUNKS = saved


stages = {
    "copy z (read + write)": (lambda: z.view(f"u{z.dtype.itemsize}").copy(), 2 * z.nbytes),
    "slots pass (kernel)": (slots_pass, z.nbytes),
    **{f"slots pass, PAIRS={p}": (functools.partial(slots_pass_pairs, p), z.nbytes)
       for p in _kernels.PACK_PAIRS_CHOICES},
    "slots pass, staged chunks": (slots_pass_staged, z.nbytes),
    "count pass (kernel)": (lambda: gb.tile_counts_dense(z, 256), z.nbytes),
    "count histogram + read-back (sync)": (
        lambda: twell._twell._tile_counts_histogram(counts, 256), 0),
    "overflow size (sync)": (lambda: gb._overflow_size(counter), 0),
    "overflow offsets (twell_exclusive_scan)": (lambda: gb._overflow_offsets(totals, s), 0),
    "cumsum into out= (offsets)": (lambda: cupy.cumsum(totals.reshape(-1), out=cupy.empty(
        totals.size, dtype=np.int64)), 0),
    "cumsum into a new array": (lambda: cupy.cumsum(totals.reshape(-1), dtype=np.int64), 0),
    "overflow pass (kernel)": (lambda: gb._launch_pack_dense(
        z, 256, s, gb._MODE_OVERFLOW, totals, over, real_offset, counter), 0),
    "pack_dense (launcher)": (lambda: gb.pack_dense(z, 256, s), z.nbytes),
    "TwELLMatrix(z, slots=S)": (lambda: twell.TwELLMatrix(z, slots=s), z.nbytes),
    "TwELLMatrix(z) (auto)": (lambda: twell.TwELLMatrix(z), z.nbytes),
}
copy_bw = None
for name, (fn, nbytes) in stages.items():
    ms = timed(fn)
    bw = nbytes / ms / 1e9 if nbytes else float("nan")
    copy_bw = copy_bw or bw
    print(f"{name:<28} {ms * 1e3:9.1f} us  {bw:6.2f} TB/s  {bw / copy_bw:6.1%} of copy")
