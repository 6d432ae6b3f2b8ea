"""``A @ B`` and ``B @ A`` (SpMM / SpMV) against scipy ``csr_array @ dense`` in float64.

The reference is built from the matrix's own stored values upcast to
float64, so the rounding of the input to a narrow dtype is not counted; what
is measured is the product's error: relative error by norm within 1e-12
(float64), 1e-5 (float32), 1e-3 (float16) and 1e-2 (bfloat16).
"""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    BF16,
    F16,
    F32,
    F64,
    MATMUL_RTOL,
    assert_dense_equal,
    cast,
    dense_from_parts,
    rel_err,
)
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import RHS, cases, edge_examples, rhs

import twell
from twell import _numpy_backend

I64, I32, BOOL = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.bool_)

# (A dtype, B dtype, result dtype): NumPy promotion; bf16 with f16 gives f32; ints give f64.
PROMOTION = [
    (F64, F64, F64), (F32, F32, F32), (F16, F16, F16), (BF16, BF16, BF16),
    (BF16, F32, F32), (BF16, F16, F32), (F16, BF16, F32), (F16, F32, F32),
    (F32, F64, F64), (BF16, F64, F64), (F64, F16, F64),
    (BF16, I64, F64), (F32, I32, F64), (F16, BOOL, F64),
]
PROMOTION_IDS = [f"{a.name}@{b.name}".replace("bfloat16", "bf16") for a, b, _ in PROMOTION]

MATMUL_CASES = cases(values="finite", max_rows=24, max_cols=600)


def reference(a, b):
    """scipy CSR of the stored values (float64) times ``b`` in float64."""
    return sp.csr_array(dense_from_parts(a)) @ cast(b, np.float64)


def check_product(backend, out, want, dtype, shape, magnitude=None):
    """Relative error by norm within the dtype's tolerance.

    ``magnitude`` (|A| @ |B| in float64) measures the error of the accumulation against the
    size of the terms rather than of their sum: with cancellation a correctly accumulated
    float32 result can be off by more than 1e-5 of the (small) sum. The error is taken
    relative to the larger of the two norms.
    """
    assert backend.is_native(out)
    out = backend.to_host(out)
    assert out.dtype == dtype, f"result dtype {out.dtype}, expected {dtype}"
    assert out.shape == shape
    err = rel_err(out, want)
    if magnitude is not None and err > MATMUL_RTOL[dtype]:
        err = min(err, rel_err(out, want) * np.linalg.norm(cast(want, np.float64))
                  / max(np.linalg.norm(cast(magnitude, np.float64)), 1e-300))
    assert err <= MATMUL_RTOL[dtype], f"relative error {err:.3g} > {MATMUL_RTOL[dtype]}"


@pytest.mark.parametrize("a_dtype, b_dtype, out_dtype", PROMOTION, ids=PROMOTION_IDS)
@given(case=MATMUL_CASES, rhs=rhs())
@edge_examples(finite=True, rhs=RHS(3, 0))
def test_matmul_against_scipy(backend, a_dtype, b_dtype, out_dtype, case, rhs):
    m, k = case.dense.shape
    a = twell.TwELLMatrix(backend.asarray(cast(case.dense, a_dtype)),
                          tile_width=case.tile_width, slots=case.slots)
    b = rhs.make(k, b_dtype)
    backend.poison()
    out = a @ backend.asarray(b)
    shape = (m,) if rhs.n is None else (m, rhs.n)
    magnitude = sp.csr_array(np.abs(dense_from_parts(a))) @ np.abs(cast(b, np.float64))
    check_product(backend, out, reference(a, b), out_dtype, shape, magnitude)


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@given(case=MATMUL_CASES, rhs=rhs())
@edge_examples(finite=True, rhs=RHS(None, 0))
def test_rmatmul_against_scipy(backend, dtype, case, rhs):
    """``B @ A`` for an ndarray B reaches __rmatmul__ (NumPy defers to ``__array_priority__``)."""
    m, k = case.dense.shape
    a = twell.TwELLMatrix(backend.asarray(cast(case.dense, dtype)), tile_width=case.tile_width,
                          slots=case.slots)
    b = rhs.make(m, dtype)  # (M,) or (M, n)
    stored_t = sp.csr_array(dense_from_parts(a)).T
    abs_t = sp.csr_array(np.abs(dense_from_parts(a))).T
    b64 = cast(b, np.float64)
    if rhs.n is None:
        out, want, shape = backend.asarray(b) @ a, stored_t @ b64, (k,)
        magnitude = abs_t @ np.abs(b64)
    else:
        bt = np.ascontiguousarray(b.T)  # (n, M)
        out, want, shape = backend.asarray(bt) @ a, (stored_t @ b64).T, (rhs.n, k)
        magnitude = (abs_t @ np.abs(b64)).T
    check_product(backend, out, want, dtype, shape, magnitude)


def test_dot_is_matmul(backend, rng):
    x = rng.standard_normal((7, 40)) * (rng.random((7, 40)) < 0.3)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=8)
    b = backend.asarray(rng.standard_normal((40, 3)))
    np.testing.assert_array_equal(backend.to_host(a.dot(b)), backend.to_host(a @ b))


LAYOUTS = {
    "c-contiguous": lambda xp, b: b,
    "fortran": lambda xp, b: xp.asfortranarray(b),
    "strided": lambda xp, b: xp.repeat(b, 2, axis=1)[:, ::2],
    # Contiguous but starting 1 element into its buffer: not 16-byte aligned.
    "misaligned": lambda xp, b: xp.concatenate([xp.zeros(1, b.dtype), b.ravel()])[1:].reshape(
        b.shape),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [1, 8, 24])
def test_matmul_operand_layouts(backend, rng, layout, dtype, n):
    x = rng.standard_normal((33, 520)) * (rng.random((33, 520)) < 0.1)
    a = twell.TwELLMatrix(backend.asarray(cast(x, dtype)), tile_width=256, slots=4)
    b = cast(rng.standard_normal((520, n)), dtype)
    out = a @ LAYOUTS[layout](backend.xp, backend.asarray(b))
    check_product(backend, out, reference(a, b), dtype, (33, n))


@pytest.mark.parametrize("dtype, k", [(BF16, 1000), (F16, 3000)], ids=["bf16", "f16"])
def test_16_bit_products_accumulate_in_float32(backend, dtype, k):
    """1000 bf16 ones sum to 1000 (a bf16 accumulator sticks at 256; f16's at 2048)."""
    a = twell.TwELLMatrix(backend.asarray(np.ones((2, k), dtype=dtype)), tile_width=256)
    out = backend.to_host(a @ backend.asarray(np.ones(k, dtype=dtype)))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.astype(np.float64), [k, k])


def test_empty_rows_give_exact_zeros(backend, rng):
    """Rows without entries are written as zeros (the output is not left uninitialised)."""
    x = np.zeros((64, 300))
    x[5, 7] = 2.0
    x[40, 299] = -1.0
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=16)
    for n in (None, 1, 8, 33):
        b = rng.standard_normal(300 if n is None else (300, n))
        backend.poison()
        out = backend.to_host(a @ backend.asarray(b))
        np.testing.assert_array_equal(out, x @ b)  # one product per row: exact


@pytest.mark.parametrize("n", [None, 0, 3])
@pytest.mark.parametrize("m", [0, 4])
def test_matmul_with_no_rows_or_no_output_columns(backend, m, n):
    a = twell.TwELLMatrix(backend.asarray(np.ones((m, 300))))
    b = np.ones(300) if n is None else np.ones((300, n))
    out = backend.to_host(a @ backend.asarray(b))
    np.testing.assert_array_equal(out, np.ones((m, 300)) @ b)


def test_matmul_with_no_columns_matrix(backend):
    a = twell.TwELLMatrix(backend.asarray(np.zeros((4, 0))))
    out = backend.to_host(a @ backend.asarray(np.zeros((0, 3))))
    np.testing.assert_array_equal(out, np.zeros((4, 3)))


def test_matvec_with_no_columns(backend):
    """Regression: A @ v with A (M, 0) and v (0,) raised 'cannot reshape array of size 0 into
    shape (0,newaxis)'; scipy gives zeros(M). Same for v @ A with A (0, K)."""
    a = twell.TwELLMatrix(backend.asarray(np.zeros((3, 0))))
    np.testing.assert_array_equal(backend.to_host(a @ backend.asarray(np.zeros(0))), np.zeros(3))
    np.testing.assert_array_equal(backend.to_host(backend.asarray(np.zeros(0)) @ a.T),
                                  np.zeros(3))


@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.name)
def test_vector_products_keep_their_launch_for_the_same_storage(backend, dtype):
    """``A @ v``, ``A.matvec(v)`` and ``A.dot(v)`` keep the product's launch on the matrix
    (``TwELLMatrix._fast_matvec``: scipy's CSR matrix of the host's compressed rows, the GPU
    SpMV's kernel and arguments): the kept launch gives the general path's bits, a new storage
    (``resize``) drops it, vectors it does not take (strided, another dtype, 2-D) take the
    general path, and a pickle leaves it behind."""
    import pickle

    rng = np.random.default_rng(3)
    x = np.where(rng.random((40, 300)) < 0.05, rng.standard_normal((40, 300)), 0).astype(dtype)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=64, slots=2)
    v = rng.standard_normal(300).astype(dtype)
    want = x.astype(np.float64) @ v.astype(np.float64)
    vd = backend.asarray(v)
    for product in (a.__matmul__, a.matvec, a.dot, a.__matmul__):
        backend.poison()
        assert rel_err(backend.to_host(product(vd)), want) <= MATMUL_RTOL[dtype]
    assert "_spmv" in a.__dict__
    kept = backend.to_host(a @ vd)
    general = backend.to_host((a @ vd.reshape(-1, 1)).ravel())
    np.testing.assert_array_equal(kept, general)
    strided = backend.asarray(np.repeat(v, 2))[::2]
    np.testing.assert_array_equal(backend.to_host(a @ strided), kept)
    other = backend.asarray(v.astype(np.float64 if dtype == F32 else np.float32))
    assert (a @ other).dtype == np.float64
    assert "_spmv" not in pickle.loads(pickle.dumps(a)).__dict__
    a.resize((20, 300))
    assert "_spmv" not in a.__dict__
    assert rel_err(backend.to_host(a @ vd), want[:20]) <= MATMUL_RTOL[dtype]


# -- the host's order of sums ---------------------------------------------------------------

@st.composite
def skewed_rows(draw):
    """float32 matrices whose rows range from empty to full (hub rows among short ones), a
    tile width, and a number of right-hand sides."""
    m = draw(st.integers(1, 40))
    k = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    density = rng.choice([0.0, 0.02, 0.1, 0.5, 1.0], size=(m, 1), p=[0.1, 0.4, 0.3, 0.1, 0.1])
    dense = np.where(rng.random((m, k)) < density, rng.standard_normal((m, k)), 0)
    return (dense.astype(np.float32), draw(st.sampled_from([8, 64, 256])),
            draw(st.sampled_from([1, 2, 5, 40])), rng.standard_normal((k, 40)))


@given(case=skewed_rows(), chunk=st.sampled_from([None, 1, 7, 300]))
@example(case=(np.eye(1, 300, dtype=np.float32) + np.r_[:300].astype(np.float32) % 3, 8, 5,
               np.linspace(-1, 1, 300 * 40).reshape(300, 40)), chunk=7)
@example(case=(np.zeros((3, 5), np.float32), 8, 1, np.ones((5, 40))), chunk=None)
def test_host_products_add_each_rows_terms_in_column_order(case, chunk):
    """On the host, row i of A @ B is 0 + a[i, j0] * B[j0] + a[i, j1] * B[j1] + ... added one
    at a time in column order, in float32: bit for bit what np.add.at over the sorted
    entries gives, whatever the rows' lengths (steps over all rows, running sums for the long
    ones) and however the work is cut into blocks (``chunk`` elements)."""
    dense, tile_width, n, b = case
    b = b[:, :n].astype(np.float32)
    rows, cols = np.nonzero(dense)  # sorted by (row, column)
    want = np.zeros((dense.shape[0], n), dtype=np.float32)
    np.add.at(want, rows, dense[rows, cols][:, None] * b[cols])
    a = twell.TwELLMatrix(dense, tile_width=tile_width, slots=2)
    with pytest.MonkeyPatch.context() as mp:
        if chunk is not None:
            mp.setattr(_numpy_backend, "_SPMM_CHUNK", chunk)
        spec = _numpy_backend.spmm(a._parts, a.shape, tile_width, np.ascontiguousarray(b),
                                   np.dtype(np.float32))
    got = a @ b  # scipy's kernel on the compressed rows: the same order
    for out in (spec, got):
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


# -- NaN and Inf ---------------------------------------------------------------------------

@given(case=cases(values="any", max_rows=24), n=st.sampled_from([None, 1, 4, 9]),
       seed=st.integers(0, 2**32 - 1))
@edge_examples(n=3, seed=0)
def test_nan_and_inf_propagate_like_scipy(backend, case, n, seed):
    """NaN/Inf in A or B reach exactly the outputs they reach in scipy (only stored entries
    multiply B: a NaN in B under an implicit zero of A stays out of the result)."""
    m, k = case.dense.shape
    rng = np.random.default_rng(seed)
    b = rng.uniform(-2, 2, (k,) if n is None else (k, n))
    b.reshape(-1)[rng.random(b.size) < 0.05] = np.nan
    b.reshape(-1)[rng.random(b.size) < 0.05] = np.inf
    a = twell.TwELLMatrix(backend.asarray(case.dense), tile_width=case.tile_width,
                          slots=case.slots)
    with np.errstate(all="ignore"):
        want = sp.csr_array(case.dense) @ b
        out = backend.to_host(a @ backend.asarray(b))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out) & (out > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(out) & (out < 0), np.isinf(want) & (want < 0))
    finite = np.isfinite(want)
    assert rel_err(out[finite], want[finite]) <= 1e-12


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("b_shape", [(3,), (3, 2), (301, 4)])
def test_shape_mismatch_names_both_shapes(backend, b_shape):
    a = twell.TwELLMatrix(backend.asarray(np.ones((5, 300))))
    with pytest.raises(ValueError, match=r"\(5, 300\)") as info:
        a @ backend.asarray(np.ones(b_shape))
    assert str(tuple(b_shape)) in str(info.value)


def test_rmatmul_shape_mismatch_names_the_users_shapes():
    """Regression: the message of ``B @ A`` named the transposed shapes A.shape=(300, 5) and
    other.shape=(3, 2), not the shapes the user wrote."""
    a = twell.TwELLMatrix(np.ones((5, 300)))
    with pytest.raises(ValueError) as info:
        np.ones((2, 3)) @ a
    assert "(2, 3)" in str(info.value) and "(5, 300)" in str(info.value)


def test_rmatmul_shape_mismatch_is_a_value_error(backend):
    a = twell.TwELLMatrix(backend.asarray(np.ones((5, 300))))
    for shape in [(3,), (2, 3)]:
        with pytest.raises(ValueError):
            backend.asarray(np.ones(shape)) @ a


@pytest.mark.parametrize("b", [np.float64(2.0), np.ones((300, 2, 2))], ids=["0-D", "3-D"])
def test_operand_must_be_1d_or_2d(backend, b):
    a = twell.TwELLMatrix(backend.asarray(np.ones((5, 300))))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        a @ backend.asarray(b)


def test_complex_operand_is_a_type_error(backend):
    a = twell.TwELLMatrix(backend.asarray(np.ones((5, 300))))
    with pytest.raises(TypeError, match="complex"):
        a @ backend.asarray(np.ones((300, 2), dtype=np.complex128))


def test_sparse_operands_go_through_csr(backend):
    """sparse @ sparse is scipy's (cupyx's) CSR product, a CSR result."""
    x = np.arange(9.0).reshape(3, 3) * (np.arange(9).reshape(3, 3) % 2)
    a = twell.TwELLMatrix(backend.asarray(x))
    for other in (a, backend.sparse(sp.csr_array(x))):
        got = a @ other
        assert got.format == "csr"
        assert_dense_equal(backend.to_host(got.toarray()), x @ x)


def test_star_is_not_matmul(backend):
    """``*`` is element-wise, as for scipy's sparse arrays."""
    x = np.arange(9.0).reshape(3, 3)
    a = twell.TwELLMatrix(backend.asarray(np.eye(3)))
    got = a * backend.asarray(x)
    assert_dense_equal(backend.to_host(got.toarray()), np.eye(3) * x)


def test_mixing_cupy_matrix_and_numpy_operand_is_a_type_error(gpu):
    a = twell.TwELLMatrix(gpu.asarray(np.eye(3)))
    with pytest.raises(TypeError, match="NumPy"):
        a @ np.ones((3, 2))
    with pytest.raises(TypeError, match="NumPy"):
        a @ np.ones(3)
    with pytest.raises(TypeError, match="NumPy"):
        np.ones((2, 3)) @ a


def test_mixing_numpy_matrix_and_cupy_operand_is_a_type_error(gpu):
    a = twell.TwELLMatrix(np.eye(3))
    with pytest.raises(TypeError, match="NumPy"):
        a @ gpu.asarray(np.ones((3, 2)))
    with pytest.raises(TypeError, match="NumPy"):
        gpu.asarray(np.ones(3)) @ a


def test_python_lists_are_accepted_on_the_host():
    a = twell.TwELLMatrix(np.array([[1.0, 0], [0, 2.0]]))
    np.testing.assert_array_equal(a @ [1.0, 1.0], [1.0, 2.0])


# -- how A @ B runs on a GPU: the entry count known from construction -----------------------


@pytest.mark.parametrize("source", ["dense", "csr"])
def test_auto_slots_construction_knows_the_entry_count(backend, rng, source):
    # The GPU's A @ B chooses between gathering B rows and cuBLAS on A.toarray() from this
    # count, which slots="auto" gets from its per-tile histogram without reading the GPU.
    x = rng.standard_normal((40, 700)) * (rng.random((40, 700)) < 0.05)
    x[3, :300] = 1.0  # overflow
    a = twell.TwELLMatrix(backend.asarray(x if source == "dense" else sp.csr_array(x)))
    assert a.overflow_nnz > 0
    assert a._nnz_hint == a.nnz == np.count_nonzero(x)
    # With the slots given, a dense pack counts the entries in the read it makes anyway, and
    # a canonical CSR input is as long as its count.
    given = twell.TwELLMatrix(backend.asarray(x if source == "dense" else sp.csr_array(x)),
                              slots=4)
    assert given._nnz_hint == given.nnz == np.count_nonzero(x)
    assert a.T._nnz_hint == a.nnz
    assert a.copy()._nnz_hint == a.nnz
    assert twell.TwELLMatrix(a, slots=3)._nnz_hint == a.nnz  # a repack counts its CSR
    # A cast that turns entries into zeros drops them, and the count follows.
    tiny = a * 1e-45  # float32 subnormals: entries below ~0.7 in magnitude round to 0
    assert tiny.astype(np.float32)._nnz_hint == tiny.astype(np.float32).nnz < a.nnz


def test_matmul_to_twell_knows_the_entry_count(backend, rng):
    # slots="auto" counts every (row, tile) pair, and with the slots given the pack's one
    # read carries the histogram of the per-tile totals: the entry count is exact both ways.
    x = backend.asarray(rng.standard_normal((300, 64)).astype(np.float32))
    w = backend.asarray(rng.standard_normal((500, 64)).astype(np.float32))
    a = twell.matmul_to_twell(x, w)
    assert a._nnz_hint == a.nnz > 0
    given = twell.matmul_to_twell(x, w, slots=8)
    assert given._nnz_hint == given.nnz == a.nnz
    xx = backend.asarray(rng.standard_normal((3000, 64)).astype(np.float32))
    big = twell.matmul_to_twell(xx, w)
    assert big._nnz_hint == big.nnz > 0


@pytest.mark.parametrize(("sparsity", "itemsize", "nnz_known", "dense"), [
    (0.99, 2, True, False),    # the paper's down projection at 99%: gather (0.54 vs 0.55 ms)
    (0.95, 2, True, True),     # at 95%: 2.15 ms gathering, 0.55 densified (H200)
    (0.95, 2, False, False),   # entry count unknown (slots given): gather, no sync
    (0.95, 4, True, False),    # float32 at 95%: 4.6 ms gathering, 7.5 for cuBLAS alone (H100)
    (0.90, 4, True, True),     # float32 at 90%: 8.8-9.0 ms gathering (H100), 7.8 (H200)
    (0.80, 4, True, True),
])
def test_dense_product_choice_on_the_measured_shape(sparsity, itemsize, nnz_known, dense):
    from twell._cuda import _policy

    m, k, n = 16384, 5632, 2048
    nnz = round((1 - sparsity) * m * k) if nnz_known else None
    assert _policy.dense_product_pays(m, k, n, itemsize, nnz) is dense
    # A product too small for cuBLAS to pay back the densification always gathers.
    assert not _policy.dense_product_pays(64, 64, 64, itemsize, 64 * 64)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_narrow_products_need_a_denser_matrix_to_densify(itemsize):
    # The densification costs M * K whatever N is: the fewer the columns of B, the denser A
    # must be, and a matrix-vector product (A.sum(axis=1) included) never densifies.
    from twell._cuda import _policy

    densities = [_policy.dense_product_density(n, itemsize) for n in (1, 16, 256, 2048, 8192)]
    assert densities == sorted(densities, reverse=True)
    assert densities[0] > 1
    m = k = 1 << 17
    assert not _policy.dense_product_pays(m, k, 1, itemsize, m * k)  # full, and still not
    assert _policy.dense_product_pays(m, k, 2048, itemsize, m * k)
