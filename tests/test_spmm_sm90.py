"""twell_spmm_sm90: ``A @ B`` on Hopper as a tensor-core GEMM whose A operand is built in shared
memory from the TwELL arrays, against float64 references and the gather kernel."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import twell
from twell import _layout

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
if not twell.cuda_available():
    pytest.skip("CuPy with a CUDA GPU is not available", allow_module_level=True)

from helpers import Backend, misaligned  # noqa: E402

from twell import _cupy_backend, _kernels  # noqa: E402

pytestmark = pytest.mark.gpu

HALF = [twell.bfloat16, np.float16]
EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}  # spacing at 1 (np.finfo has no bfloat16)


@pytest.fixture(autouse=True)
def hopper():
    if not (_kernels.arch_supported("spmm_sm90.cu") and _kernels.tensor_maps_supported()):
        pytest.skip("twell_spmm_sm90_* need a device of compute capability 9.0 and a driver "
                    "that encodes tensor maps")


def _matrix(rng, m, k, density, dtype):
    x = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    return x.astype(dtype)


def _sm90(a, b):
    """``a @ b`` forced onto the Hopper kernel, as a host float64 array (the output poisoned
    beforehand: an element the kernel leaves unwritten shows as NaN)."""
    Backend("cupy").poison()
    out = _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, a.dtype, variant="sm90")
    return out.astype(np.float64).get()


def _assert_rounded_product(got, x, b, dtype):
    """``got`` is ``x @ b`` summed in float32 (or better) and rounded once to ``dtype``:
    within half a unit of ``dtype``'s last place of the float64 product, plus float32's
    accumulation error over K terms of |x| @ |b| (and fp16's subnormal spacing)."""
    x64, b64 = np.asarray(x, dtype=np.float64), np.asarray(b, dtype=np.float64)
    want = x64 @ b64
    eps = EPS[np.dtype(dtype).name]
    bound = (eps / 2 * np.abs(want) + x64.shape[1] * 2.0**-24 * (np.abs(x64) @ np.abs(b64))
             + 2.0**-24)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    bad = np.abs(got - want) > bound
    assert not bad.any(), (f"{bad.sum()} of {bad.size} outside the bound; first at "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]}, want {want[bad][0]}")


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), k8=st.integers(1, 140), n=st.integers(1, 300),
       tile_width=st.sampled_from([64, 128, 256, 512]), slots=st.integers(1, 40),
       density=st.sampled_from([0.01, 0.1, 0.5]), dtype=st.sampled_from(HALF),
       seed=st.integers(0, 2**32 - 1))
def test_sm90_spmm_is_the_rounded_product(m, k8, n, tile_width, slots, density, dtype, seed):
    # Any M, N (partial blocks, odd N: one value a store), K a multiple of 8 (partial slabs
    # and tiles), slots from 1 (most entries in the overflow) past the 32 a builder holds in
    # registers (the rest read at their slab), odd slot counts (pairs that start mid-word).
    rng = np.random.default_rng(seed)
    k = 8 * k8
    x = _matrix(rng, m, k, density, dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=tile_width, slots=slots)
    _assert_rounded_product(_sm90(a, cupy.asarray(b)), x, b, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: np.dtype(d).name)
def test_sm90_spmm_on_a_down_projection(rng, dtype):
    # The paper's FFN shape cut to 1024 tokens, at 95% with slots="auto" (some overflow):
    # 44 slabs of k over 8 column blocks, and the gather kernel's product within its bound.
    x = np.maximum(_matrix(rng, 1024, 5632, 0.1, dtype), 0)
    b = (rng.standard_normal((5632, 512)) / 75).astype(dtype)
    a = twell.TwELLMatrix(cupy.asarray(x))
    assert a.overflow_nnz > 0
    got = _sm90(a, cupy.asarray(b))
    _assert_rounded_product(got, x, b, dtype)
    rows = _cupy_backend.spmm(a._parts, a.shape, a.tile_width, cupy.asarray(b), a.dtype,
                              variant="rows").astype(np.float64).get()
    np.testing.assert_allclose(got, rows, rtol=2 * EPS[np.dtype(dtype).name], atol=1e-3)


def test_sm90_spmm_keeps_nonfinite_b_out_of_missing_entries(rng):
    # A dense GEMM multiplies A's zeros by B: an Inf in a row of B whose column of A is empty
    # would make NaN. The launcher recomputes such a product with the gather kernel.
    x = _matrix(rng, 200, 512, 0.1, twell.bfloat16)
    x[:, 7] = 0
    b = rng.standard_normal((512, 64)).astype(twell.bfloat16)
    b[7, 3] = np.inf
    a = twell.TwELLMatrix(cupy.asarray(x))
    got = _sm90(a, cupy.asarray(b))
    b_finite = b.copy()
    b_finite[7, 3] = 0
    _assert_rounded_product(got, x, b_finite, twell.bfloat16)


def test_sm90_spmm_of_an_empty_matrix_is_zero(rng):
    a = twell.TwELLMatrix(cupy.zeros((130, 256), dtype=twell.bfloat16))
    b = cupy.asarray(rng.standard_normal((256, 300)).astype(twell.bfloat16))
    got = _sm90(a, b)
    assert np.array_equal(got, np.zeros((130, 300))) and not np.signbit(got).any()


def test_sm90_spmm_reads_misaligned_inputs(rng):
    # B (read through a transposed copy) one value past a 16-byte boundary; slot arrays that
    # start mid-word are copied (the builders read 32-bit words).
    x = _matrix(rng, 150, 320, 0.2, twell.bfloat16)
    b = rng.standard_normal((320, 40)).astype(twell.bfloat16)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=64, slots=5)
    parts = a._parts._replace(data=misaligned(cupy, a._parts.data),
                              indices=misaligned(cupy, a._parts.indices))
    Backend("cupy").poison()
    got = _cupy_backend.spmm(parts, a.shape, 64, misaligned(cupy, cupy.asarray(b)), a.dtype,
                             variant="sm90")
    _assert_rounded_product(got.astype(np.float64).get(), x, b, twell.bfloat16)


@pytest.mark.parametrize(("what", "shape", "tile_width", "dtype"), [
    ("K not a multiple of 8", (64, 100), 64, twell.bfloat16),
    ("tile width not a multiple of 64", (64, 256), 32, twell.bfloat16),
    ("float32", (64, 256), 256, np.float32),
])
def test_forced_sm90_spmm_refuses_what_it_cannot_run(rng, what, shape, tile_width, dtype):
    x = cupy.asarray(_matrix(rng, *shape, 0.1, dtype))
    a = twell.TwELLMatrix(x, tile_width=tile_width)
    b = cupy.ones((shape[1], 8), dtype=dtype)
    with pytest.raises(ValueError, match="sm90 SpMM takes 16-bit values"):
        _cupy_backend.spmm(a._parts, a.shape, tile_width, b, a.dtype, variant="sm90")


def test_default_spmm_builds_a_in_shared_memory_where_the_model_says(rng, monkeypatch):
    # Above the model's density the product takes the Hopper kernel by default.
    monkeypatch.setattr(_layout, "DENSE_PRODUCT_MIN_WORK", 1)
    calls = []
    real = _cupy_backend._spmm_sm90

    def spy(*args):
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(_cupy_backend, "_spmm_sm90", spy)
    x = _matrix(rng, 256, 512, 0.2, twell.bfloat16)
    b = rng.standard_normal((512, 256)).astype(twell.bfloat16)
    a = twell.TwELLMatrix(cupy.asarray(x))
    assert _cupy_backend.spmm_way(256, 512, 256, a.dtype, a._nnz_hint, a.tile_width) == "sm90"
    got = (a @ cupy.asarray(b)).astype(np.float64).get()
    assert calls == [(256, 512)]
    _assert_rounded_product(got, x, b, twell.bfloat16)
    # Slots given without a count (no nnz known) never pick it: no host sync.
    assert _cupy_backend.spmm_way(256, 512, 256, a.dtype, None, a.tile_width) == "rows"
