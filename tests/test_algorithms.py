"""The backend-neutral building blocks of ``twell._algorithms``, against NumPy references."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from twell import _algorithms


@given(st.lists(st.integers(0, 5), max_size=50))
def test_expand_indptr_gives_each_entry_its_row(backend, row_lengths):
    # The reference is np.repeat: entry e of a CSR structure belongs to row r when
    # indptr[r] <= e < indptr[r + 1]; empty rows (length 0) own no entry.
    lengths = np.array(row_lengths, dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    want = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    got = _algorithms.expand_indptr(backend.asarray(indptr), int(indptr[-1]))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(backend.to_host(got), want)


@given(st.lists(st.integers(0, 30), max_size=60), st.integers(0, 10))
def test_count_sorted_is_bincount_of_sorted_keys(backend, keys, extra):
    # Sorted keys in [0, size), size at least one past the largest key (or 0 for no keys).
    keys = np.sort(np.array(keys, dtype=np.int64))
    size = (int(keys.max()) + 1 if keys.size else 0) + extra
    want = np.bincount(keys, minlength=size)
    got = _algorithms.count_sorted(backend.asarray(keys), size)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(backend.to_host(got), want)


def _pairwise(values):
    """The pairwise sum segment_sums promises, written as a recursion."""
    if len(values) == 0:
        return 0.0
    if len(values) == 1:
        return values[0]
    half = 1 << (len(values) - 1).bit_length() - 1  # the largest power of two below len
    return _pairwise(values[:half]) + _pairwise(values[half:])


@given(st.lists(st.integers(0, 40), max_size=30), st.integers(0, 2**32 - 1))
def test_segment_sums_add_each_segment_pairwise(backend, lengths, seed):
    # Values of every magnitude and sign (and NaN, Inf now and then): the order of the
    # additions shows in the bits, so the reference fixes it (Python floats, no NumPy).
    rng = np.random.default_rng(seed)
    lengths = np.array(lengths, dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.standard_normal(int(indptr[-1])) * 10.0 ** rng.integers(-8, 9, int(indptr[-1]))
    values[rng.random(values.size) < 0.02] = rng.choice([np.nan, np.inf, -np.inf])
    want = [_pairwise(values[a:b].tolist()) for a, b in zip(indptr[:-1], indptr[1:], strict=True)]
    got = _algorithms.segment_sums(backend.asarray(indptr), backend.asarray(values))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(backend.to_host(got), np.array(want, dtype=np.float64))


@given(st.lists(st.integers(0, 9), max_size=40), st.integers(1, 12))
def test_column_sums_add_each_column_in_the_order_of_its_entries(backend, cols, n_cols):
    cols = np.array(cols, dtype=np.int64) % n_cols
    values = np.arange(1.0, cols.size + 1) ** 3 / 7  # the order of additions shows in the bits
    want = [_pairwise(values[cols == c].tolist()) for c in range(n_cols)]
    got = _algorithms.column_sums(backend.asarray(cols), backend.asarray(values), n_cols)
    np.testing.assert_array_equal(backend.to_host(got), np.array(want, dtype=np.float64))


@given(st.lists(st.lists(st.integers(0, 9), max_size=6), max_size=8), st.integers(1, 12))
def test_column_sums_of_csr_ordered_entries_add_in_entry_order(backend, rows, n_cols):
    # With the row pointer of entries in CSR order (the host then orders them by scipy's
    # CSR -> CSC conversion of the matrix itself), each column still sums in entry order.
    cols = np.array([c % n_cols for row in rows for c in row], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int64)
    values = np.arange(1.0, cols.size + 1) ** 3 / 7
    want = [_pairwise(values[cols == c].tolist()) for c in range(n_cols)]
    got = _algorithms.column_sums(backend.asarray(cols), backend.asarray(values), n_cols,
                                  backend.asarray(indptr))
    np.testing.assert_array_equal(backend.to_host(got), np.array(want, dtype=np.float64))


@given(st.lists(st.integers(0, 3000), max_size=6), st.integers(0, 2**32 - 1))
def test_segment_sums_of_long_and_skewed_segments_are_pairwise(backend, lengths, seed):
    # Segments of very different lengths (the host sums them in blocks by power of two),
    # with signed zeros and subnormals among the values: the bits follow the recursion.
    rng = np.random.default_rng(seed)
    lengths = np.array(lengths, dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(indptr[-1])
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    values[rng.random(n) < 0.01] = rng.choice([-0.0, 5e-324, -5e-324, np.inf])
    want = [_pairwise(values[a:b].tolist()) for a, b in zip(indptr[:-1], indptr[1:], strict=True)]
    got = backend.to_host(_algorithms.segment_sums(backend.asarray(indptr),
                                                    backend.asarray(values)))
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float64))
    assert (np.signbit(got) == np.signbit(np.array(want, dtype=np.float64))).all()


def test_a_segment_of_negative_zeros_sums_to_negative_zero(backend):
    # Regression guard for the host's padding (a segment of 3 sums as a block of 4): with
    # +0.0 as the padding, -0.0 + 0.0 would make the sum +0.0.
    indptr = backend.asarray(np.array([0, 1, 4, 4], dtype=np.int64))
    got = backend.to_host(_algorithms.segment_sums(indptr, backend.asarray(np.full(4, -0.0))))
    assert got.tolist() == [0.0, 0.0, 0.0] and np.signbit(got[:2]).all() and not np.signbit(got[2])
