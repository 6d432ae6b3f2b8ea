"""Bitwise determinism of packing and of the products, on both backends.

The same input must give the same bits, not just close values: every run, every kernel
shape and every CUDA stream. The kernels promise it (fixed
accumulation order, no atomics: ``cuda_src/spmm.cu``); these tests hold them to it.

What is compared: the raw bits (a view as an unsigned integer of the same size) of the six
public storage arrays of every packed matrix, and of every product. Inputs are random normal
values, whose sums are not exact in any dtype (a different summation order shows), at 0 to 3%
density per row plus two nearly dense rows, so that tiles overflow with the given slots and
with ``slots="auto"``, and K is not a multiple of the tile width (a partial last tile).

Between repeated runs on the GPU, ``Backend.poison`` fills the pool's free memory with 0xFF:
a kernel that leaves part of an ``empty`` output unwritten then shows it as changed bits.
"""

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    BF16,
    DTYPES,
    F16,
    PART_NAMES,
    cast,
    force_short_rows,
    gpu_spmm,
    misaligned,
)

import twell

RUNS = 3

#: 600 rows: a partial last block of rows for the kernels that take rows by the warp or the
#: block. 777 columns: a partial last tile for every tile width here.
M, K = 600, 777

#: Right-hand-side widths: 72 (16-byte vectors), 30 (one value at a time).
WIDTHS = (72, 30)

#: (tile_width, slots) of the matrices packed with given slots; slots="auto" runs as well.
#: 256 / 3: overflowing tiles and 16-byte vector packing; 100 / 1: packing one value at a time.
LAYOUTS = [pytest.param(256, 3, id="t256-s3"), pytest.param(100, 1, id="t100-s1")]

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_HALF = (F16, BF16)


def _activations(rng, dtype, k=K):
    """(M, k) random normal values at 0-3% density per row; rows 0 and 1 nearly dense."""
    density = rng.uniform(0.0, 0.03, size=(M, 1))
    density[:2] = 0.9
    x = rng.standard_normal((M, k)) * (rng.random((M, k)) < density)
    return cast(x, dtype)


def _inputs(backend, rng, dtype):
    """Dense A, the same values as float64 CSR, a (K, 72) and a (K, 30) B and a vector."""
    x = _activations(rng, dtype)
    csr = sp.csr_array(cast(x, np.float64))  # exact: every dtype here widens to float64
    rhs = [cast(rng.standard_normal((K, n)), dtype) for n in WIDTHS]
    v = cast(rng.standard_normal(K), dtype)
    return (backend.asarray(x), backend.sparse(csr, "csr"),
            [backend.asarray(b) for b in rhs], backend.asarray(v))


def _operations(inputs, dtype, tile_width, slots):
    """Every operation under test: ``{name: array}``, arrays where the inputs live."""
    x, csr, rhs, v = inputs
    mats = {
        "dense": twell.TwELLMatrix(x, tile_width=tile_width, slots=slots),
        "dense auto": twell.TwELLMatrix(x, tile_width=tile_width, slots="auto"),
        "csr": twell.TwELLMatrix(csr, tile_width=tile_width, slots=slots, dtype=dtype),
        "csr auto": twell.TwELLMatrix(csr, tile_width=tile_width, slots="auto", dtype=dtype),
    }
    out = {f"{name}.{part}": getattr(a, part) for name, a in mats.items() for part in PART_NAMES}
    for name in ("dense", "dense auto"):
        a = mats[name]
        for b in rhs:
            out[f"{name} @ B{b.shape}"] = a @ b
        out[f"{name} @ v"] = a @ v
        for axis in (0, 1):  # float sums: an atomic histogram would change their last bits
            out[f"{name}.sum(axis={axis})"] = a.sum(axis=axis)
    return out


def _bits(backend, arrays):
    """``{name: (dtype name, host array of the raw bits)}`` of ``{name: array}``."""
    out = {}
    for name, x in arrays.items():
        raw = backend.to_host(x.view(_UINT[x.dtype.itemsize]))
        out[name] = (x.dtype.name, np.asarray(raw))
    return out


def _assert_same_bits(got, want, what):
    assert got.keys() == want.keys()
    for name, (dtype, bits) in got.items():
        assert dtype == want[name][0], f"{what}, {name}: dtype {dtype} != {want[name][0]}"
        np.testing.assert_array_equal(bits, want[name][1], err_msg=f"{what}, {name}: bits")


def _check_inputs_overflow(arrays, tile_width):
    # The inputs are meant to overflow: otherwise the overflow kernels would go untested here.
    assert K % tile_width != 0
    assert arrays["dense.overflow_data"].size > 0
    assert arrays["dense auto.overflow_data"].size > 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tile_width", "slots"), LAYOUTS)
def test_repeated_runs_give_the_same_bits(backend, rng, dtype, tile_width, slots):
    # Guards against races, atomics and unwritten output elements in packing (dense, CSR,
    # given slots and "auto") and in SpMM/SpMV. On NumPy, the specification is deterministic too.
    inputs = _inputs(backend, rng, dtype)
    first = _operations(inputs, dtype, tile_width, slots)
    _check_inputs_overflow(first, tile_width)
    want = _bits(backend, first)
    del first
    for run in range(1, RUNS):
        backend.poison()
        got = _bits(backend, _operations(inputs, dtype, tile_width, slots))
        _assert_same_bits(got, want, f"run {run + 1} vs run 1")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tile_width", "slots"), LAYOUTS)
def test_dense_and_csr_input_pack_to_the_same_bits(backend, rng, dtype, tile_width, slots):
    # The storage of a matrix does not depend on the path that built it (the format is
    # canonical: unused slots hold zeros), whatever the kernel (dense or CSR packing).
    bits = _bits(backend, _operations(_inputs(backend, rng, dtype), dtype, tile_width, slots))
    for src, dst in (("csr", "dense"), ("csr auto", "dense auto")):
        got = {p: bits[f"{src}.{p}"] for p in PART_NAMES}
        want = {p: bits[f"{dst}.{p}"] for p in PART_NAMES}
        _assert_same_bits(got, want, f"{src} vs {dst}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [8, 24, 48, 96, 200, 400, 1024])
@pytest.mark.parametrize("short", [False, True], ids=["long-rows", "short-rows"])
def test_the_gather_spmm_sums_in_one_order_whatever_the_alignment_of_b(gpu, rng, monkeypatch,
                                                                       dtype, n, short):
    # twell_spmm_rows spreads a row's entries over several accumulator sets when B is narrow
    # (_policy.rows_shape; these N, with the layout taken for one of short rows and
    # then not, take every shape for every dtype). The shape comes from N and the layout's
    # array shapes, never from B's alignment, so B one element past a 16-byte boundary (the
    # VEC = 1 instance) must give the bits of an aligned B (16-byte vectors), with overflow
    # (rows 0 and 1, slots=3) too.
    force_short_rows(monkeypatch, short)

    x = _activations(rng, dtype)
    a = twell.TwELLMatrix(gpu.asarray(x), slots=3)
    b = gpu.asarray(cast(rng.standard_normal((K, n)), dtype))
    dtype = np.dtype(dtype)
    got = {}
    for name, rhs in (("aligned", b), ("misaligned", misaligned(gpu.xp, b))):
        gpu.poison()
        got[name] = _bits(gpu, {"A @ B": gpu_spmm(a._parts, a.shape, a.tile_width, rhs, dtype,
                                                  way="rows")})
    _assert_same_bits(got["misaligned"], got["aligned"], f"N={n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("k", "tile_width"),
                         [(1000, 256), (1000, 512), (777, 64), (777, 96), (777, 128),
                          (777, 16), (1000, 2048)])
def test_every_dense_pack_kernel_packs_the_host_bits(gpu, monkeypatch, rng, dtype, k,
                                                     tile_width):
    # The dense pack takes one of three kernels by the vector loads a tile needs (K = 1000:
    # 16-byte loads; K = 777: one value per lane, 32 columns a load): 4 pairs a warp for one
    # load, the staged kernel for 2 to 4, one pair a warp looping over the tile beyond. Each,
    # with the slots given (3: rows 0 and 1 overflow) and with slots="auto" (the count pass
    # too), must give the NumPy backend's bits, partial last tiles and the overflow included.
    from twell._cuda import _compile, _pack

    x = _activations(rng, dtype, k)
    function, launched = _compile.function, set()
    monkeypatch.setattr(_compile, "function",
                        lambda name, expr: launched.add(expr) or function(name, expr))
    # An empty cache of the launcher's kernels, so that every kernel is looked up here.
    monkeypatch.setattr(_pack, "_pack_dense_kernel",
                        functools.cache(_pack._pack_dense_kernel.__wrapped__))
    for slots in (3, "auto"):
        gpu.poison()
        a = twell.TwELLMatrix(gpu.asarray(x), tile_width=tile_width, slots=slots)
        host = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
        _assert_same_bits(_bits(gpu, {part: getattr(a, part) for part in PART_NAMES}),
                          {part: (getattr(host, part).dtype.name,
                                  getattr(host, part).view(_UINT[getattr(host, part).itemsize]))
                           for part in PART_NAMES}, f"slots={slots}")
    vec = _compile.vector_width(dtype) if k == 1000 else 1
    loads = -(-tile_width // (32 * vec))
    packs = {e for e in launched if e.startswith("twell_pack_dense<")}
    pairs = {int(e.split(",")[2].strip(" >")) for e in packs}
    staged = any(e.count(",") == 3 for e in packs)
    assert staged == (2 <= loads <= 4), (loads, sorted(launched))
    if loads == 1:
        assert pairs == {_compile.PACK_PAIRS}, sorted(launched)
    elif loads > 4:
        assert pairs == {1}, sorted(launched)


def _same(got, want):
    return all(got[n][0] == want[n][0] and np.array_equal(got[n][1], want[n][1]) for n in got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_non_default_stream_gives_the_same_bits(gpu, rng, dtype):
    # Kernels and copies must run on CuPy's current stream. A non-blocking stream does not
    # wait for the legacy default stream, so work hidden on the default stream would race
    # with the rest and show here as different bits (or as garbage).
    import cupy

    tile_width, slots = 256, 3
    inputs = _inputs(gpu, rng, dtype)
    want = _bits(gpu, _operations(inputs, dtype, tile_width, slots))
    gpu.poison()
    cupy.cuda.Device().synchronize()  # the inputs were written on the default stream
    with cupy.cuda.Stream(non_blocking=True) as s:
        arrays = _operations(inputs, dtype, tile_width, slots)
    s.synchronize()
    _assert_same_bits(_bits(gpu, arrays), want, "non-default stream vs default stream")


@pytest.mark.parametrize("dtype", _HALF)
def test_fused_matmul_to_twell_gives_the_same_bits(gpu, rng, dtype):
    # twell_matmul_pack reserves spill room with an atomicAdd, so where a pair's extra entries
    # land varies from run to run; the overflow built from the spill must not.
    x = rng.standard_normal((M, 72))
    x[:, 0] = 1
    w = rng.standard_normal((K, 72)) / np.sqrt(72)
    w[:, 0] -= 1.6  # about 5% of the outputs positive: tiles of 64 overflow 2 slots
    x, w = gpu.asarray(cast(x, dtype)), gpu.asarray(cast(w, dtype))

    def run():
        a = twell.matmul_to_twell(x, w, tile_width=64, slots=2)
        return _bits(gpu, {part: getattr(a, part) for part in PART_NAMES})

    want = run()
    assert want["overflow_data"][1].size > 0
    for i in range(1, RUNS):
        gpu.poison()
        _assert_same_bits(run(), want, f"run {i + 1} vs run 1")
