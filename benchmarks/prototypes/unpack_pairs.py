"""Prototype twell_unpack_dense with PAIRS (row, tile) pairs a warp (unpack_pairs.cu) against
the shipped kernel: the same bits on NaN-filled outputs (small shapes with a partial group of
pairs and slots past 32, and the paper's down projection), then each alone, interleaved, two
passes, at M = 16384, K = 5632, bf16, slots="auto", 99 / 95 / 90%.

Run on an H100/H200 from the repository root:
    PYTHONPATH=. timeout 300 python benchmarks/prototypes/unpack_pairs.py
"""

import pathlib
import sys

import cupy
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import _dev  # noqa: E402
from matmul_pack_sm90_cluster import compile_prototype  # noqa: E402

import twell  # noqa: E402
from twell import _kernels  # noqa: E402

PAIRS = (1, 2, 4, 8)
PROTO = dict(zip(PAIRS, compile_prototype(
    "unpack_pairs.cu", [f"proto_unpack_pairs_bf16_{p}" for p in PAIRS]), strict=True))
SHIPPED = _kernels.function("unpack.cu", "twell_unpack_dense<__nv_bfloat16, 8>")


def launch(a, out, pairs=None):
    p, (m, k) = a._parts, a.shape
    n = p.counts.size
    args = (p.counts, p.data, p.indices, np.int64(m), np.int64(k), np.int32(a.tile_width),
            np.int32(p.data.shape[2]), out)
    if pairs is None:
        SHIPPED((-(-n // 8),), (256,), args)
    else:
        groups = -(-n // pairs)  # a warp each
        PROTO[pairs]((-(-groups // 8),), (256,), args)


def same_bits(a):
    ref = cupy.full(a.shape, np.nan, dtype=a.dtype)
    launch(a, ref)
    ok = True
    for pairs in PAIRS:
        got = cupy.full(a.shape, np.nan, dtype=a.dtype)
        launch(a, got, pairs)
        ok &= bool(cupy.array_equal(got.view(np.uint16), ref.view(np.uint16)))
    return ok


def main():
    rng = np.random.default_rng(0)
    small = [(37, 9000, 256, 40, 0.3), (5, 512, 8, 1, 0.5), (129, 2048, 512, 3, 0.05)]
    for m, k, t, s, d in small:
        x = (rng.standard_normal((m, k)) * (rng.random((m, k)) < d)).astype(twell.bfloat16)
        a = twell.TwELLMatrix(cupy.asarray(x), tile_width=t, slots=s)
        print(f"m={m} k={k} T={t} S={s}: same bits as shipped: {same_bits(a)}")
    m, k = 16384, 5632
    for s in (0.99, 0.95, 0.90):
        z = _dev.activations(m, k, 2048, s, rng).astype(twell.bfloat16)
        a = twell.TwELLMatrix(z)
        out = cupy.empty((m, k), dtype=z.dtype)
        ways = {"shipped": lambda a=a, o=out: launch(a, o)}
        ways.update({f"{p} pairs a warp": (lambda a=a, o=out, p=p: launch(a, o, p))
                     for p in PAIRS})
        times = {w: [] for w in ways}
        for _ in range(2):
            for w, f in ways.items():
                times[w].append(_dev.timed(f, 20))
        print(f"sparsity {s} (S={a.slots}): same bits: {same_bits(a)}; ms: " + ", ".join(
            f"{w} " + " / ".join(f"{x:.3f}" for x in t) for w, t in times.items()))
        del z, a, out


if __name__ == "__main__":
    main()
