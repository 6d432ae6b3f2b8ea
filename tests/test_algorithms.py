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


@st.composite
def _csr_triplets(draw):
    """Small CSR arrays as a user might hand them in: rows of columns in any order, with
    duplicates, zeros and (rarely) a column past the last."""
    n_cols = draw(st.integers(1, 8))
    rows = draw(st.lists(st.lists(st.tuples(st.integers(0, n_cols), st.sampled_from(
        [0.0, -0.0, 1.5, -2.0, 3.0])), max_size=6), max_size=6))
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    cols = np.array([c for r in rows for c, _ in r], dtype=np.int32)
    vals = np.array([v for r in rows for _, v in r], dtype=np.float32)
    return indptr, cols, vals, n_cols


@given(_csr_triplets())
def test_is_canonical_csr_agrees_with_scipy(backend, triplet):
    # Canonical: columns in range and strictly increasing within each row (sorted, no
    # duplicates: what scipy calls has_canonical_format), and no value equal to zero. The
    # reference walks the rows in Python; scipy's sum_duplicates must leave such a matrix
    # as it is.
    import scipy.sparse as sp

    indptr, cols, vals, n_cols = triplet
    rows = [cols[indptr[r]:indptr[r + 1]].tolist() for r in range(indptr.size - 1)]
    want = (all(a < b for row in rows for a, b in zip(row[:-1], row[1:], strict=True))
            and bool((cols < n_cols).all()) and bool((vals != 0).all()))
    if want:
        m = sp.csr_array((vals, cols, indptr), shape=(indptr.size - 1, n_cols))
        m.sum_duplicates()
        m.eliminate_zeros()
        np.testing.assert_array_equal(m.indices, cols)
        np.testing.assert_array_equal(m.data, vals)
    got = _algorithms.is_canonical_csr(backend.asarray(indptr), backend.asarray(cols),
                                       backend.asarray(vals), n_cols)
    assert got is want
