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
