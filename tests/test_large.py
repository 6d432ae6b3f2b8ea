"""Large sizes on the GPU: more than 2**31 stored slots and more than 2**31 non-zeros.

Issue 6: every index that grows with M * n_tiles * slots or nnz is 64-bit in the kernels
(see the note at the top of cuda_src/twell_layout.cuh) and in the launchers. These tests
build a matrix past 2**31 slots directly from storage arrays (no dense copy), then check
entries through CSR, nnz, validate() and SpMV against a float64 reference computed block
by block. Values are multiples of 1/4 and every partial sum stays below 2**20, so the
float32 results are exact. GPU only; skipped, with the reason, without the memory.
"""

import numpy as np
import pytest
from helpers import GPU_SKIP_REASON

import twell

# "slow" marks the tests on the 2**31-slot matrix: leave them out of the sanitizer run
# (scripts/sanitize.sh -m "not slow"), where they would take hours.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not twell.cuda_available(), reason=GPU_SKIP_REASON)]

# 2**17 + 2**13 rows x 64 tiles of 256 columns x 256 slots: 2.28e9 stored slots (> 2**31);
# counts 254..256 give about 2.27e9 non-zeros (> 2**31).
M, T, N_TILES, S = 2**17 + 2**13, 256, 64, 256
K = T * N_TILES
CHUNK = 4096  # rows per block of the construction and of the reference

# Storage (float32 data, uint16 indices: 6 bytes a slot, 13.7 GB), the CSR of the whole
# matrix (8 bytes an entry, 18.2 GB), validation temporaries (a few bools a slot) and slack.
NEEDED_BYTES = 48 * 2**30


def _counts(xp, rows):
    t = xp.arange(N_TILES)
    return (S - (rows[:, None] + t[None, :]) % 3).astype(np.int32)


def _values(xp, rows):
    """Value of slot s of (row, tile) t: ((row + 3t + 5s) % 7 + 1) / 4 where used, else 0."""
    t = xp.arange(N_TILES)[None, :, None]
    s = xp.arange(S)[None, None, :]
    v = ((rows[:, None, None] + 3 * t + 5 * s) % 7 + 1).astype(np.float32) / 4
    return xp.where(s < _counts(xp, rows)[..., None], v, np.float32(0))


@pytest.fixture(scope="module")
def big():
    import cupy

    free, _ = cupy.cuda.Device().mem_info
    limit = cupy.get_default_memory_pool().get_limit()  # 0: none (CUPY_GPU_MEMORY_LIMIT)
    if limit:
        free = min(free, limit)
    if free < NEEDED_BYTES:
        pytest.skip(f"needs {NEEDED_BYTES / 2**30:.0f} GiB of free GPU memory; "
                    f"{free / 2**30:.1f} GiB free to this process")
    counts = cupy.empty((M, N_TILES), dtype=np.int32)
    data = cupy.empty((M, N_TILES, S), dtype=np.float32)
    indices = cupy.empty((M, N_TILES, S), dtype=np.uint16)
    s = cupy.arange(S, dtype=np.uint16)
    for r0 in range(0, M, CHUNK):
        rows = cupy.arange(r0, min(r0 + CHUNK, M))
        c = _counts(cupy, rows)
        counts[r0:r0 + rows.size] = c
        data[r0:r0 + rows.size] = _values(cupy, rows)
        # Slot s holds column s of its tile: sorted, and zero after the count.
        indices[r0:r0 + rows.size] = cupy.where(s[None, None, :] < c[..., None], s, 0)
    parts = (counts, data, indices, cupy.zeros(M + 1, dtype=np.int64),
             cupy.zeros(0, dtype=np.int32), cupy.zeros(0, dtype=np.float32))
    a = twell.TwELLMatrix(parts, shape=(M, K), tile_width=T)  # validates
    return a


@pytest.mark.slow
def test_the_matrix_is_past_2_31_slots_and_entries(big):
    assert big.data.size == M * N_TILES * S > 2**31
    want = int(_counts(np, np.arange(M, dtype=np.int64)).sum(dtype=np.int64))
    assert big.nnz == want > 2**31


@pytest.mark.slow
def test_csr_rows_far_into_the_matrix(big):
    import cupy

    indptr, indices, data = big._csr_arrays()
    assert indptr.dtype == np.int64 and int(indptr[-1]) == big.nnz
    for r in (0, 1, M // 2, M - 2, M - 1):
        lo, hi = int(indptr[r]), int(indptr[r + 1])
        row = cupy.zeros(K, dtype=np.float32)
        row[indices[lo:hi]] = data[lo:hi]
        want = _values(np, np.array([r])).reshape(-1)  # (tile, slot) = column t*256 + s
        np.testing.assert_array_equal(row.get(), want)
    del indptr, indices, data


@pytest.mark.slow
def test_a_few_entries(big):
    for r, t, s in [(0, 0, 0), (M - 1, N_TILES - 1, 253), (M // 3, 17, 255), (2**17 + 5, 63, 0)]:
        c = int(_counts(np, np.array([r]))[0, t])
        assert int(big.counts[r, t]) == c
        want = ((r + 3 * t + 5 * s) % 7 + 1) / 4 if s < c else 0.0
        assert float(big.data[r, t, s]) == want
        assert int(big.indices[r, t, s]) == (s if s < c else 0)


@pytest.mark.slow
def test_spmv_against_a_blockwise_float64_reference(big):
    import cupy

    x = (((cupy.arange(K) % 5) + 1) / 4).astype(np.float32)
    y = (big @ x).get()
    xr = x.astype(np.float64).reshape(N_TILES, T)
    for r0 in range(0, M, CHUNK):
        rows = cupy.arange(r0, min(r0 + CHUNK, M))
        # Slot s of tile t holds column t*256 + s (zero past the count).
        want = (_values(cupy, rows).astype(np.float64) * xr[None]).sum(axis=(1, 2))
        np.testing.assert_array_equal(y[r0:r0 + rows.size], want.get().astype(np.float32))


@pytest.mark.slow
def test_validate_at_this_size(big):
    big.validate()


@pytest.mark.slow
def test_cupyx_conversions_refuse_more_than_2_31_entries(big):
    # cupyx.scipy.sparse indexes with int32: past 2**31 - 1 entries it would wrap around.
    with pytest.raises(ValueError, match=r"nnz must be at most 2147483647 .* got nnz="):
        big.tocsr()
    with pytest.raises(ValueError, match=r"nnz must be at most 2147483647"):
        big.tocoo()


def test_wide_and_tall_products_stay_within_the_grid_limits(gpu, monkeypatch, rng):
    # Guards the launcher: twell_spmm_rows has at most 65535 column blocks on grid y; with
    # the limit lowered to 2, products split into column chunks, and the results do not
    # change.
    from twell._cuda import _policy, _spmm

    x = np.where(rng.random((700, 300)) < 0.05, rng.integers(1, 9, (700, 300)) / 4, 0.0)
    for dtype in (np.float32, twell.bfloat16):
        a = twell.TwELLMatrix(gpu.asarray(x.astype(dtype)), tile_width=256, slots=2)
        b = (rng.integers(-4, 5, (300, 200)) / 4).astype(dtype)
        ref = (x.astype(np.float64) @ b.astype(np.float64)).astype(np.float32).astype(dtype)
        def product(a=a, b=b, dtype=dtype):
            return _spmm.spmm(a._parts, a.shape, a.tile_width, gpu.asarray(b),
                              np.dtype(dtype)).get()
        want = product()
        monkeypatch.setattr(_policy, "MAX_GRID_Y", 2)
        got = product()
        monkeypatch.undo()
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
        np.testing.assert_array_equal(got.astype(np.float64), ref.astype(np.float64))
