"""Hostile input: every malformed argument is a precise TypeError or ValueError.

Issue 6 asks that no bad input crash the process, hang, exhaust memory or give a wrong
result. Storage tuples for the TwELLMatrix tuple constructor are broken one invariant at a
time (hypothesis picks the matrix and the place); operands, dtypes and shapes are broken
at every public entry point; huge requested shapes meet the documented limits
(``twell._layout.MAX_ROWS``, ``MAX_COLUMNS``, ``MAX_STORED_SLOTS``) before any allocation.
"""

import io
import os
import re
import tempfile
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import assert_parts_equal, in_child, parts_of, read_matrix_market, run_python
from hypothesis import assume, example, given
from hypothesis import strategies as st
from strategies import (
    ELL_MEMBERS,
    MtxCase,
    byte_orders,
    cases,
    claimed_shape,
    coo_cases,
    csr_cases,
    in_byte_order,
    matrix_market_files,
    member_claims,
    wide_cases,
)

import twell
from twell import _files, _io, _layout

# -- broken storage tuples --------------------------------------------------------------


def _host_parts(case):
    a = twell.TwELLMatrix(case.dense, tile_width=case.tile_width, slots=case.slots)
    return [np.array(p) for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                  a.overflow_indices, a.overflow_data)], a


def _pick(data, mask, label):
    """A (flat) position where ``mask`` holds, drawn by hypothesis; skips when there is none."""
    where = np.flatnonzero(mask)
    assume(where.size > 0)
    return int(where[data.draw(st.integers(0, where.size - 1), label=label)])


def _corrupt(kind, parts, a, data):
    """Break exactly one invariant of host storage arrays, in place; returns the parts."""
    counts, vals, idx, indptr, ocols, ovals = parts
    s, t = a.slots, a.tile_width
    used = np.arange(s) < counts[..., None]
    flat_counts, flat_vals, flat_idx = counts.reshape(-1), vals.reshape(-1, s), idx.reshape(-1, s)
    if kind == "count above slots":
        flat_counts[_pick(data, np.ones(counts.size, bool), "pair")] = s + data.draw(
            st.integers(1, 2**31 - 1 - s), label="excess")
    elif kind == "negative count":
        flat_counts[_pick(data, np.ones(counts.size, bool), "pair")] = -data.draw(
            st.integers(1, 2**31), label="minus")
    elif kind == "column outside the tile":
        p = _pick(data, flat_counts > 0, "pair")
        nt = counts.shape[1]
        extent = min(t, a.shape[1] - (p % nt) * t)
        # The last used slot, so that the columns stay strictly increasing.
        flat_idx[p, flat_counts[p] - 1] = data.draw(st.integers(extent, 65535), label="column")
    elif kind == "duplicate slot columns":
        p = _pick(data, flat_counts >= 2, "pair")
        flat_idx[p, 1] = flat_idx[p, 0]
    elif kind == "unsorted slot columns":
        p = _pick(data, flat_counts >= 2, "pair")
        flat_idx[p, [0, 1]] = flat_idx[p, [1, 0]]
        flat_vals[p, [0, 1]] = flat_vals[p, [1, 0]]
    elif kind == "non-zero padding value":
        p = _pick(data, flat_counts < s, "pair")
        flat_vals[p, flat_counts[p]] = 1.0
    elif kind == "non-zero padding column":
        p = _pick(data, flat_counts < s, "pair")
        flat_idx[p, flat_counts[p]] = data.draw(st.integers(1, 65535), label="column")
    elif kind == "explicit zero in a slot":
        vals[_pick_nd(data, used)] = 0.0
    elif kind == "overflow_indptr does not start at 0":
        indptr[0] = data.draw(st.sampled_from([-1, 1, 2**62]), label="start")
    elif kind == "overflow_indptr decreasing":
        assume(indptr.size >= 3)
        i = data.draw(st.integers(1, indptr.size - 2), label="i")
        indptr[i] = indptr[i + 1] + 1
    elif kind == "overflow_indptr end beyond the entries":
        indptr[-1] += data.draw(st.integers(1, 2**40), label="extra")
    elif kind == "overflow column outside the matrix":
        assume(ocols.size)
        ocols[data.draw(st.integers(0, ocols.size - 1), label="j")] = data.draw(
            st.one_of(st.integers(-2**31, -1), st.integers(a.shape[1], 2**31 - 1)), label="col")
    elif kind == "overflow explicit zero":
        assume(ovals.size)
        ovals[data.draw(st.integers(0, ovals.size - 1), label="j")] = 0.0
    elif kind == "overflow duplicate column":
        same_row = np.diff(np.repeat(np.arange(indptr.size - 1), np.diff(indptr))) == 0
        j = _pick(data, same_row, "j")
        ocols[j + 1] = ocols[j]
    elif kind == "overflow of a tile with free slots":
        assume(ocols.size)
        rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        counts[rows[0], ocols[0] // t] -= 1
        vals[rows[0], ocols[0] // t, counts[rows[0], ocols[0] // t]] = 0
        idx[rows[0], ocols[0] // t, counts[rows[0], ocols[0] // t]] = 0
    else:  # pragma: no cover - a typo in KINDS
        raise AssertionError(kind)
    return parts


def _pick_nd(data, mask):
    where = np.argwhere(mask)
    assume(where.shape[0] > 0)
    return tuple(where[data.draw(st.integers(0, where.shape[0] - 1), label="slot")])


KINDS = ["count above slots", "negative count", "column outside the tile",
         "duplicate slot columns", "unsorted slot columns", "non-zero padding value",
         "non-zero padding column", "explicit zero in a slot",
         "overflow_indptr does not start at 0", "overflow_indptr decreasing",
         "overflow_indptr end beyond the entries", "overflow column outside the matrix",
         "overflow explicit zero", "overflow duplicate column",
         "overflow of a tile with free slots"]


@pytest.mark.parametrize("kind", KINDS)
@given(case=cases(values="finite", tile_widths=(1, 2, 3, 8, 16)), data=st.data())
def test_a_broken_storage_tuple_is_a_value_error(backend, kind, case, data):
    parts, a = _host_parts(case)
    parts = _corrupt(kind, parts, a, data)
    arrays = tuple(backend.asarray(p) for p in parts)
    with pytest.raises(ValueError):
        twell.TwELLMatrix(arrays, shape=a.shape, tile_width=a.tile_width)


def _base(backend):
    x = np.zeros((3, 10))
    x[0, [1, 2, 3, 5]] = [1, 2, 3, 4]
    x[1, [8, 9]] = 5
    x[2, 4] = 6
    a = twell.TwELLMatrix(x, tile_width=4, slots=2)
    parts = [a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices, a.overflow_data]
    return x, [backend.asarray(p) for p in parts]


def _replace(parts, i, value):
    return tuple(value if j == i else p for j, p in enumerate(parts))


def _dtype_cases():
    out = []
    for i, name in enumerate(("counts", "data", "indices", "overflow_indptr",
                              "overflow_indices", "overflow_data")):
        for dt in (np.int64, np.float32, np.complex128, np.uint16, np.int32, np.bool_):
            out.append(pytest.param(i, np.dtype(dt), name, id=f"{name}-{np.dtype(dt)}"))
    return out


@pytest.mark.parametrize(("i", "dtype", "name"), _dtype_cases())
def test_a_storage_array_of_the_wrong_dtype_is_a_type_error_naming_it(backend, i, dtype, name):
    _, parts = _base(backend)
    if parts[i].dtype == dtype:
        pytest.skip("the array's own dtype")
    with pytest.raises(TypeError, match=name):
        twell.TwELLMatrix(_replace(parts, i, parts[i].astype(dtype)), shape=(3, 10),
                          tile_width=4)


@pytest.mark.parametrize("dtype", ["complex128", "object", "<U3", "datetime64[s]",
                                   "timedelta64[s]"])
def test_unsupported_data_dtypes_in_a_tuple(dtype):
    _, parts = _base(Backendless)
    bad = parts[1].astype(dtype)
    with pytest.raises(TypeError, match="data must have a dtype among"):
        twell.TwELLMatrix(_replace(parts, 1, bad), shape=(3, 10), tile_width=4)


class Backendless:
    """The NumPy side of ``_base`` for tests that cannot run on CuPy (object/str arrays)."""

    @staticmethod
    def asarray(x):
        return np.asarray(x)


@pytest.mark.parametrize(("i", "shape", "message"), [
    (0, (9,), "counts must have shape"),
    (0, (3, 2), "counts must have shape"),
    (1, (3, 3, 2, 1), "data must have shape"),
    (1, (3, 6), "data must have shape"),
    (2, (3, 3, 1), "indices must have the shape of data"),
    (3, (5,), "overflow_indptr must have shape"),
    (4, (1, 1), "overflow_indices and overflow_data must be 1-D"),
], ids=["counts 1-D", "counts short", "data 4-D", "data 2-D", "indices short",
        "indptr long", "overflow 2-D"])
def test_a_storage_array_of_the_wrong_shape_is_a_value_error(backend, i, shape, message):
    _, parts = _base(backend)
    bad = backend.xp.zeros(shape, dtype=parts[i].dtype)
    with pytest.raises(ValueError, match=message):
        twell.TwELLMatrix(_replace(parts, i, bad), shape=(3, 10), tile_width=4)


@pytest.mark.parametrize("i", range(3))
def test_a_non_contiguous_storage_array_is_a_value_error(backend, i):
    _, parts = _base(backend)
    a = parts[i]
    wide = backend.xp.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    name = ("counts", "data", "indices")[i]
    with pytest.raises(ValueError, match=f"{name} must be C-contiguous"):
        twell.TwELLMatrix(_replace(parts, i, wide[..., ::2]), shape=(3, 10), tile_width=4)


def test_read_only_storage_arrays_are_used_as_they_are_and_never_written():
    # Guards: the matrix shares the arrays (copy=False), so every operation must leave
    # them alone; read-only arrays are a valid input, not an error.
    x, parts = _base(Backendless)
    for p in parts:
        p.flags.writeable = False
    a = twell.TwELLMatrix(tuple(parts), shape=(3, 10), tile_width=4)
    np.testing.assert_array_equal(a.toarray(), x)
    np.testing.assert_array_equal(a @ np.arange(10.0), x @ np.arange(10.0))
    np.testing.assert_array_equal((a * 2).toarray(), 2 * x)
    np.testing.assert_array_equal(a.T.toarray(), x.T)
    np.testing.assert_array_equal(a.astype(np.float32).toarray(), x.astype(np.float32))
    assert (a.tocsr() != sp.csr_array(x)).nnz == 0
    a.validate()


@pytest.mark.parametrize(("shape", "message"), [
    ((-3, 10), "shape must be non-negative"),
    ((3, -10), "shape must be non-negative"),
    ((3.0, 10), "shape must be a pair of non-negative ints"),
    ((3, 10, 1), "shape must be a pair of non-negative ints"),
    ((2**40, 2**40), r"shape\[0\] \(rows\) must be at most 2147483647"),
    ((2**31, 10), r"shape\[0\] \(rows\) must be at most 2147483647; got shape=\(2147483648"),
    ((3, 2**31), r"shape\[1\] \(columns\) must be at most 2147483647"),
])
def test_a_bad_shape_with_storage_arrays(backend, shape, message):
    _, parts = _base(backend)
    with pytest.raises(ValueError, match=message):
        twell.TwELLMatrix(tuple(parts), shape=shape, tile_width=4)


# -- sparse input whose arrays were changed after construction -------------------------
# scipy and cupyx check a matrix's arrays when it is built; code that writes into them
# afterwards can leave a column past K, a row pointer out of order, ... twell checks them
# again: on the GPU inside its row sort (canonical.cu counts the faults), on the host with
# array passes. Once only a few entries were checked or none: a column past K was an
# unnamed IndexError on the host and went to another row, or past its row's width, on the
# GPU.


def _break_csr(kind, x, data):
    """Break one structural rule of CSR matrix ``x`` in place (NumPy or CuPy arrays); the
    message the error must match."""
    m, k = x.shape
    nnz = int(x.indptr[-1])
    if kind in ("column past K", "negative column"):
        assume(nnz > 0)
        j = data.draw(st.integers(0, nnz - 1), label="j")
        v = (data.draw(st.integers(k, 2**31 - 1), label="col") if kind == "column past K"
             else data.draw(st.integers(-2**31, -1), label="col"))
        x.indices[j] = v
        return rf"x\.indices must be in \[0, K={k}\) \(x\.shape\[1\]\); got x\.indices\[{j}\]={v}$"
    if kind == "indptr[0] is not 0":
        v = data.draw(st.sampled_from([-1, 1, nnz + 1]), label="start")
        x.indptr[0] = v
        return rf"x\.indptr\[0\] must be 0; got x\.indptr\[0\]={v}$"
    if kind == "indptr decreases":
        assume(m >= 2)
        i = data.draw(st.integers(1, m - 1), label="i")
        x.indptr[i] = int(x.indptr[i + 1]) + 1
        assume(int(x.indptr[-1]) <= x.indices.size)
        return r"x\.indptr must never decrease; got x\.indptr\[\d+\]=\d+ after"
    if kind == "indptr[-1] past the entries":
        assume(m > 0)  # else indptr[-1] is indptr[0], whose own rule is checked first
        x.indptr[-1] = x.indices.size + data.draw(st.integers(1, 2**31 - 1 - x.indices.size),
                                                  label="extra")
        return rf"x\.indptr\[-1\] must be at most len\(x\.indices\) = {x.indices.size}"
    raise AssertionError(kind)  # pragma: no cover - a typo in CSR_FAULTS


CSR_FAULTS = ["column past K", "negative column", "indptr[0] is not 0", "indptr decreases",
              "indptr[-1] past the entries"]


@pytest.mark.parametrize("kind", CSR_FAULTS)
@given(case=csr_cases(max_rows=40), data=st.data())
def test_a_csr_input_broken_after_construction_is_a_value_error_naming_it(backend, kind, case,
                                                                          data):
    csr, t, s = case
    x = backend.sparse(csr.copy())
    message = _break_csr(kind, x, data)
    with pytest.raises(ValueError, match=message):
        twell.TwELLMatrix(x, tile_width=t, slots=s)
    with pytest.raises(ValueError, match=message):
        twell.ELLMatrix(x)


@pytest.mark.parametrize("which", ["row", "col"])
@given(case=coo_cases(), data=st.data())
def test_a_coo_input_broken_after_construction_is_a_value_error_naming_it(backend, which, case,
                                                                          data):
    assume(case.vals.size > 0)
    x = backend.sparse(sp.coo_array((case.vals, (case.rows, case.cols)), shape=case.shape))
    limit = case.shape[0] if which == "row" else case.shape[1]
    j = data.draw(st.integers(0, case.vals.size - 1), label="j")
    v = data.draw(st.one_of(st.integers(-2**31, -1), st.integers(limit, 2**31 - 1)), label="v")
    getattr(x, which)[j] = v
    bound = "M" if which == "row" else "K"
    with pytest.raises(ValueError, match=rf"x\.{which} must be in \[0, {bound}={limit}\) "
                                         rf".*; got x\.{which}\[{j}\]={v}$"):
        twell.TwELLMatrix(x, tile_width=case.tile_width)


def test_a_bad_column_in_a_row_too_long_for_the_gpu_row_sort_is_named(gpu):
    # Rows longer than CSR_SORT_MAX_ROW and out of order leave the GPU's row sort for the
    # global sort, unchecked by the kernel: the launcher checks them on the host's terms.
    from twell._cuda._canonical import CSR_SORT_MAX_ROW

    n = CSR_SORT_MAX_ROW + 100
    k = 2 * n
    cols = np.arange(n, dtype=np.int32)[::-1] * 2
    x = gpu.sparse(sp.csr_array((np.full(n, 1.5), cols, [0, n]), shape=(1, k)))
    x.indices[7] = k
    with pytest.raises(ValueError, match=rf"got x\.indices\[7\]={k}$"):
        twell.TwELLMatrix(x)


# -- huge requested shapes ---------------------------------------------------------------


@pytest.mark.parametrize(("shape", "tile_width", "slots"), [
    ((2**31 - 1, 2**31 - 1), 1, 1),
    ((2**31 - 1, 2**31 - 1), 256, "auto"),
    ((2**20, 2**31 - 1), 256, 1),
    ((2**21, 2**16), 2**16, 2**13),
], ids=["max x max, T=1", "max x max, T=256", "2^20 x max", "slots push it over"])
def test_a_huge_empty_sparse_matrix_is_refused_before_any_allocation(shape, tile_width, slots):
    # Guards: these used to allocate (M, n_tiles) arrays (MemoryError or an OOM kill).
    with pytest.raises(ValueError, match=r"M \* n_tiles \* slots \(stored slots\) must be at "
                                         rf"most {_layout.MAX_STORED_SLOTS}; got {shape[0]} \*"):
        twell.TwELLMatrix(sp.coo_array(shape), tile_width=tile_width, slots=slots)


def test_the_storage_message_names_parameters_limit_and_value():
    with pytest.raises(ValueError) as info:
        twell.TwELLMatrix(sp.coo_array((2**20, 2**20)), tile_width=1, slots=1)
    msg = str(info.value)
    for part in ("M * n_tiles * slots", str(_layout.MAX_STORED_SLOTS), "1048576 * 1048576 * 1",
                 "= 1099511627776", "tile_width=1", "slots=1"):
        assert part in msg


def test_an_empty_matrix_with_many_tiles_validates_without_per_tile_memory():
    # Regression: validate() built an int64 array of n_tiles elements, 16 GiB for
    # (0, 2**31 - 1) with tile_width=1 (MemoryError), although the matrix stores nothing.
    a = twell.TwELLMatrix(sp.csr_array((0, 2**31 - 1)), tile_width=1, slots=1)
    a.validate()
    # The storage (a row pointer of one int64), and the host's compressed rows (one int32)
    assert a.nnz == 0 and a.nbytes == 8 + 4
    b = twell.TwELLMatrix((a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices,
                           a.overflow_data), shape=(0, 2**31 - 1), tile_width=1)
    assert b.shape == (0, 2**31 - 1) and b.nnz == 0
    np.testing.assert_array_equal(b @ np.ones((2**31 - 1, 0)), np.zeros((0, 0)))


def test_a_huge_dense_like_request_is_refused():
    with pytest.raises(ValueError, match=r"x.shape\[0\] \(rows\) must be at most"):
        twell.TwELLMatrix(sp.coo_array((2**31, 4)))
    with pytest.raises(ValueError, match=r"x.shape\[1\] \(columns\) must be at most"):
        twell.ELLMatrix(sp.coo_array((4, 2**31)))


def _file(fields):
    f = io.BytesIO()
    np.savez(f, **fields)
    f.seek(0)
    return f


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**31, 10), (10, 2**31)])
def test_a_file_claiming_a_huge_shape_is_a_value_error(shape):
    x = np.zeros((2, 10), dtype=np.float32)
    x[0, 1] = 1
    fields = _io._fields(twell.TwELLMatrix(x, tile_width=4, slots=2))
    fields["shape"] = np.array(shape, dtype=np.int64)
    with pytest.raises(ValueError, match=r"invalid twell file: .*must be at most 2147483647"):
        twell.load(_file(fields))


def test_a_file_claiming_many_tiles_is_a_value_error_without_allocating():
    x = np.zeros((2, 10), dtype=np.float32)
    x[0, 1] = 1
    fields = _io._fields(twell.TwELLMatrix(x, tile_width=4, slots=2))
    fields["shape"] = np.array([2, 2**31 - 1], dtype=np.int64)
    fields["tile_width"] = np.array(1)
    with pytest.raises(ValueError, match=r"invalid twell file: .*counts must have shape"):
        twell.load(_file(fields))


# -- operands -------------------------------------------------------------------------------


@pytest.mark.parametrize("other_shape", [(3,), (11,), (3, 2), (9, 4), (10, 2, 1), ()],
                         ids=str)
def test_mismatched_matmul_shapes(backend, other_shape):
    x, parts = _base(backend)
    a = twell.TwELLMatrix(tuple(parts), shape=(3, 10), tile_width=4)
    with pytest.raises(ValueError, match="dimension mismatch|other must be 1-D or 2-D"):
        a @ backend.xp.ones(other_shape)
    if other_shape not in ((3,), ()):
        with pytest.raises(ValueError, match="dimension mismatch|other must be 1-D or 2-D"):
            backend.xp.ones(other_shape) @ a


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "object", "<U2", "datetime64[s]",
                                   "timedelta64[s]", "V8"])
def test_unsupported_dtypes_everywhere(dtype):
    x, parts = _base(Backendless)
    a = twell.TwELLMatrix(tuple(parts), shape=(3, 10), tile_width=4)
    arr = np.zeros((3, 10), dtype=dtype)
    with pytest.raises(TypeError):
        a @ np.zeros(10, dtype=dtype)
    with pytest.raises(TypeError):
        np.zeros((2, 3), dtype=dtype) @ a
    with pytest.raises(TypeError):
        twell.TwELLMatrix(arr)
    with pytest.raises(TypeError):
        twell.ELLMatrix(arr)
    with pytest.raises(TypeError):
        a.astype(dtype)
    with pytest.raises(TypeError):
        twell.TwELLMatrix(x, dtype=dtype)


def test_complex_sparse_input_is_a_type_error(backend):
    x = sp.csr_array(np.eye(3, dtype=np.complex128))
    with pytest.raises(TypeError, match="x.dtype must be one of"):
        twell.TwELLMatrix(x)


def test_mixed_numpy_and_cupy_storage_arrays(gpu):
    _, host = _base(Backendless)
    for i in range(6):
        parts = tuple(gpu.asarray(p) if j == i else p for j, p in enumerate(host))
        with pytest.raises(TypeError):
            twell.TwELLMatrix(parts, shape=(3, 10), tile_width=4)


def test_mixed_numpy_and_cupy_operands(gpu):
    x, host = _base(Backendless)
    a_host = twell.TwELLMatrix(tuple(host), shape=(3, 10), tile_width=4)
    a_dev = twell.TwELLMatrix(gpu.asarray(x), tile_width=4, slots=2)
    with pytest.raises(TypeError):
        a_host @ gpu.xp.ones(10)
    with pytest.raises(TypeError):
        a_dev @ np.ones(10)
    with pytest.raises(TypeError):
        gpu.xp.ones(3) @ a_host
    with pytest.raises(TypeError):
        np.ones(3) @ a_dev


def test_range_errors_name_the_position_and_the_value(backend):
    # Every message names the parameter, the limit and the value that was given.
    _, parts = _base(backend)
    counts = parts[0].copy()
    counts[2, 1] = 7
    with pytest.raises(ValueError, match=r"counts must be between 0 and slots=2; "
                                         r"got counts\[2, 1\]=7"):
        twell.TwELLMatrix(_replace(parts, 0, counts), shape=(3, 10), tile_width=4)
    cols = parts[4].copy()
    cols[0] = -4
    with pytest.raises(ValueError, match=r"overflow_indices must be in \[0, K=10\); "
                                         r"got overflow_indices\[0\]=-4"):
        twell.TwELLMatrix(_replace(parts, 4, cols), shape=(3, 10), tile_width=4)


# -- Matrix Market files -------------------------------------------------------------------
# scipy.io.mmread (scipy 1.17) ends the process on some malformed files (a NUL byte, a dense
# array of zero rows holding a value; any error when handed an open file object), reads
# others silently wrong ("1.5abc" as 1.5, "0x10" as 0, "1e" as 1) and allocates what the
# size line declares before reading a line. twell checks the file before scipy reads it.


def _read_mtx(text):
    """``twell._files.read`` of ``text`` as a .mtx file, in a forked child (a crash fails
    the test instead of ending the run)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.mtx")
        with open(path, "wb") as f:
            f.write(text)

        def read():
            x, _ = _files.read(path)
            coo = sp.coo_array(x)
            return x.shape, coo.row, coo.col, coo.data.astype(np.float64)

        return path, in_child(read)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to survive a crash")
@given(case=matrix_market_files())
@example(case=MtxCase(b"x\nyy\nzz\n", True, "the issue's file"))
@example(case=MtxCase(b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1.5\x00\n",
                      True, "NUL after a value"))
@example(case=MtxCase(b"%%MatrixMarket matrix array real general\n0 5\n1\n", True,
                      "a value in an array of zero rows"))
@example(case=MtxCase(b"%%MatrixMarket matrix array real general\n0 5\n", False,
                      "an array of zero rows"))
@example(case=MtxCase(b"%%MatrixMarket matrix coordinate real general\n3 3 1000000000000\n",
                      True, "declares 10**12 entries"))
@example(case=MtxCase(b"%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n"
                      b"1 1 1.5\n", True, "skew-symmetric with a diagonal entry"))
def test_a_matrix_market_file_is_read_exactly_or_refused_by_name(case):
    """Whatever the bytes: no crash, no other exception than a ValueError that starts with
    the file's name; what is read equals a line-by-line reading of the format, and every
    file that reading accepts is read."""
    path, (how, result) = _read_mtx(case.text)
    assert how != "died", f"the reader ended the process (status {result}) on {case}"
    try:
        shape, want = read_matrix_market(case.text)
    except ValueError:
        want = None
    if how == "raised":
        assert isinstance(result, ValueError), f"{type(result).__name__}: {result} on {case}"
        assert str(result).startswith(f"{path}: "), result
        assert want is None, f"refused a valid file ({result}): {case}"
        return
    assert want is not None, f"read a broken file: {case}"
    got_shape, rows, cols, vals = result
    assert got_shape == shape
    got = {}
    for r, c, v in zip(rows.tolist(), cols.tolist(), vals.tolist(), strict=True):
        got[r, c] = got.get((r, c), 0.0) + v
    keys = set(got) | set(want)
    g = np.array([got.get(key, 0.0) for key in keys])
    w = np.array([want.get(key, 0.0) for key in keys])
    np.testing.assert_allclose(g, w, rtol=1e-12, equal_nan=True, err_msg=str(case))


# -- decompression-size limits: a member's .npy header against the file's own fields --------
# twell.load decompressed every member before checking its shape: a 2.1 MB file whose
# counts member held 2 GiB of zeros (its shape field says 3 x 10) took 2.1 GB. It now reads
# each member's header first and checks shape, dtype and size against what the fields imply.


def _npy_header(shape, dtype):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(shape)})
    return buf.getvalue()


def _twell_file(fields, member=None, shape=None, payload=None, compresslevel=1):
    """A compressed twell file of ``fields``; ``member`` (if given) rewritten with an .npy
    header claiming ``shape`` and ``payload`` bytes of zeros (None: what the header
    describes), streamed, so that a member of gigabytes costs no memory to write."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, compresslevel=compresslevel) as z:
        for name, value in fields.items():
            if name != member:
                buf = io.BytesIO()
                np.save(buf, value, allow_pickle=False)
                z.writestr(f"{name}.npy", buf.getvalue())
                continue
            dtype = value.dtype
            size = payload if payload is not None else int(np.prod(shape)) * dtype.itemsize
            with z.open(f"{name}.npy", "w", force_zip64=True) as out:
                out.write(_npy_header(shape, dtype))
                chunk = bytes(min(size, 1 << 20))
                for start in range(0, size, len(chunk) or 1):
                    out.write(chunk[:size - start])
    f.seek(0)
    return f


def _small_twell():
    x = np.zeros((3, 10), dtype=np.float32)
    x[0, [0, 1, 3]] = [1, 2, 3]  # the first tile overflows with 2 slots
    x[2, 9] = 4
    return twell.TwELLMatrix(x, tile_width=4, slots=2)


def _load_peak(f):
    """``twell.load(f)`` and the peak of memory traced meanwhile (NumPy reports its
    allocations to tracemalloc), in bytes: ``(result or exception, peak)``."""
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            result = twell.load(f)
        except ValueError as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def counts_bomb():
    """The issue's file, smaller: a counts member of 256 MiB of zeros (a 1 MB file), its
    header claiming (2**26, 1) where the shape field (3, 10) and tile width 4 imply
    (3, 3)."""
    fields = _io._fields(_small_twell())
    return _twell_file(fields, "counts", (2**26, 1)).getvalue()


def test_a_member_claiming_a_huge_shape_is_refused_before_it_is_read(counts_bomb):
    assert len(counts_bomb) < 2**21
    result, peak = _load_peak(io.BytesIO(counts_bomb))
    assert isinstance(result, ValueError)
    assert re.search(r"invalid twell file: counts must have shape \(M, n_tiles\) = "
                     r"\(3, 3\); got \(67108864, 1\)", str(result)), result
    assert peak < 2**23, f"{peak / 2**20:.0f} MiB traced"  # not the 256 MiB it claims


def test_twell_info_on_the_bomb_is_one_line_without_the_memory(counts_bomb, tmp_path):
    from twell import _cli

    path = tmp_path / "bomb.twell"
    path.write_bytes(counts_bomb)
    import contextlib
    import tracemalloc

    err = io.StringIO()
    tracemalloc.start()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = _cli.main(["info", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 1 and err.getvalue().count("\n") == 1
    assert f"{path}: invalid twell file: counts must have shape" in err.getvalue()
    assert peak < 2**23, f"{peak / 2**20:.0f} MiB traced"


@pytest.mark.parametrize(("member", "shape", "message"), [
    ("data", (3, 3, 2**24), r"data must have between 1 and tile_width=4 slots; got "
                            r"shape \(3, 3, 16777216\)"),
    ("overflow_indices", (2**24,), r"overflow_indices holds 16777216 entries; the "
                                   r"counts leave room for at most 2 overflow entries"),
    ("overflow_data", (2**24,), r"overflow_data must have shape \(1,\) like "
                                r"overflow_indices; got \(16777216,\)"),
    ("overflow_indptr", (2**24,), r"overflow_indptr must have shape \(M \+ 1,\) = "
                                  r"\(4,\); got \(16777216,\)"),
    ("indices", (3, 3, 2**20), r"indices must have the shape of data \(3, 3, 2\); got "
                               r"\(3, 3, 1048576\)"),
], ids=["slots", "overflow length", "overflow data", "overflow indptr", "indices"])
def test_every_member_is_checked_against_the_fields_before_it_is_read(member, shape, message):
    f = _twell_file(_io._fields(_small_twell()), member, shape)
    result, peak = _load_peak(f)
    assert isinstance(result, ValueError) and re.search(message, str(result)), result
    assert peak < 2**23, f"{peak / 2**20:.0f} MiB traced"


def test_an_ell_member_wider_than_the_matrix_is_refused_before_it_is_read():
    e = twell.ELLMatrix(np.array([[0.0, 2.0, 0.0, 3.0], [1.0, 0.0, 0.0, 0.0]]))
    f = _twell_file(_io._fields(e), "data", (2, 2**24))
    result, peak = _load_peak(f)
    assert isinstance(result, ValueError), result
    assert re.search(r"data must have shape \(M, width\) with M = 2 and width at most "
                     r"K = 4; got \(2, 16777216\)", str(result)), result
    assert peak < 2**23


def test_bytes_past_what_a_header_describes_are_refused():
    # Before, numpy read what the header describes and ignored the rest, whose CRC-32 was
    # then never checked: trailing bytes of any content loaded silently.
    fields = _io._fields(_small_twell())
    f = _twell_file(fields, "counts", (3, 3), payload=36 + 4096)
    with pytest.raises(ValueError, match=r"invalid twell file: field 'counts': the member holds "
                                         r"\d+ bytes; its .npy header describes \d+"):
        twell.load(f)


@given(case=cases(values="finite", max_rows=8, max_cols=40, tile_widths=(1, 3, 8)),
       claim=member_claims())
def test_a_member_claiming_another_size_is_refused_or_changes_nothing(case, claim):
    """Whatever one member's header claims: a ValueError naming the field, or (zeros of the
    true shape) a ValueError or a valid matrix; memory stays near the file's size."""
    a = twell.TwELLMatrix(case.dense, tile_width=case.tile_width, slots=case.slots)
    fields = _io._fields(a)
    true = fields[claim.member].shape
    shape = claimed_shape(true, claim)
    described = int(np.prod(shape)) * fields[claim.member].dtype.itemsize
    payload = claim.payload if claim.payload is not None or described <= 2**22 else 0
    f = _twell_file(fields, claim.member, shape, payload)
    size = len(f.getvalue())
    result, peak = _load_peak(f)
    honest = shape == true and payload in (None, described)  # zeros of the true shape
    if isinstance(result, ValueError):
        # Zeros in place of a member's values may break an invariant of another field.
        wanted = "invalid twell file: " if honest else f"invalid twell file: .*{claim.member}"
        assert re.search(wanted, str(result)), result
    else:  # zeros of the true size in place of a member: possibly another valid matrix
        assert honest, claim
        result.validate()
    assert peak < 8 * size + 2 * a.nbytes + 2**20, f"{peak} bytes traced, file {size}"


@given(width=st.sampled_from([3, 2**20, 2**40]), payload=st.sampled_from([None, 0, 99]))
def test_an_ell_member_claiming_another_width_is_refused(width, payload):
    e = twell.ELLMatrix(np.array([[0.0, 2.0, 0.0, 3.0], [1.0, 0.0, 0.0, 0.0]]))
    fields = _io._fields(e)
    if payload is None and width > 2**20:
        payload = 0
    for member in ELL_MEMBERS:
        result, peak = _load_peak(_twell_file(fields, member, (2, width), payload))
        assert isinstance(result, ValueError) and member in str(result), result
        assert peak < 2**22


# -- reductions over huge dimensions ----------------------------------------------------
# A.sum(axis=1) was A @ ones(K): a 1 x (2**31 - 1) matrix of one entry (128 KiB of storage at
# tile width 65536) asked for a 16 GiB vector. Reductions take memory in proportion to the
# result, the entries and the storage, never to K or M alone where the result needs neither.


def _traced(fn):
    """``fn()`` and the peak of memory traced meanwhile (tracemalloc; NumPy reports its
    allocations), in bytes."""
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_row_sums_of_one_row_of_2_31_columns_take_no_column_sized_memory():
    # The case, in a child process whose address space is capped at 4 GiB: the 16
    # GiB vector of ones was a MemoryError there (and an OOM kill without the cap).
    out = run_python("""
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import numpy as np, scipy.sparse as sp, twell
k = 2**31 - 1
a = twell.TwELLMatrix(sp.csr_array((np.array([2.5]), np.array([k - 1]), np.array([0, 1])),
                                   shape=(1, k)), tile_width=65536)
print(a.sum(axis=1).tolist(), float(a.sum()), a.nbytes)
""")
    sums, total, nbytes = out.split("] ")[0] + "]", *out.split("] ")[1].split()
    assert sums == "[2.5]" and float(total) == 2.5 and int(nbytes) < 2**19  # 448 KiB


@pytest.mark.parametrize("fmt", ["twell", "ell"])
@given(case=wide_cases())
def test_reductions_of_huge_dimensions_take_memory_of_the_result_and_the_storage(fmt, case):
    m, k = case.shape
    x = sp.coo_array((case.vals, (case.rows, case.cols)), shape=case.shape)
    a = twell.TwELLMatrix(x, tile_width=case.tile_width)
    if fmt == "ell":
        a = twell.ELLMatrix(a)
    want = sp.csr_array(x)
    storage = a.nbytes
    for axis in (None, 1, -1):
        got, peak = _traced(lambda axis=axis: a.sum(axis=axis))
        np.testing.assert_allclose(got, np.asarray(want.sum(axis=axis)), rtol=1e-12)
        assert peak <= 2 * storage + 64 * m + 2**16, (axis, peak, storage)
    if k <= 2**22:  # the column sums are K long: only where that is small
        got, peak = _traced(lambda: a.sum(axis=0))
        np.testing.assert_allclose(got, np.asarray(want.sum(axis=0)), rtol=1e-12)
        assert peak <= 2 * storage + 48 * k + 2**16, (peak, storage)


# -- non-native byte order -----------------------------------------------------------------
# Big-endian floats were refused with a message that contradicted itself ("dtype must be
# float64, got >f8"). Like NumPy and scipy, twell converts them once, where they come in.

_ORDERED = [pytest.param(np.dtype(t), id=t) for t in ("float64", "float32", "float16", "int32",
                                                      "uint16", "int64")]


@pytest.mark.parametrize("dtype", _ORDERED)
@given(case=cases(values="finite", max_rows=12, max_cols=40, tile_widths=(1, 3, 8, 16)),
       order=byte_orders())
def test_any_byte_order_gives_the_same_matrix(dtype, case, order):
    x = case.dense.astype(dtype)
    want = twell.TwELLMatrix(x, tile_width=case.tile_width, slots=case.slots)
    swapped = in_byte_order(x, order)
    inputs = [swapped, twell.TwELLMatrix.from_dense(swapped, tile_width=case.tile_width,
                                                    slots=case.slots)]
    if dtype != np.float16:  # scipy.sparse holds no float16
        inputs += [_swapped_csr(sp.csr_array(x), order), _swapped_coo(sp.coo_array(x), order)]
    for x_in in inputs:
        got = twell.TwELLMatrix(x_in, tile_width=case.tile_width, slots=case.slots)
        assert got.dtype == want.dtype and got.dtype.isnative
        assert_parts_equal(got, want)
    e = twell.ELLMatrix(swapped)
    assert e.dtype.isnative
    np.testing.assert_array_equal(e.toarray(), twell.ELLMatrix(x).toarray())


def _swapped_csr(x, order):
    return sp.csr_array((in_byte_order(x.data, order), in_byte_order(x.indices, order),
                         in_byte_order(x.indptr, order)), shape=x.shape)


def _swapped_coo(x, order):
    # scipy's COO constructor refuses big-endian values; a loaded or edited matrix holds them.
    x.data = in_byte_order(x.data, order)
    x.coords = tuple(in_byte_order(c, order) for c in x.coords)
    return x


@given(case=cases(values="finite", max_rows=12, max_cols=40, tile_widths=(1, 3, 8, 16)),
       order=byte_orders(), n=st.sampled_from([None, 1, 3]))
def test_operands_in_any_byte_order(case, order, n):
    a = twell.TwELLMatrix(case.dense, tile_width=case.tile_width, slots=case.slots)
    m, k = case.dense.shape
    rng = np.random.default_rng(0)
    b = rng.standard_normal((k,) if n is None else (k, n))
    c = rng.standard_normal((m,) if n is None else (n, m))
    np.testing.assert_array_equal(a @ in_byte_order(b, order), a @ b)
    np.testing.assert_array_equal(in_byte_order(c, order) @ a, c @ a)
    two = in_byte_order(np.array(2.0), order)
    np.testing.assert_array_equal((a * two).toarray(), (a * 2.0).toarray())
    f32 = a.astype(np.dtype(np.float32).newbyteorder(order))
    assert f32.dtype == np.float32 and f32.dtype.isnative


def test_storage_arrays_in_the_other_byte_order_are_converted():
    x, parts = _base(Backendless)
    want = twell.TwELLMatrix(tuple(parts), shape=(3, 10), tile_width=4)
    swapped = tuple(in_byte_order(p, ">" if np.little_endian else "<") for p in parts)
    got = twell.TwELLMatrix(swapped, shape=(3, 10), tile_width=4)
    assert all(p.dtype.isnative for p in parts_of(got))
    assert_parts_equal(got, want)


def test_packed_words_in_the_other_byte_order():
    x = np.zeros((2, 256), dtype=twell.bfloat16)
    x[0, 5], x[1, 200] = 1.5, -2.0
    words = twell.TwELLMatrix(x).to_packed()
    got = twell.from_packed(in_byte_order(words, ">" if np.little_endian else "<"), (2, 256))
    np.testing.assert_array_equal(got.toarray(), x)


def test_a_big_endian_npy_file_through_the_command_line(tmp_path):
    from twell import _cli

    x = np.zeros((3, 5))
    x[1, 2] = 2.5
    np.save(tmp_path / "big.npy", x.astype(">f8"))
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = _cli.main(["convert", str(tmp_path / "big.npy"), str(tmp_path / "out.twell")])
    assert rc == 0, err.getvalue()
    got = twell.load(tmp_path / "out.twell")
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.toarray(), x)


# -- IEEE special values without a warning ---------------------------------------------------
# NaN and Inf are entries like any other, and a cast past a dtype's range rounds to Inf: NumPy
# warned about them from twell's own lines (casts, duplicate sums, products, row sums).
# conftest.py makes any RuntimeWarning from a twell module an error for the whole suite; these
# cases reach every such line, with the warnings of NumPy itself turned into errors too.

_SPECIAL = np.array([[1e300, 0.0, -np.inf, np.inf, 0.0], [np.nan, 1.0, 0.0, -1e300, 5e-324],
                     [6e4, 6e4, 0.0, 0.0, 3e38]])

_QUIET_CASES = {
    "astype float16 past its range": lambda a: a.astype(np.float16),
    "constructor dtype float16": lambda a: twell.TwELLMatrix(_SPECIAL, dtype=np.float16),
    "constructor from COO, duplicates that overflow": lambda a: twell.TwELLMatrix(
        sp.coo_array((np.array([1e308, 1e308, np.inf, -np.inf]), (np.array([0, 0, 1, 1]),
                                                                  np.array([0, 0, 2, 2]))),
                     shape=(2, 3))),
    "constructor from COO to float16": lambda a: twell.TwELLMatrix(
        sp.coo_array(([6e4, 6e4], ([0, 0], [0, 0])), shape=(1, 1)), dtype=np.float16),
    "ELLMatrix float16": lambda a: twell.ELLMatrix(_SPECIAL, dtype=np.float16),
    "sum": lambda a: a.sum(),
    "sum axis 0": lambda a: a.sum(axis=0),
    "sum axis 1": lambda a: a.sum(axis=1),
    "float16 sums past the range": lambda a: a.astype(np.float16).sum(axis=1),
    "ELL sums": lambda a: twell.ELLMatrix(a).sum(axis=0),
    "A @ B": lambda a: a @ np.ones(5),
    "A @ B with Inf in B": lambda a: a @ np.array([np.inf, 0.0, 1.0, 1.0, -np.inf]),
    "float32 A @ B past the range": lambda a: a.astype(np.float32) @ np.full(5, 3e38,
                                                                             np.float32),
    "float16 A @ B": lambda a: a.astype(np.float16) @ np.ones(5, np.float16),
    "B @ A": lambda a: np.ones(3) @ a,
    "A * s": lambda a: a * 1e300,
    "A / 0": lambda a: a / 0,
    "toarray, tocsr, transpose": lambda a: (a.toarray(), a.tocsr(), a.T),
    "sparse_ffn past the range": lambda a: twell.sparse_ffn(
        np.full((2, 4), 1e300), np.ones((3, 4)), np.ones((3, 4)), np.ones((4, 3))),
    "sparse_ffn float16": lambda a: twell.sparse_ffn(
        np.full((2, 4), 6e4, np.float16), np.ones((3, 4), np.float16),
        np.ones((3, 4), np.float16), np.ones((4, 3), np.float16)),
}


@pytest.mark.parametrize("case", list(_QUIET_CASES))
def test_special_values_raise_no_runtime_warning(case):
    import warnings

    a = twell.TwELLMatrix(_SPECIAL, tile_width=2, slots=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _QUIET_CASES[case](a)


def test_a_scipy_npz_member_claiming_a_huge_array_is_refused_before_it_is_read(tmp_path):
    # The command line reads scipy.sparse .npz files with scipy.sparse.load_npz, which reads
    # every member whole: the same hole as twell.load's, guarded the same way.
    x = sp.csr_array(np.eye(3, 10))
    fields = {"data": x.data, "indices": x.indices, "indptr": x.indptr,
              "format": np.array("csr"), "shape": np.array(x.shape)}
    path = tmp_path / "bomb.npz"
    path.write_bytes(_twell_file(fields, "data", (2**25,)).getvalue())  # 256 MiB of zeros
    assert path.stat().st_size < 2**21
    result, peak = _traced(lambda: _catch(lambda: _files.read(path)))
    assert isinstance(result, ValueError), result
    assert str(result) == (f"{path}: not a valid scipy.sparse .npz file (field 'data' holds "
                           "33554432 values; a 3 x 10 matrix has room for at most 88)")
    assert peak < 2**23, f"{peak / 2**20:.0f} MiB traced"


def _catch(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the caller checks which
        return exc


@pytest.mark.parametrize(("fields", "message"), [
    ({"format": np.array("lil")}, r"Load is not implemented for sparse matrix of format lil"),
    ({"format": np.array(7)}, r"not a valid scipy.sparse .npz file"),
    ({"shape": np.array([3.0, 10.0])}, r"the field 'shape' must hold 2 integers"),
], ids=["unknown format", "format not a string", "float shape"])
def test_a_broken_scipy_npz_is_one_value_error_naming_the_file(tmp_path, fields, message):
    # Before, an unknown format was scipy's NotImplementedError (a traceback on the command
    # line) and a format that is not a string an AttributeError.
    x = sp.csr_array(np.eye(3, 10))
    base = {"data": x.data, "indices": x.indices, "indptr": x.indptr,
            "format": np.array("csr"), "shape": np.array(x.shape)}
    path = tmp_path / "broken.npz"
    np.savez(path, **{**base, **fields})
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: .*{message}"):
        _files.read(path)
