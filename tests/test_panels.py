"""The panel plan's SpMV (``twell._cuda._panels``, ``cuda_src/spmv_panels_sm90.cu``) on a
device of compute capability 9.0: ``A @ x`` against scipy.sparse in float64, the same bits
on every run, every row written, and the plan taken only where it pays."""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import BF16, DTYPES, F16, F32, F64, MATMUL_RTOL, assert_same_bits, cast, rel_err
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import twell

pytestmark = pytest.mark.gpu


@pytest.fixture
def hopper(gpu):
    from twell._cuda import _compile, _panels

    if not _compile.arch_supported(_panels.SOURCE):
        pytest.skip("twell_spmv_panels_* need a device of compute capability 9.0")
    return gpu


def scattered(rng, m, k, mean, dtype, hubs=0):
    """CSR (scipy, canonical) of ``m`` rows with Pareto-tailed lengths around ``mean`` and
    uniform columns, ``hubs`` rows of ``k // 4`` entries, values in [-1, 1] of ``dtype``."""
    lengths = np.minimum(k, (rng.pareto(2.0, m) * mean).astype(np.int64))
    lengths[rng.choice(m, size=min(hubs, m), replace=False)] = min(k, max(1, k // 4))
    rows = np.repeat(np.arange(m), lengths)
    cols = rng.integers(0, k, rows.size)
    vals = cast(rng.uniform(-1, 1, rows.size), dtype).astype(np.float64)
    a = sp.csr_matrix((vals, (rows, cols)), shape=(m, k))
    a.sum_duplicates()
    a.data = cast(a.data, dtype).astype(np.float64)  # duplicates summed: rounded again
    a.eliminate_zeros()
    return a


def plan_of(a, dtype, target_ctas=None):
    import cupy

    from twell._cuda import _panels

    return _panels.build(cupy.asarray(a.indptr, dtype=np.int64),
                         cupy.asarray(a.indices, dtype=np.int32),
                         cupy.asarray(cast(a.data, dtype)), a.shape, target_ctas=target_ctas)


def check_product(gpu, plan, a, x, dtype):
    """plan(x) against scipy's float64 product of the same (rounded) values, every row
    written (the pool poisoned first) and the same bits from a second call."""
    gpu.poison()
    y = plan(gpu.asarray(x))
    assert y.dtype == dtype and y.shape == (a.shape[0],)
    want = a @ cast(x, np.float64)
    got = gpu.to_host(y)
    assert rel_err(got, want) <= MATMUL_RTOL[dtype]
    assert_same_bits(got, gpu.to_host(plan(gpu.asarray(x))), "a second product")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 3000), k=st.integers(1, 150_000),
       mean=st.floats(0.5, 40), hubs=st.integers(0, 3), targets=st.sampled_from([None, 8, 24]),
       dtype=st.sampled_from([F64, F32, F16, BF16]))
def test_plan_product_matches_scipy(hopper, seed, m, k, mean, hubs, targets, dtype):
    rng = np.random.default_rng(seed)
    a = scattered(rng, m, k, mean, dtype, hubs)
    plan = plan_of(a, dtype, targets)
    if plan is None:  # a CTA's run of one panel cannot fit a stage
        return
    check_product(hopper, plan, a, cast(rng.uniform(-1, 1, k), dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_plan_of_many_ctas_and_panels(hopper, dtype):
    """Several clusters, panels and waves, a few long rows, empty rows; K not a multiple of
    a 16-byte copy (x padded), and x at an address past a 16-byte boundary."""
    from twell._cuda import _panels

    rng = np.random.default_rng(7)
    k = 3 * _panels.width(dtype) + 3
    a = scattered(rng, 20_000, k, 12.0, dtype, hubs=4)
    keep = np.ones(a.shape[0])
    keep[rng.choice(a.shape[0], 50, replace=False)] = 0
    a = sp.csr_matrix(sp.diags(keep) @ a)
    a.eliminate_zeros()
    plan = plan_of(a, dtype, 64)
    assert plan is not None and plan.n_ctas >= 64 and plan.n_panels == 4
    x = cast(rng.uniform(-1, 1, k), dtype)
    check_product(hopper, plan, a, x, dtype)
    import cupy

    shifted = cupy.empty(k + 1, dtype=dtype)[1:]
    shifted[...] = cupy.asarray(x)
    assert_same_bits(hopper.to_host(plan(shifted)), hopper.to_host(plan(cupy.asarray(x))),
                     "x past a 16-byte boundary")


def test_plan_multiplies_only_entries(hopper):
    """Inf and NaN in x where A has no entry leave y finite (no 0 * Inf in padding or in
    lanes past a warp's entries)."""
    rng = np.random.default_rng(3)
    a = scattered(rng, 4000, 40_000, 6.0, F32)
    x = rng.uniform(-1, 1, a.shape[1]).astype(np.float32)
    untouched = np.setdiff1d(np.arange(a.shape[1]), a.indices)
    x[untouched[::2]] = np.inf
    x[untouched[1::2]] = np.nan
    plan = plan_of(a, F32, 16)
    y = hopper.to_host(plan(hopper.asarray(x)))
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, a @ x.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_plan_keeps_rows_whole_and_bounded(hopper):
    """Every CTA owns at most ROWS rows, every entry sits in its CTA's run of its panel, and
    the runs fit a stage; the words give back the matrix."""
    import cupy

    from twell._cuda import _panels

    rng = np.random.default_rng(11)
    a = scattered(rng, 30_000, 100_000, 10.0, F32, hubs=2)
    plan = plan_of(a, F32, 16)
    row0 = cupy.asnumpy(plan.row0)
    assert row0[0] == 0 and row0[-1] == a.shape[0]
    assert (np.diff(row0) <= _panels.SHAPES[4].rows).all()
    starts = cupy.asnumpy(plan.run_start)
    assert np.diff(starts).max() <= _panels.SHAPES[4].run_cap
    words = cupy.asnumpy(plan.words)
    values = cupy.asnumpy(plan.values)
    bits = _panels.col_bits(F32)
    rows, cols, vals = [], [], []
    for g in range(starts.size - 1):
        cta, panel = divmod(g, plan.n_panels)
        base = starts[g] + _panels.HEADER * g
        n = int(words[base + _panels.WARPS])
        w = words[base + _panels.HEADER:base + _panels.HEADER + n]
        rows.append(row0[cta] + (w >> bits).astype(np.int64))
        cols.append(panel * _panels.width(F32) + (w & ((1 << bits) - 1)).astype(np.int64))
        vals.append(values[starts[g]:starts[g] + n])
    got = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                        shape=a.shape)
    assert (got != a).nnz == 0


def test_matrix_takes_the_plan_only_where_it_pays(hopper, monkeypatch):
    """With the entry floor lowered, A @ x of a scattered matrix runs through a plan, a banded
    one through the one-tile kernel; both match scipy."""
    from twell._cuda import _panels

    monkeypatch.setattr(_panels, "MIN_NNZ", 0)
    rng = np.random.default_rng(5)
    scattered_a = scattered(rng, 5000, 200_000, 8.0, F32)
    banded = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(200_000, 200_000), format="csr")
    for a, planned in ((scattered_a, True), (banded, False)):
        a = a.astype(np.float32)
        m = twell.TwELLMatrix(hopper.sparse(a))
        x = rng.uniform(-1, 1, a.shape[1]).astype(np.float32)
        y = hopper.to_host(m @ hopper.asarray(x))
        assert isinstance(m.__dict__["_spmv"][5], _panels.Plan) is planned
        np.testing.assert_allclose(y, a @ x.astype(np.float64), rtol=1e-5, atol=1e-5)
