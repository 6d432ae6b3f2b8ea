"""PROTOTYPE measurements for the row sort ``twell_csr_sort_rows`` (``cuda_src/canonical.cu``).

Not part of the package or the test-suite. ncu of the shipped kernel (eighth session, H200)
found it issue-bound at about three times the instructions counted per row: 1.45 ms at 90%
sparsity on the paper's activations (rows of ~563 entries out of column order, as cupyx's
``csr_matrix(dense)`` writes them). Two suspects, each a variant built from the shipped
source with one helper replaced in the text before NVRTC compiles it:

* ``unrolled``: ``rank_in_chunk`` unrolls the full chunk (width 32, every chunk but a row's
  last) instead of looping over a variable width;
* ``unrolled+search``: that, and a full chunk searched in five fixed, branch-free steps on
  32-bit keys (plus one to reach 32) instead of the generic binary search.

Every variant must give the shipped kernel's outputs bit for bit (sorted columns and values,
row counts, the three counters): they change how a rank is counted, not its value. Timed with
CUDA events on the same cupyx input, float32, 99 / 95 / 90%. Run from the repository root on
an H100/H200:

    PYTHONPATH=. python benchmarks/prototypes/csr_sort_tuning.py
"""

import functools
import pathlib
import sys

import cupy
import numpy as np
from cupyx.scipy import sparse as cs

from twell import _cupy_backend, _kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # benchmarks/
import _dev  # noqa: E402

median_ms = functools.partial(_dev.timed, reps=20)
EXPR = "twell_csr_sort_rows<float>"

SHIPPED_RANK = """  int r = 0;
  for (int t = 0; t < width; ++t) {
    const int other = __shfl_sync(kFullMask, c, t);
    r += (other < c) | ((other == c) & (t < lane));
  }
  return r;"""

UNROLLED_RANK = """  int r = 0;
  if (width == kWarp) {
#pragma unroll
    for (int t = 0; t < kWarp; ++t) {
      const int other = __shfl_sync(kFullMask, c, t);
      r += (other < c) | ((other == c) & (t < lane));
    }
    return r;
  }
  for (int t = 0; t < width; ++t) {
    const int other = __shfl_sync(kFullMask, c, t);
    r += (other < c) | ((other == c) & (t < lane));
  }
  return r;"""

SHIPPED_SEARCH = """            pos += count_below(scratch + start + b0, min(kWarp, len - b0),
                               b0 < i0 ? static_cast<long long>(c) + 1 : c);"""

# Binary lifting over 32 sorted values: the largest p in [0, 31] with a[p - 1] before the key,
# then one more step for p = 32. "Before": <= c in an earlier chunk, < c in a later one.
FIXED_SEARCH = """            const int* chunk = scratch + start + b0;
            const bool earlier = b0 < i0;
            if (len - b0 >= kWarp) {
              int p = 0;
#pragma unroll
              for (int step = kWarp / 2; step > 0; step >>= 1) {
                const int v = chunk[p + step - 1];
                p += (v < c || (earlier && v == c)) ? step : 0;
              }
              const int v = chunk[p];
              pos += p + ((v < c || (earlier && v == c)) ? 1 : 0);
            } else {
              pos += count_below(chunk, len - b0, earlier ? static_cast<long long>(c) + 1 : c);
            }"""


def kernel(rank=None, search=None):
    """(kernel, registers, local bytes): the shipped source, its rank and/or search replaced."""
    source = _kernels.source_text("canonical.cu")
    for text in (SHIPPED_RANK, SHIPPED_SEARCH):
        assert text in source, "canonical.cu changed: update this prototype"
    if rank is None and search is None:
        k = _kernels.function("canonical.cu", EXPR)
    else:
        source = source.replace(SHIPPED_RANK, rank or SHIPPED_RANK)
        source = source.replace(SHIPPED_SEARCH, search or SHIPPED_SEARCH)
        module = cupy.RawModule(code=source, options=_kernels.OPTIONS, name_expressions=[EXPR])
        k = module.get_function(EXPR)
    return k, k.num_regs, k.local_size_bytes


def run(k, x):
    """The shipped launch of ``_cupy_backend.canonical_csr``: its outputs, bits comparable."""
    m = x.shape[0]
    indptr = cupy.ascontiguousarray(x.indptr, dtype=np.int64)
    scratch, col, val = (cupy.empty_like(x.indices), cupy.empty_like(x.indices),
                         cupy.empty_like(x.data))
    kept = cupy.empty(m, dtype=np.int64)
    info = cupy.zeros(3, dtype=np.uint64)
    grid = (min(-(-m // _cupy_backend._WARPS), _cupy_backend._CANONICAL_BLOCKS),)
    k(grid, (_cupy_backend._BLOCK,), (indptr, x.indices, x.data, np.int64(m),
                                      np.int64(x.shape[1]), np.int64(x.indices.size),
                                      np.int64(_cupy_backend.CSR_SORT_MAX_ROW), scratch, col,
                                      val, kept, info))
    return col, val, kept, info


def main():
    variants = {"shipped": kernel(), "unrolled": kernel(rank=UNROLLED_RANK),
                "unrolled+search": kernel(rank=UNROLLED_RANK, search=FIXED_SEARCH)}
    for name, (_, regs, local) in variants.items():
        print(f"{name}: {regs} registers, {local} bytes of local memory (spills)")
    print("M=16384 K=5632 float32, cupyx csr_matrix(dense) input; CUDA events, median of 20 "
          "(us)")
    print(f"{'sparsity':>8} {'nnz':>9} " + " ".join(f"{n:>16}" for n in variants))
    rng = np.random.default_rng(3)
    ok = True
    for s in (0.99, 0.95, 0.90):
        z = _dev.activations(16384, 5632, 2048, s, rng).astype(np.float32)
        x = cs.csr_matrix(z)
        want = run(variants["shipped"][0], x)
        times = []
        for name, (k, _, _) in variants.items():
            got = run(k, x)
            same = all(bool(cupy.array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}")))
                       for g, w in zip(got, want, strict=True))
            if not same:
                ok = False
                print(f"  MISMATCH at {s}: {name}")
            times.append(1e3 * median_ms(lambda k=k, x=x: run(k, x)))
        print(f"{s:>8} {x.nnz:>9} " + " ".join(f"{t:>16.1f}" for t in times), flush=True)
    print("all variants give the shipped outputs" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
