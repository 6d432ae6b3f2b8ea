"""twell._io: save/load round trips, and every damaged or tampered file is a clear ValueError.

A twell file is an .npz archive of plain arrays (see the module docstring of
``twell._io``). The tampered files here are written with ``numpy.savez`` from
the fields of a good file, one field changed, as anybody can; truncated and
corrupted ones are cut or flipped bytes of a good file.
"""

import io
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import DTYPES, assert_same_bits, cast, gpu_test
from hypothesis import given
from hypothesis import strategies as st
from strategies import cases, edge_examples

import twell
from twell import _io


def round_trip(a, **kwargs):
    f = io.BytesIO()
    twell.save(f, a, **kwargs)
    f.seek(0)
    return twell.load(f)


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(), compressed=st.booleans())
@edge_examples(compressed=False)
def test_twell_round_trip_is_bit_exact(dtype, case, compressed):
    a = twell.TwELLMatrix(cast(case.dense, dtype), tile_width=case.tile_width, slots=case.slots)
    b = round_trip(a, compressed=compressed)
    b.validate()
    assert_same_bits(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases())
@edge_examples()
def test_ell_round_trip_is_bit_exact(dtype, case):
    e = twell.ELLMatrix(cast(case.dense, dtype))
    assert_same_bits(e, round_trip(e))


def test_the_file_name_is_kept_and_compression_shrinks_padding(tmp_path):
    """Regression guard: numpy.savez appends ".npz" to a name without it; save must not."""
    x = np.zeros((64, 512), dtype=np.float32)
    x[:, ::64] = 1.0
    a = twell.TwELLMatrix(x, slots=32)  # mostly padding slots
    plain, packed = tmp_path / "a.twell", tmp_path / "b.twell"
    twell.save(plain, a)
    twell.save(str(packed), a, compressed=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.twell", "b.twell"]
    assert packed.stat().st_size < plain.stat().st_size / 4
    for path in (plain, packed, str(plain)):
        assert_same_bits(a, twell.load(path))


def test_the_file_holds_plain_arrays():
    """Any NumPy program reads the file with allow_pickle=False; bfloat16 is stored as bits."""
    a = twell.TwELLMatrix(np.eye(4, 300, dtype=twell.bfloat16), tile_width=256, slots=2)
    f = io.BytesIO()
    twell.save(f, a)
    f.seek(0)
    with np.load(f, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(_io._FIELDS["TwELLMatrix"])
        assert str(z["twell_format"]) == "TwELLMatrix" and int(z["twell_version"]) == 1
        assert str(z["dtype"]) == "bfloat16" and z["data"].dtype == np.uint16
        assert z["shape"].tolist() == [4, 300] and int(z["tile_width"]) == 256
        np.testing.assert_array_equal(z["data"], a.data.view(np.uint16))


@gpu_test
def test_a_cupy_backed_matrix_is_saved_from_its_host_copy():
    import cupy

    x = np.zeros((5, 300), dtype=np.float32)
    x[1, [2, 3, 290]] = [1, 2, 3]
    a = twell.TwELLMatrix(cupy.asarray(x), slots=1)
    b = round_trip(a)
    assert isinstance(b.counts, np.ndarray)
    assert_same_bits(a.get(), b)


def test_save_rejects_other_objects():
    with pytest.raises(TypeError, match="must be a TwELLMatrix or an ELLMatrix; got ndarray"):
        twell.save(io.BytesIO(), np.eye(2))


def test_load_of_a_missing_file_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        twell.load(tmp_path / "nope.twell")


# -- tampered files -------------------------------------------------------------


def good_matrix():
    """2x10, tile width 4, 2 slots; row 0's first tile overflows (one entry)."""
    x = np.zeros((2, 10), dtype=np.float32)
    x[0, [0, 1, 3]] = [1, 2, 3]
    x[0, 9] = 4
    x[1, [4, 6]] = [5, 6]
    return twell.TwELLMatrix(x, tile_width=4, slots=2)


def good_fields(a=None):
    return _io._fields(good_matrix() if a is None else a)


def write(fields, **savez_kwargs):
    f = io.BytesIO()
    np.savez(f, **fields, **savez_kwargs)
    f.seek(0)
    return f


def changed(**changes):
    fields = good_fields()
    fields.update(changes)
    return write(fields)


def test_the_helpers_make_a_good_file():
    assert_same_bits(twell.load(write(good_fields())), good_matrix())


@pytest.mark.parametrize("name", _io._FIELDS["TwELLMatrix"][1:])
def test_a_missing_field_is_named(name):
    fields = good_fields()
    del fields[name]
    with pytest.raises(ValueError, match=f"missing field '{name}'"):
        twell.load(write(fields))


def test_without_the_marker_it_is_not_a_twell_file():
    fields = good_fields()
    del fields["twell_format"]
    with pytest.raises(ValueError, match="not a twell file: it has no 'twell_format' field"):
        twell.load(write(fields))


def test_an_unexpected_field_is_named():
    with pytest.raises(ValueError, match="unexpected field 'extra' for a TwELLMatrix"):
        twell.load(changed(extra=np.zeros(3)))


@pytest.mark.parametrize(("version", "message"), [
    pytest.param(2, "format version 2; this twell reads version 1 .written by a newer twell",
                 id="newer"),
    pytest.param(0, "format version 0; this twell reads version 1$", id="older"),
    pytest.param(np.array([1, 1]), "'twell_version' must be a single int", id="array"),
    pytest.param(np.array("1"), "'twell_version' must be a single int", id="string"),
    pytest.param(np.array(1.0), "'twell_version' must be a single int", id="float"),
])
def test_a_wrong_version_is_refused(version, message):
    with pytest.raises(ValueError, match=message):
        twell.load(changed(twell_version=version))


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"twell_format": np.array("CSRMatrix")}, "twell_format must be one of",
                 id="unknown class"),
    pytest.param({"dtype": np.array("float8")}, "dtype must be one of float64, .* got 'float8'",
                 id="unknown dtype"),
    pytest.param({"dtype": np.array("float64")},
                 "field 'data' must have dtype float64; got float32", id="dtype mismatch"),
    pytest.param({"dtype": np.array("bfloat16")},
                 "field 'data' must have dtype uint16; got float32", id="bfloat16 not as bits"),
    pytest.param({"counts": np.zeros((2, 3), dtype=np.int64)},
                 "field 'counts' must have dtype int32; got int64", id="counts int64"),
    pytest.param({"counts": np.array([[2, 3, 0], [0, 2, 0]], dtype=np.int32)},
                 "counts must be between 0 and slots=2", id="counts above slots"),
    pytest.param({"counts": np.array([[2, 1, 1], [0, 2, 0]], dtype=np.int32)},
                 "a used slot holds an explicit zero", id="count over a padding slot"),
    pytest.param({"data": np.zeros((2, 3), dtype=np.float32)},
                 "data must have 3 dimensions", id="data 2-D"),
    pytest.param({"data": np.zeros((2, 3, 3), dtype=np.float32)},
                 "indices must have the shape of data", id="slots disagree"),
    pytest.param({"shape": np.array([2, 10, 1])},
                 r"shape must hold two ints \(M, K\); got shape \(3,\)", id="shape 3 values"),
    pytest.param({"shape": np.array([-2, 10])}, "shape must be non-negative", id="negative"),
    pytest.param({"shape": np.array([3, 10])}, r"counts must have shape \(M, n_tiles\)",
                 id="more rows"),
    pytest.param({"shape": np.array([2, 9])}, "a slot column lies outside its tile",
                 id="fewer columns"),
    pytest.param({"shape": np.array([2.0, 10.0])}, "field 'shape' must have dtype int64",
                 id="float shape"),
    pytest.param({"tile_width": np.array(0)}, "tile_width must be between 1 and 2147483647",
                 id="tile width 0"),
    pytest.param({"tile_width": np.array(5)}, "a slot column lies outside its tile|counts must",
                 id="tile width changed"),
    pytest.param({"overflow_indptr": np.array([0, 0, 1])},
                 "an entry overflows a .row, tile. whose slots are not all used",
                 id="overflow moved to row 1"),
    pytest.param({"overflow_indices": np.array([11], dtype=np.int32)},
                 r"overflow_indices must be in \[0, K=10\)", id="overflow column"),
])
def test_a_tampered_field_is_a_value_error_naming_it(changes, message):
    with pytest.raises(ValueError, match=f"invalid twell file: .*{message}"):
        twell.load(changed(**changes))


def test_a_pickled_object_is_never_unpickled():
    payload = np.array([{"rm -rf": "/"}, None], dtype=object)
    f = write({**good_fields(), "data": payload}, allow_pickle=True)
    with pytest.raises(ValueError, match="field 'data' holds Python objects .dtype object.; "
                                         "twell files hold plain arrays"):
        twell.load(f)


def test_a_fortran_ordered_field_is_refused():
    """Same bytes in the other order would scramble the matrix, possibly into a valid one."""
    fields = good_fields()
    fields["data"] = np.asfortranarray(fields["data"])
    with pytest.raises(ValueError, match="'data' is stored in Fortran order"):
        twell.load(write(fields))


def test_big_endian_fields_are_read():
    """Files are portable: a big-endian writer's arrays load into the same matrix."""
    fields = {k: v.astype(v.dtype.newbyteorder(">")) if v.dtype.kind in "iuf" else v
              for k, v in good_fields().items()}
    assert_same_bits(twell.load(write(fields)), good_matrix())


def test_a_scipy_npz_is_not_a_twell_file_and_the_message_says_what_it_is():
    f = io.BytesIO()
    sp.save_npz(f, sp.csr_array(np.eye(3)))
    f.seek(0)
    with pytest.raises(ValueError, match="not a twell file.*scipy.sparse.load_npz"):
        twell.load(f)


@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty"),
    pytest.param(b"PK\x03", id="three bytes"),
    pytest.param(b"hello, world\n" * 20, id="text"),
    pytest.param(b"\x80\x04\x95\x00", id="a pickle"),
])
def test_a_file_that_is_no_archive(tmp_path, content):
    path = tmp_path / "x.twell"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"x.twell: not a twell file: not a zip \(.npz\)"):
        twell.load(path)


def test_a_npy_file_is_no_archive(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.eye(2))
    with pytest.raises(ValueError, match="not a twell file"):
        twell.load(path)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_every_truncation_is_a_value_error(tmp_path, compressed):
    f = io.BytesIO()
    twell.save(f, good_matrix(), compressed=compressed)
    raw = f.getvalue()
    path = tmp_path / "cut.twell"
    for n in range(len(raw)):
        path.write_bytes(raw[:n])
        with pytest.raises(ValueError, match="cut.twell: "):
            twell.load(path)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_a_flipped_bit_anywhere_is_an_error_or_changes_nothing(compressed):
    """Never a silently wrong matrix: the zip CRC-32 covers every byte of every array.

    Bytes outside the arrays (zip timestamps, padding in the .npy headers) may change
    without effect; everything else must be refused.
    """
    f = io.BytesIO()
    a = good_matrix()
    twell.save(f, a, compressed=compressed)
    raw = f.getvalue()
    refused = 0
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x10
        try:
            b = twell.load(io.BytesIO(bytes(bad)))
        except ValueError:
            refused += 1
            continue
        assert_same_bits(a, b)
    assert refused > len(raw) // 2


def test_a_directory_member_or_other_zip_content_is_refused():
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w") as z:
        for name, value in good_fields().items():
            buf = io.BytesIO()
            np.save(buf, value)
            z.writestr(f"{name}.npy", buf.getvalue())
        z.writestr("notes.txt", b"hello")
    f.seek(0)
    with pytest.raises(ValueError, match="unexpected field 'notes.txt'"):
        twell.load(f)


# -- ELL files ------------------------------------------------------------------


def good_ell():
    return twell.ELLMatrix(np.array([[0.0, 2.0, 0.0, 3.0], [1.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize(("changes", "message"), [
    pytest.param({"data": np.array([[2.0, 3.0], [0.0, 1.0]])},
                 "an entry follows a padding slot", id="entry after padding"),
    pytest.param({"indices": np.array([[3, 1], [0, 0]], dtype=np.int32)},
                 "strictly increasing", id="unsorted"),
    pytest.param({"indices": np.array([[1, 4], [0, 0]], dtype=np.int32)},
                 r"indices must be in \[0, K=4\)", id="column out of range"),
    pytest.param({"indices": np.array([[1, 3], [0, 2]], dtype=np.int32)},
                 "a padding slot is not zero", id="padding index"),
    pytest.param({"indices": np.array([[1, 3], [0, 0]], dtype=np.int64)},
                 "field 'indices' must have dtype int32", id="indices int64"),
    pytest.param({"shape": np.array([3, 4])}, "data must have shape .M, width. with M = 3",
                 id="rows"),
    pytest.param({"tile_width": np.array(4)}, "unexpected field 'tile_width' for a ELLMatrix",
                 id="twell field"),
])
def test_a_tampered_ell_file_is_refused(changes, message):
    fields = _io._fields(good_ell())
    fields.update(changes)
    with pytest.raises(ValueError, match=message):
        twell.load(write(fields))


def test_ell_validate_passes_on_constructed_matrices():
    e = good_ell()
    for m in (e, e.T, e.astype(twell.bfloat16), e.copy(), twell.ELLMatrix(e, width=5)):
        m.validate()


# -- telling twell's .npz from scipy's --------------------------------------------


def test_npz_kind_tells_the_writers_apart(tmp_path):
    twell.save(tmp_path / "a.npz", good_matrix())
    sp.save_npz(tmp_path / "b.npz", sp.csr_array(np.eye(2)))
    np.savez(tmp_path / "c.npz", x=np.eye(2))
    (tmp_path / "d.npz").write_bytes(b"not a zip")
    kinds = [_io.npz_kind(tmp_path / f"{c}.npz") for c in "abcd"]
    assert kinds == ["twell", "scipy", None, None]
