"""twell._invariants: ``validate()`` accepts every constructed matrix and names each broken
invariant.

Every corruption here is one a user can make in place through the public
storage arrays (or hand to the tuple constructor); each must raise the same
exception type, with a message naming the invariant, on both backends.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import DTYPES, cast, editable
from hypothesis import given
from strategies import cases, coo_cases, edge_examples

import twell


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(values="any"))
@edge_examples()
def test_validate_passes_on_constructed_matrices(backend, dtype, case):
    t, s = case.tile_width, case.slots
    x = backend.asarray(cast(case.dense, dtype))
    a = twell.TwELLMatrix(x, tile_width=t, slots=s)
    for m in (a, a.T, a * 2, -a, a.astype(np.float32), a.copy(), a.get(),
              twell.TwELLMatrix(a, tile_width=3, slots=2), twell.TwELLMatrix(x, tile_width=t)):
        m.validate()


@given(case=coo_cases())
def test_validate_passes_on_matrices_from_coo(backend, case):
    coo = sp.coo_array((case.vals, (case.rows, case.cols)), shape=case.shape)
    twell.TwELLMatrix(backend.sparse(coo), tile_width=case.tile_width,
                      slots=case.slots).validate()


def base_matrix(backend):
    """3x10, tile width 4, 2 slots; row 0's first tile overflows (column 3), rows 1-2 do not.

    counts = [[2, 1, 0], [0, 0, 2], [0, 1, 0]]; overflow: row 0, column 3.
    """
    x = np.zeros((3, 10))
    x[0, [1, 2, 3, 5]] = [1, 2, 3, 4]
    x[1, [8, 9]] = 5
    x[2, 4] = 6
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=4, slots=2)
    assert backend.to_host(a.counts).tolist() == [[2, 1, 0], [0, 0, 2], [0, 1, 0]]
    assert backend.to_host(a.overflow_indices).tolist() == [3]
    return editable(a)


def _set(array, index, values):
    """``array[index] = values`` with the values on the array's own backend."""
    if isinstance(array, np.ndarray):
        array[index] = np.asarray(values, dtype=array.dtype)
    else:
        import cupy

        array[index] = cupy.asarray(values, dtype=array.dtype)


def _unfill_tile(a):
    """Row 0, tile 0 holds one slot entry only: its overflow entry is then invalid."""
    a.counts[0, 0] = 1
    a.data[0, 0, 1] = 0
    a.indices[0, 0, 1] = 0


CORRUPTIONS = {
    "count above slots": (lambda a: a.counts.__setitem__((1, 0), 3),
                          "counts must be between 0 and slots=2"),
    "negative count": (lambda a: a.counts.__setitem__((2, 1), -1),
                       "counts must be between 0 and slots=2"),
    "column outside the partial last tile": (lambda a: a.indices.__setitem__((1, 2, 1), 2),
                                             "slot column lies outside its tile"),
    "column outside a full tile": (lambda a: a.indices.__setitem__((0, 0, 1), 4),
                                   "slot column lies outside its tile"),
    "unsorted slot columns": (lambda a: _set(a.indices, (0, 0), [2, 1]), "strictly increasing"),
    "duplicate slot columns": (lambda a: _set(a.indices, (0, 0), [1, 1]), "strictly increasing"),
    "non-zero value padding": (lambda a: a.data.__setitem__((2, 1, 1), 7.0),
                               "unused slot (at or after the count) is not zero"),
    "non-zero column padding": (lambda a: a.indices.__setitem__((2, 1, 1), 3),
                                "unused slot (at or after the count) is not zero"),
    "explicit zero in a used slot": (lambda a: a.data.__setitem__((2, 1, 0), 0.0),
                                     "used slot holds an explicit zero"),
    "overflow indptr not monotone": (lambda a: _set(a.overflow_indptr, slice(1, 3), [2, 1]),
                                     "non-decreasing"),
    "overflow indptr not starting at 0": (lambda a: a.overflow_indptr.__setitem__(0, 1),
                                          "overflow_indptr[0] must be 0"),
    "overflow indptr end != length": (lambda a: a.overflow_indptr.__setitem__(slice(1, 4), 0),
                                      "overflow_indptr[-1]"),
    "overflow for a tile that is not full": (_unfill_tile, "slots are not all used"),
    "overflow column before the last slot column": (
        lambda a: a.overflow_indices.__setitem__(0, 0), "overflow entry precedes a slot entry"),
    "overflow column outside the matrix": (lambda a: a.overflow_indices.__setitem__(0, 10),
                                           "overflow_indices must be in [0, K=10)"),
    "explicit zero in the overflow": (lambda a: a.overflow_data.__setitem__(0, 0.0),
                                      "overflow_data holds an explicit zero"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_validate_names_the_broken_invariant(backend, name):
    corrupt, message = CORRUPTIONS[name]
    a = base_matrix(backend)
    a.validate()
    corrupt(a)
    with pytest.raises(ValueError) as info:
        a.validate()
    assert message in str(info.value)


def test_overflow_rows_must_be_sorted(backend):
    """Two overflow entries of one row in the wrong order."""
    x = np.zeros((1, 8))
    x[0, :4] = [1, 2, 3, 4]
    a = editable(twell.TwELLMatrix(backend.asarray(x), tile_width=4, slots=1))
    assert backend.to_host(a.overflow_indices).tolist() == [1, 2, 3]
    a.overflow_indices[:] = backend.asarray(np.array([1, 3, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="overflow_indices must be strictly increasing"):
        a.validate()


# -- the tuple constructor checks what it is given --------------------------------------------

def parts(a, **replace):
    names = ("counts", "data", "indices", "overflow_indptr", "overflow_indices", "overflow_data")
    return tuple(replace.get(n, getattr(a, n)) for n in names)


# name -> (arrays from (xp, matrix), exception type, message fragment)
BAD_PARTS = {
    "counts int64": (lambda xp, a: parts(a, counts=a.counts.astype(np.int64)), TypeError,
                     "counts must have dtype int32"),
    "indices int32": (lambda xp, a: parts(a, indices=a.indices.astype(np.int32)), TypeError,
                      "indices must have dtype uint16"),
    "overflow_indptr int32": (
        lambda xp, a: parts(a, overflow_indptr=a.overflow_indptr.astype(np.int32)), TypeError,
        "overflow_indptr must have dtype int64"),
    "overflow_indices int64": (
        lambda xp, a: parts(a, overflow_indices=a.overflow_indices.astype(np.int64)), TypeError,
        "overflow_indices must have dtype int32"),
    "complex data": (lambda xp, a: parts(a, data=a.data.astype(np.complex128),
                                         overflow_data=a.overflow_data.astype(np.complex128)),
                     TypeError, "data must have a dtype among"),
    "overflow_data of another dtype": (
        lambda xp, a: parts(a, overflow_data=a.overflow_data.astype(np.float32)), TypeError,
        "overflow_data must have dtype float64"),
    "counts of the wrong shape": (lambda xp, a: parts(a, counts=a.counts[:, :2].copy()),
                                  ValueError, "counts must have shape (M, n_tiles) = (3, 3)"),
    "2-D data": (lambda xp, a: parts(a, data=a.data[:, :, 0].copy()), ValueError,
                 "data must have shape (M, n_tiles, slots)"),
    "indices shape differs from data": (
        lambda xp, a: parts(a, indices=a.indices[:, :, :1].copy()), ValueError,
        "indices must have the shape of data"),
    "overflow_indptr too short": (
        lambda xp, a: parts(a, overflow_indptr=a.overflow_indptr[:-1].copy()), ValueError,
        "overflow_indptr must have shape (M + 1,)"),
    "overflow lengths differ": (lambda xp, a: parts(a, overflow_data=xp.zeros(2)), ValueError,
                                "equal length"),
    "non-contiguous data": (lambda xp, a: parts(a, data=xp.asfortranarray(a.data)), ValueError,
                            "data must be C-contiguous"),
    "more slots than tile_width": (
        lambda xp, a: parts(a, data=xp.zeros((3, 3, 5)),
                            indices=xp.zeros((3, 3, 5), dtype=np.uint16)),
        ValueError, "slots must be between 1 and tile_width=4; got slots=5"),
}


@pytest.mark.parametrize("name", list(BAD_PARTS))
def test_tuple_constructor_rejects_bad_arrays(backend, name):
    make_arrays, exc, message = BAD_PARTS[name]
    arrays = make_arrays(backend.xp, base_matrix(backend))
    with pytest.raises(exc) as info:
        twell.TwELLMatrix(arrays, shape=(3, 10), tile_width=4)
    assert message in str(info.value)


def test_tuple_constructor_round_trip(backend):
    a = base_matrix(backend)
    b = twell.TwELLMatrix(parts(a), shape=a.shape, tile_width=4)
    b.validate()
    assert b.nnz == a.nnz == 7


@pytest.mark.parametrize("shape, message", [
    ((3, 9), "slot column lies outside its tile"),  # row 1 holds column 9
    ((3, 13), "counts must have shape"),
    ((3, 8), "counts must have shape"),
    ((4, 10), "counts must have shape"),
    ((3, -10), "non-negative"),
    ((3,), "pair"),
])
def test_tuple_constructor_checks_the_shape(backend, shape, message):
    a = base_matrix(backend)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        twell.TwELLMatrix(parts(a), shape=shape, tile_width=4)


def test_tuple_constructor_needs_shape_and_six_arrays(backend):
    a = base_matrix(backend)
    with pytest.raises(ValueError, match="shape is required"):
        twell.TwELLMatrix(parts(a), tile_width=4)
    with pytest.raises(ValueError, match="6 storage arrays.*got a tuple of 5"):
        twell.TwELLMatrix(parts(a)[:5], shape=(3, 10), tile_width=4)


def test_tuple_constructor_rejects_mixed_host_and_device_arrays(gpu):
    a = base_matrix(gpu)
    mixed = parts(a, counts=a.counts.get())
    with pytest.raises(TypeError, match="NumPy"):
        twell.TwELLMatrix(mixed, shape=(3, 10), tile_width=4)
