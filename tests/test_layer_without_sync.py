"""The feed-forward layer without a host synchronisation (twell._cuda._ffn): its pack with a
fixed overflow capacity against the exact pack, the rows past the capacity recomputed on the
device, and (with torch) the modules captured in CUDA graphs.

Oracles: the pack that reads its overflow size back (``matmul_pack``), and the layer computed
in float64 NumPy from the 16-bit inputs.
"""

import numpy as np
import pytest
from helpers import BF16, GPU_SKIP_REASON, cast

import twell

if not twell.cuda_available():
    pytest.skip(GPU_SKIP_REASON, allow_module_level=True)
import cupy  # noqa: E402

from twell._cuda import _cublas, _ffn, _policy, _spmm  # noqa: E402

pytestmark = pytest.mark.gpu


def layer_inputs(rng, m, d_model, d_ff, shift, dtype=BF16):
    """x >= 0 and weights of mean ``-shift``: ``relu(x @ w.T)`` keeps about 5% of its entries
    at shift 0.13 (d_model 256), half at 0."""
    x = np.abs(rng.standard_normal((m, d_model)))
    wg = rng.standard_normal((d_ff, d_model)) - shift
    wu = rng.standard_normal((d_ff, d_model)) / 16
    wd = rng.standard_normal((d_model, d_ff)) / 16
    return [cupy.asarray(cast(a, dtype)) for a in (x, wg, wu, wd)]


def dense_layer(x, wg, wu, wd):
    """The layer in float64 from the (16-bit) arrays' values; gated where ``wg`` is given."""
    x, wu, wd = (cast(a.get(), np.float64) for a in (x, wu, wd))
    if wg is None:
        h = np.maximum(x @ wu.T, 0)
    else:
        h = np.maximum(x @ cast(wg.get(), np.float64).T, 0) * (x @ wu.T)
    return h @ wd.T


def rel(got, want):
    return float(np.linalg.norm(cast(got.get(), np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize("slots", [10, 13])
def test_bounded_pack_holds_the_exact_packs_entries(rng, slots):
    # ~13 entries a tile: 10 and 13 slots overflow, within the default capacity.
    x, wg, _, _ = layer_inputs(rng, 300, 256, 1024, 0.13)
    parts, loss = _ffn.matmul_pack_bounded(x, wg, 256, slots)
    want, _ = _ffn.matmul_pack(x, wg, 256, slots)
    n_over = int(want.overflow_indices.size)
    assert n_over > 0 and int(loss.counter.get()[0]) == n_over <= loss.capacity
    assert parts.overflow_indices.size == loss.capacity  # the fixed capacity, not the count
    for name in ("counts", "data", "indices", "overflow_indptr"):
        np.testing.assert_array_equal(getattr(parts, name).get(), getattr(want, name).get(),
                                      err_msg=name)
    np.testing.assert_array_equal(parts.overflow_indices[:n_over].get(),
                                  want.overflow_indices.get())
    np.testing.assert_array_equal(parts.overflow_data[:n_over].get(),
                                  want.overflow_data.get())


@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
@pytest.mark.parametrize("capacity", [1, 700])
def test_rows_past_the_capacity_are_recomputed(rng, monkeypatch, gated, capacity):
    # Half the hidden layer non-zero in one slot a tile: ~40,000 entries past the slots
    # against a capacity of 1 or 700, so that most rows (1) or the later ones (700) lose
    # entries. The layer must still be the dense one, and only the fix-up makes it so.
    monkeypatch.setattr(_policy, "spill_capacity", lambda m, n: capacity)
    x, wg, wu, wd = layer_inputs(rng, 160, 256, 1024, 0.0)
    wg = wg if gated else None
    want = dense_layer(x, wg, wu, wd)
    _, loss = _ffn.matmul_pack_bounded(x, wu if wg is None else wg, 256, 1)
    assert int(loss.counter.get()[0]) > 50 * capacity
    y = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 1)
    assert rel(y, want) <= 2e-2
    again = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 1)
    np.testing.assert_array_equal(again.get().view(np.uint16), y.get().view(np.uint16))
    # w_down as the transposed view of a (d_ff, d_model) array, as the modules keep it.
    view = _ffn.sparse_ffn_without_sync(x, wg, wu, cupy.ascontiguousarray(wd.T).T, 1)
    np.testing.assert_array_equal(view.get().view(np.uint16), y.get().view(np.uint16))
    monkeypatch.setattr(_ffn, "ffn_fixup", lambda *args: None)
    assert rel(_ffn.sparse_ffn_without_sync(x, wg, wu, wd, 1), want) > 0.1


@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
def test_a_layer_past_its_capacity_gives_the_same_bits_at_every_call(rng, monkeypatch, gated):
    # Which pairs find the spill buffer full depends on the order of the fused GEMM's atomic
    # claims, which changes between calls; the fix-up recomputes every row past its slots,
    # whatever lost entries. cuBLAS's down projection (the dense way, no floor on the work)
    # sums in another order than the fix-up, so a row recomputed in one call and not in
    # another would change the bits. The capacity holds about half the overflow, so that
    # about half the pairs past their slots find the buffer full, which half depending on the
    # order of the claims.
    capacity = 2**17
    monkeypatch.setattr(_policy, "spill_capacity", lambda m, n: capacity)
    monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 0)
    monkeypatch.setattr(_policy, "gated_fused", lambda *_: False)
    x, wg, wu, wd = layer_inputs(rng, 512, 256, 1024, 0.0)
    wg = wg if gated else None
    _, loss = _ffn.matmul_pack_bounded(x, wu if wg is None else wg, 256, 1)
    assert 1.5 * capacity < int(loss.counter.get()[0]) < 2.5 * capacity
    first = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 1, nnz_hint=10**9)
    assert rel(first, dense_layer(x, wg, wu, wd)) <= 2e-2
    for _ in range(8):
        again = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 1, nnz_hint=10**9)
        np.testing.assert_array_equal(again.get().view(np.uint16), first.get().view(np.uint16))


@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
@pytest.mark.parametrize("nnz_hint", [None, 10**9])
def test_layer_without_sync_is_the_dense_layer(rng, monkeypatch, gated, nnz_hint):
    # nnz_hint 10**9 (and no floor on the work): the dense ways of the up projection and the
    # down projection (cuBLAS, to_dense), which read the capacity-sized overflow up to its row
    # pointer's end.
    calls = []
    if nnz_hint:
        # The unfused gated layer: the Hopper kernel that fuses the gate and the up projection
        # calls no up projection of its own (nnz_hint None and the recomputed rows' test run
        # it on Hopper).
        monkeypatch.setattr(_policy, "gated_fused", lambda *_: False)
        monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 0)
        up, dense = _ffn._gemm_nt_float32, _spmm.to_dense
        monkeypatch.setattr(_ffn, "_gemm_nt_float32", lambda *a: calls.append("up") or up(*a))
        monkeypatch.setattr(_spmm, "to_dense", lambda *a: calls.append("down") or dense(*a))
    x, wg, wu, wd = layer_inputs(rng, 512, 256, 1024, 0.13)
    wg = wg if gated else None
    y = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 3, nnz_hint=nnz_hint)
    assert calls == ([] if not nnz_hint else ["up", "down"] if gated else ["down"])
    assert y.shape == (512, 256) and y.dtype == x.dtype
    assert rel(y, dense_layer(x, wg, wu, wd)) <= 2e-2
    exact = twell.sparse_ffn(x, wg, wu, wd, gated=gated, slots=3)
    assert rel(y, cast(exact.get(), np.float64)) <= 1e-2


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_a_dense_enough_gated_layer_runs_with_its_hidden_layer_dense(rng, monkeypatch, dtype):
    # Past _policy.dense_hidden_pays's density (the hint; no floor on the work) the gated
    # layer is the gated kernel's dense hidden layer times w_down by cuBLAS: the bits of
    # cuBLAS on the gated pack's matrix, and the float64 layer. Below it, or for an odd
    # hidden size, the hidden layer is packed.
    if _policy.matmul_variant(*layer_inputs(rng, 8, 64, 64, 0.0)[:2]) != "sm90":
        pytest.skip("the dense hidden layer comes from the gated Hopper kernel (sm_90)")
    monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 0)
    ran = []
    dense = _ffn.gated_dense
    monkeypatch.setattr(_ffn, "gated_dense", lambda *a: ran.append(a[0].shape) or dense(*a))
    x, wg, wu, wd = layer_inputs(rng, 300, 256, 1024, 0.13, dtype)
    m, h = 300, 1024
    y = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 3, nnz_hint=m * h // 20)
    assert ran == [(m, 256)]
    packed, _ = _ffn.matmul_pack(x, wg, 256, 3, w_up=wu)
    hidden = twell.TwELLMatrix._from_parts(packed, (m, h), 256).toarray()
    want = _cublas.matmul(hidden, cupy.ascontiguousarray(wd.T))
    np.testing.assert_array_equal(y.get().view(np.uint16), want.get().view(np.uint16))
    assert rel(y, dense_layer(x, wg, wu, wd)) <= 2e-2
    # 0.5% non-zero: the gather beats the GEMM, so the hidden layer is packed.
    sparse = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 3, nnz_hint=m * h // 200)
    assert ran == [(m, 256)] and rel(sparse, dense_layer(x, wg, wu, wd)) <= 2e-2
    # An odd hidden size: the dense epilogue's aligned words do not fit it.
    x, wg, wu, wd = layer_inputs(rng, 300, 256, 1023, 0.13, dtype)
    odd = _ffn.sparse_ffn_without_sync(x, wg, wu, wd, 3, nnz_hint=m * 1023 // 20)
    assert ran == [(m, 256)] and rel(odd, dense_layer(x, wg, wu, wd)) <= 2e-2


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_twells_cublas_gemm_reads_rows_that_lie_apart(rng, dtype):
    # gate_nnz_hint's sample x[::step][:rows] is read in place, its row stride the GEMM's
    # leading dimension: the same bits as the contiguous copy's product, the float64 product's
    # values; a view whose columns are not contiguous is refused, not misread.
    base = cupy.asarray(cast(rng.standard_normal((211, 40)), dtype))
    w = cupy.asarray(cast(rng.standard_normal((24, 40)), dtype))
    for a in (base[::7][:25], base[3::5], base[:1], base[10:90]):
        out = cupy.empty((a.shape[0], 24), dtype=dtype)
        out.view(np.uint16).fill(0xFFFF)  # NaN in both dtypes
        got = _cublas.gemm(a, w, out, trans_b=True)
        want = _cublas.gemm(cupy.ascontiguousarray(a), w,
                            cupy.empty((a.shape[0], 24), dtype=dtype), trans_b=True)
        np.testing.assert_array_equal(got.view(np.uint16).get(), want.view(np.uint16).get())
        exact = cast(a.get(), np.float64) @ cast(w.get(), np.float64).T
        np.testing.assert_allclose(cast(got.get(), np.float64), exact, rtol=2e-2, atol=2e-2)
    for bad in (base[:, ::2], base[:40].T):
        with pytest.raises(ValueError, match="contiguous"):
            _cublas.gemm(bad, w[:, :bad.shape[1]],
                         cupy.empty((bad.shape[0], 24), dtype=dtype), trans_b=True)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["ab", "abT"])
def test_twells_cublas_gemm_is_the_float64_product(rng, dtype, trans_b):
    a = cupy.asarray(cast(rng.standard_normal((70, 48)), dtype))
    b = cupy.asarray(cast(rng.standard_normal((33, 48) if trans_b else (48, 33)), dtype))
    b64 = cast(b.get(), np.float64)
    want = cast(a.get(), np.float64) @ (b64.T if trans_b else b64)
    out = cupy.full((70, 33), np.nan, dtype=np.float32)
    assert _cublas.gemm(a, b, out, trans_b=trans_b) is out
    np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-4)
    if not trans_b:  # rounded once to the inputs' dtype
        got = _cublas.matmul(a, b)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(cast(got.get(), np.float64),
                                      cast(cast(out.get(), np.float64), dtype).astype(
                                          np.float64))
