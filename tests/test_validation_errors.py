"""twell._arguments: bad arguments give messages that name the parameter, the limit and the
value given; TypeError for the wrong kind of object, ValueError for a bad value. The checks
run at the boundary, so both backends raise the same exception."""

import re

import numpy as np
import pytest
import scipy.sparse as sp

import twell


def raises(exc, message):
    return pytest.raises(exc, match=re.escape(message))


@pytest.mark.parametrize("tile_width", [0, -1, 2**31, 2**40])
def test_tile_width_out_of_range(backend, tile_width):
    x = backend.asarray(np.eye(3))
    msg = f"tile_width must be between 1 and 2147483647; got tile_width={tile_width}"
    with raises(ValueError, msg):
        twell.TwELLMatrix(x, tile_width=tile_width)
    with raises(ValueError, msg):
        twell.TwELLMatrix.from_dense(x, tile_width=tile_width)


@pytest.mark.parametrize("tile_width", [2.0, "8", True, None, np.float32(4)],
                         ids=["float", "str", "bool", "None", "np.float32"])
def test_tile_width_of_the_wrong_kind(backend, tile_width):
    with raises(TypeError, f'tile_width must be "auto" or an int; got tile_width={tile_width!r}'):
        twell.TwELLMatrix(backend.asarray(np.eye(3)), tile_width=tile_width)


def test_numpy_integers_are_ints():
    a = twell.TwELLMatrix(np.eye(3), tile_width=np.int64(2), slots=np.int32(1))
    assert (a.tile_width, a.slots) == (2, 1)
    assert type(a.tile_width) is int


@pytest.mark.parametrize("tile_width, slots", [(256, 300), (256, 0), (8, 9), (1, 2), (4, -1)])
def test_slots_out_of_range(backend, tile_width, slots):
    msg = f"slots must be between 1 and tile_width={tile_width}; got slots={slots}"
    with raises(ValueError, msg):
        twell.TwELLMatrix(backend.asarray(np.eye(3)), tile_width=tile_width, slots=slots)


def test_slots_message_of_the_issue():
    with raises(ValueError, "slots must be between 1 and tile_width=256; got slots=300"):
        twell.TwELLMatrix(np.eye(3), tile_width=256, slots=300)


@pytest.mark.parametrize("slots", ["Auto", "", "max"])
def test_slots_unknown_string(backend, slots):
    with raises(ValueError, f'slots must be "auto" or an int in [1, 16]; got slots={slots!r}'):
        twell.TwELLMatrix(backend.asarray(np.eye(3)), tile_width=16, slots=slots)


@pytest.mark.parametrize("slots", [1.5, True, None, [2]], ids=["float", "bool", "None", "list"])
def test_slots_of_the_wrong_kind(backend, slots):
    with raises(TypeError, f"slots must be an int; got slots={slots!r}"):
        twell.TwELLMatrix(backend.asarray(np.eye(3)), slots=slots)


@pytest.mark.parametrize("shape, message", [
    ((3,), "shape must be a pair of non-negative ints (M, K); got shape=(3,)"),
    ((1, 2, 3), "shape must be a pair of non-negative ints (M, K); got shape=(1, 2, 3)"),
    ((2.0, 3), "shape must be a pair of non-negative ints (M, K); got shape=(2.0, 3)"),
    ((-1, 3), "shape must be non-negative; got shape=(-1, 3)"),
    ((1, 2**31), "shape[1] (columns) must be at most 2147483647; got shape=(1, 2147483648)"),
], ids=["one-int", "three-ints", "float", "negative", "too-many-columns"])
def test_bad_shape(shape, message):
    a = twell.TwELLMatrix(np.eye(2))
    arrays = (a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices,
              a.overflow_data)
    with raises(ValueError, message):
        twell.TwELLMatrix(arrays, shape=shape)


def test_from_packed_checks_the_shape():
    with raises(ValueError, "shape must be non-negative; got shape=(-1, 256)"):
        twell.from_packed(np.zeros((0, 32), dtype=np.uint32), (-1, 256))


SUPPORTED = "float64, float32, float16, bfloat16 (bool and integers become float64)"


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.object_, np.str_,
                                   np.dtype("datetime64[s]"), np.longdouble],
                         ids=["c64", "c128", "object", "str", "datetime", "longdouble"])
def test_unsupported_dtype_argument(backend, dtype):
    with raises(TypeError, f"dtype must be one of {SUPPORTED}; got dtype={np.dtype(dtype)}"):
        twell.TwELLMatrix(backend.asarray(np.eye(2)), dtype=dtype)


def test_unsupported_input_dtype_names_the_input(backend):
    with raises(TypeError, f"x.dtype must be one of {SUPPORTED}; got x.dtype=complex128"):
        twell.TwELLMatrix(backend.asarray(np.eye(2, dtype=np.complex128)))
    with raises(TypeError, f"x.dtype must be one of {SUPPORTED}; got x.dtype=complex128"):
        twell.TwELLMatrix(sp.csr_array(np.eye(2, dtype=np.complex128)))


def test_unsupported_operand_dtype_names_the_operand(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(2)))
    with raises(TypeError, f"other.dtype must be one of {SUPPORTED}; got other.dtype=complex64"):
        a @ backend.asarray(np.ones(2, dtype=np.complex64))


@pytest.mark.parametrize("compression", [3, 0, 16])
def test_bad_compression(compression):
    a = twell.TwELLMatrix(np.zeros((1, 256), dtype=twell.bfloat16))
    with raises(ValueError, f"compression must be one of 2, 4, 8; got compression={compression}"):
        a.to_packed(compression)


def test_compression_of_the_wrong_kind():
    a = twell.TwELLMatrix(np.zeros((1, 256), dtype=twell.bfloat16))
    with raises(TypeError, "compression must be an int; got compression=8.0"):
        a.to_packed(8.0)


def test_bad_axis():
    with raises(ValueError, "axis must be None, 0 or 1; got axis=2"):
        twell.TwELLMatrix(np.eye(2)).sum(axis=2)


def test_bad_format():
    with raises(ValueError, "format must be one of 'twell', 'ell', 'csr', 'csc', 'coo', 'bsr', "
                            "'dia', 'dok', 'lil', 'array', 'dense'; got format='csx'"):
        twell.TwELLMatrix(np.eye(2)).asformat("csx")


def test_dense_input_dimensions_are_named(backend):
    with raises(ValueError, "x must be 2-D; got x.ndim=3 (shape (2, 2, 2))"):
        twell.TwELLMatrix(backend.asarray(np.ones((2, 2, 2))))


@pytest.mark.parametrize("bad", [{"tile_width": 0}, {"slots": 0}, {"dtype": np.complex64}],
                         ids=["tile_width", "slots", "dtype"])
def test_same_exception_on_both_backends(backend, bad):
    """Checked at the boundary, before a backend is chosen: the same type and message."""
    with pytest.raises((TypeError, ValueError)) as on_host:
        twell.TwELLMatrix(np.eye(3), **bad)
    with pytest.raises(on_host.type) as here:
        twell.TwELLMatrix(backend.asarray(np.eye(3)), **bad)
    assert str(here.value) == str(on_host.value)
