"""twell.dask on the CPU: Dask's synchronous scheduler, NumPy-backed blocks, scipy as the oracle."""

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import MATMUL_RTOL

import twell

dask = pytest.importorskip("dask", reason="dask is not installed (pip install 'twell[dask]')")
da = pytest.importorskip("dask.array", reason="dask.array is not installed (pip install "
                         "'twell[dask]')")
import twell.dask as tdask  # noqa: E402 - after the skip: the examples need dask

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)


@pytest.fixture(autouse=True)
def synchronous():
    """Every test runs on Dask's synchronous scheduler: deterministic and debuggable."""
    with dask.config.set(scheduler="synchronous"):
        yield


def sparse_dense(rng, shape, density=0.05, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) >= density] = 0
    return x


def assert_matmul_close(got, x, b, dtype):
    """``got`` against scipy CSR @ dense in float64, relative error by norm."""
    want = sp.csr_array(x.astype(np.float64)) @ b.astype(np.float64)
    assert got.dtype == dtype
    scale = max(np.linalg.norm(want), 1.0)
    assert np.linalg.norm(got.astype(np.float64) - want) <= MATMUL_RTOL[dtype] * scale


# -- construction ------------------------------------------------------------------------------

@pytest.mark.parametrize("chunks", [((5, 16, 0, 9, 1), (600,)), ((8, 8, 8, 7), (100, 250, 250)),
                                    ((31,), (600,))],
                         ids=["uneven-rows-and-empty", "column-split", "one-block"])
def test_from_dask_array_round_trip(rng, chunks):
    x = sparse_dense(rng, (31, 600))
    A = tdask.from_dask_array(da.from_array(x, chunks=chunks), tile_width=128)
    assert A.shape == x.shape and A.dtype == F32 and A.tile_width == 128
    assert A.row_chunks == chunks[0] and A.numblocks == len(chunks[0])
    dense = A.to_dask_array()
    assert dense.chunks == (chunks[0], (600,))  # row blocks only, columns whole
    np.testing.assert_array_equal(dense.compute(), x)
    assert A.nnz == np.count_nonzero(x)
    csr = A.tocsr()
    assert [c.shape[0] for c in csr] == list(chunks[0])
    np.testing.assert_array_equal(sp.vstack(csr).toarray(), x)


def test_blocks_are_tile_aligned(rng):
    """Guards the partitioning rule: column chunks that cut tiles still give whole tiles."""
    x = sparse_dense(rng, (6, 300), density=0.3)
    A = tdask.from_dask_array(da.from_array(x, chunks=(3, 70)), tile_width=128, slots=4)
    for block, rows in zip(A.to_blocks(), (slice(0, 3), slice(3, 6)), strict=True):
        ref = twell.TwELLMatrix(x[rows], tile_width=128, slots=4)
        assert block.n_tiles == 3
        np.testing.assert_array_equal(block.counts, ref.counts)
        np.testing.assert_array_equal(block.indices, ref.indices)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_from_dask_array_sparse_chunks(rng, fmt):
    x = sparse_dense(rng, (20, 300), dtype=np.float64)
    chunks = da.from_array(x, chunks=(7, 150)).map_blocks(
        lambda c: sp.csr_matrix(c).asformat(fmt), dtype=x.dtype,
        meta=sp.csr_matrix((0, 0), dtype=x.dtype))
    A = tdask.from_dask_array(chunks)
    assert A.row_chunks == (7, 7, 6) and A.dtype == F64
    np.testing.assert_array_equal(A.to_dask_array().compute(), x)


def test_from_dask_array_integer_input_becomes_float64():
    x = da.from_array(np.eye(4, dtype=np.int32), chunks=2)
    A = tdask.from_dask_array(x)
    assert A.dtype == F64
    np.testing.assert_array_equal(A.to_dask_array().compute(), np.eye(4))


def test_from_blocks_keeps_each_blocks_slots(rng):
    blocks = [twell.TwELLMatrix(sparse_dense(rng, (r, 64), 0.5), tile_width=16, slots=s)
              for r, s in ((3, 2), (0, 1), (5, 16))]
    A = tdask.from_blocks(blocks)
    assert A.shape == (8, 64) and A.row_chunks == (3, 0, 5)
    assert [b.slots for b in A.to_blocks()] == [2, 1, 16]
    assert A.stats()["slots"] == [2, 1, 16]
    np.testing.assert_array_equal(A.to_dask_array().compute(),
                                  np.vstack([b.toarray() for b in blocks]))


# -- products ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F64, F32, np.dtype(twell.bfloat16)], ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize("rhs", ["dask", "numpy"])
def test_matmul_matrix(rng, dtype, rhs):
    x = sparse_dense(rng, (40, 520), density=0.1).astype(dtype)
    b = rng.standard_normal((520, 24)).astype(dtype)
    A = tdask.from_dask_array(da.from_array(x, chunks=((13, 0, 20, 7), (260, 260))))
    B = da.from_array(b, chunks=(100, 10)) if rhs == "dask" else b
    y = A @ B
    assert isinstance(y, da.Array)
    assert y.chunks[0] == (13, 0, 20, 7)
    assert y.chunks[1] == ((10, 10, 4) if rhs == "dask" else (24,))
    assert_matmul_close(y.compute(), x, b, np.dtype(dtype))


@pytest.mark.parametrize("rhs", ["dask", "numpy", "list"])
def test_matmul_vector(rng, rhs):
    x = sparse_dense(rng, (30, 300))
    v = rng.standard_normal(300).astype(np.float32)
    A = tdask.from_dask_array(da.from_array(x, chunks=(11, 300)))
    other = {"dask": da.from_array(v, chunks=70), "numpy": v, "list": v.tolist()}[rhs]
    y = A @ other
    assert y.shape == (30,) and y.chunks == ((11, 11, 8),)
    # A list of Python floats becomes a float64 array, as with TwELLMatrix: float64 result.
    dtype = F64 if rhs == "list" else F32
    assert_matmul_close(y.compute(), x, v.astype(dtype), dtype)


def test_matmul_promotes_like_twell(rng):
    x = sparse_dense(rng, (10, 50))
    A = tdask.from_dask_array(da.from_array(x, chunks=5))
    b = rng.standard_normal((50, 3))  # float64
    y = A @ b
    assert y.dtype == F64 and y.compute().dtype == F64
    assert_matmul_close(y.compute(), x, b, F64)


def test_matmul_with_overflow_in_blocks(rng):
    """Guards the overflow part: blocks whose tiles hold more than ``slots`` entries."""
    x = sparse_dense(rng, (24, 96), density=0.6, dtype=np.float64)
    A = tdask.from_dask_array(da.from_array(x, chunks=(8, 48)), tile_width=32, slots=2)
    stats = A.stats()
    assert stats["overflow_nnz"] > 0 and stats["overflow_rows"] > 0
    assert stats["nnz"] == np.count_nonzero(x)
    assert A.overflow_nnz == stats["overflow_nnz"]
    ref = twell.TwELLMatrix(x, tile_width=32, slots=2)
    assert stats["overflow_nnz"] == ref.overflow_nnz
    b = rng.standard_normal((96, 5))
    assert_matmul_close((A @ b).compute(), x, b, F64)


def test_tile_histogram_matches_tile_nnz(rng):
    x = sparse_dense(rng, (33, 200), density=0.2)
    A = tdask.from_dask_array(da.from_array(x, chunks=(10, 200)), tile_width=64, slots=3)
    want = np.bincount(twell.TwELLMatrix(x, tile_width=64, slots=3).tile_nnz().ravel())
    hist = A.tile_nnz_histogram()
    assert hist.dtype == np.int64
    np.testing.assert_array_equal(hist, want)
    assert hist.sum() == 33 * 4  # every (row, tile) pair once


def test_matmul_errors(rng):
    A = tdask.from_blocks([twell.TwELLMatrix(np.eye(4))])
    with pytest.raises(ValueError, match=r"A.shape\[1\]=4 must equal other.shape\[0\]=3"):
        A @ np.ones((3, 2))
    with pytest.raises(ValueError, match="other must be 1-D or 2-D"):
        A @ np.ones((4, 2, 2))
    with pytest.raises(TypeError, match="sparse @ sparse"):
        A @ A
    with pytest.raises(TypeError, match="sparse @ sparse"):
        A @ sp.csr_array(np.eye(4))
    with pytest.raises(TypeError):
        np.ones((2, 4)) @ A  # no silent object array


# -- conversions -------------------------------------------------------------------------------

def test_astype_and_get(rng):
    x = sparse_dense(rng, (12, 40))
    A = tdask.from_dask_array(da.from_array(x, chunks=(5, 40)))
    B = A.astype(np.float64)
    assert B.dtype == F64 and B.row_chunks == A.row_chunks
    assert all(b.dtype == F64 for b in B.to_blocks())
    np.testing.assert_array_equal(B.to_dask_array().compute(), x.astype(np.float64))
    assert A.get() is A and A.device == "cpu"
    with pytest.raises(TypeError, match="dtype must be one of"):
        A.astype(np.complex64)


def test_persist_keeps_results(rng):
    x = sparse_dense(rng, (9, 30))
    A = tdask.from_dask_array(da.from_array(x, chunks=(4, 30))).persist()
    assert A.row_chunks == (4, 4, 1)
    np.testing.assert_array_equal(A.to_dask_array().compute(), x)


def test_repr_computes_nothing():
    calls = []

    def count(block):
        calls.append(1)
        return block

    A = tdask.from_blocks([twell.TwELLMatrix(np.eye(3))])
    A._blocks = [dask.delayed(count)(b) for b in A._blocks]
    assert repr(A) == ("<DaskTwELLMatrix 3x3, dtype=float64, tile_width=256, 1 row blocks of (3,) "
                       "rows, on cpu>")
    A @ np.ones(3)
    assert calls == []


# -- errors ------------------------------------------------------------------------------------

def test_column_split_without_rechunk_is_an_error():
    x = da.from_array(np.eye(6), chunks=(3, 2))
    with pytest.raises(ValueError, match=r"3 column chunks \(2, 2, 2\).*rechunk=True"):
        tdask.from_dask_array(x, rechunk=False)
    assert tdask.from_dask_array(x.rechunk({1: -1}), rechunk=False).numblocks == 2


def test_unknown_chunks_cannot_be_rechunked():
    x = da.from_array(np.eye(6), chunks=(3, 2))
    unknown = x[x[:, 0] >= 0]  # boolean indexing: row chunk sizes unknown
    with pytest.raises(ValueError, match="unknown chunk sizes.*compute_chunk_sizes"):
        tdask.from_dask_array(unknown)


def test_from_dask_array_rejects_bad_input():
    with pytest.raises(TypeError, match="x must be a dask.array.Array; got ndarray"):
        tdask.from_dask_array(np.eye(3))
    with pytest.raises(ValueError, match="x must be 2-D"):
        tdask.from_dask_array(da.ones(4, chunks=2))
    with pytest.raises(TypeError, match="x.dtype must be one of"):
        tdask.from_dask_array(da.ones((4, 4), dtype=np.complex64, chunks=2))
    with pytest.raises(ValueError, match="slots must be between 1 and tile_width=8"):
        tdask.from_dask_array(da.ones((4, 4), chunks=2), tile_width=8, slots=9)
    # The blocks share one width, which "auto" cannot give without counting every block:
    # named, not a failure deep in the packing (regression: int("auto")).
    with pytest.raises(ValueError, match='tile_width must be an int for a Dask array.*"auto"'):
        tdask.from_dask_array(da.ones((4, 4), chunks=2), tile_width="auto")


def test_from_blocks_checks_blocks():
    a = twell.TwELLMatrix(np.eye(2, 8), tile_width=4)
    with pytest.raises(ValueError, match=r"blocks\[0\].tile_width=4 but blocks\[1\].tile_width=8"):
        tdask.from_blocks([a, twell.TwELLMatrix(np.eye(2, 8), tile_width=8)])
    with pytest.raises(ValueError, match=r"blocks\[0\].shape\[1\]=8 but blocks\[1\].shape\[1\]=9"):
        tdask.from_blocks([a, twell.TwELLMatrix(np.eye(2, 9), tile_width=4)])
    with pytest.raises(ValueError,
                       match=r"blocks\[0\].dtype=float64 but blocks\[2\].dtype=float32"):
        tdask.from_blocks([a, a, a.astype(np.float32)])
    with pytest.raises(ValueError, match="at least one"):
        tdask.from_blocks([])
    with pytest.raises(TypeError, match=r"blocks\[1\] must be a TwELLMatrix; got ndarray"):
        tdask.from_blocks([a, np.eye(2, 8)])
    with pytest.raises(TypeError, match="blocks must be a list"):
        tdask.from_blocks(a)


# -- files -------------------------------------------------------------------------------------

def test_save_load_round_trip(rng, tmp_path):
    x = sparse_dense(rng, (25, 300), density=0.3).astype(twell.bfloat16)
    A = tdask.from_dask_array(da.from_array(x, chunks=((10, 0, 15), (300,))), tile_width=64,
                              slots=2)
    A.save(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == [
        "block-00000.twell", "block-00001.twell", "block-00002.twell", "manifest.json"]
    B = tdask.load(tmp_path / "m")
    assert (B.shape, B.dtype, B.tile_width, B.row_chunks) == (A.shape, A.dtype, 64, (10, 0, 15))
    for a, b in zip(A.to_blocks(), B.to_blocks(), strict=True):
        for name in ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                     "overflow_data"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert B.stats()["overflow_nnz"] == A.stats()["overflow_nnz"] > 0
    with pytest.raises(FileExistsError, match="overwrite=True"):
        A.save(tmp_path / "m")
    A.save(tmp_path / "m", overwrite=True)


def _saved(tmp_path):
    A = tdask.from_blocks([twell.TwELLMatrix(np.eye(2, 4)), twell.TwELLMatrix(np.ones((3, 4)))])
    A.save(tmp_path)
    with open(tmp_path / "manifest.json") as f:
        return json.load(f)


def _write(tmp_path, manifest):
    with open(tmp_path / "manifest.json", "w") as f:
        f.write(manifest if isinstance(manifest, str) else json.dumps(manifest))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: "{not json", "not valid JSON"),
    (lambda m: [m], "must be a JSON object"),
    (lambda m: {**m, "twell_format": "x"}, "twell_format must be 'DaskTwELLMatrix'"),
    (lambda m: {k: v for k, v in m.items() if k != "dtype"}, "missing key 'dtype'"),
    (lambda m: {**m, "extra": 1}, "unexpected key 'extra'"),
    (lambda m: {**m, "twell_version": 2}, "newer twell"),
    (lambda m: {**m, "shape": [5]}, "shape must be a list of two ints"),
    (lambda m: {**m, "shape": [5, -1]}, "shape must be non-negative"),
    (lambda m: {**m, "dtype": "int8"}, "dtype must be one of"),
    (lambda m: {**m, "tile_width": 0}, "tile_width must be between 1 and"),
    (lambda m: {**m, "tile_width": 2.5}, "tile_width must be an int"),
    (lambda m: {**m, "row_chunks": [2, 2]}, "add up to 4 rows; shape says 5"),
    (lambda m: {**m, "row_chunks": [2, True, 2]}, "row_chunks must be a non-empty list"),
    (lambda m: {**m, "blocks": ["block-00000.twell"]}, "a list of 2 file names"),
    (lambda m: {**m, "blocks": ["../x.twell", "block-00001.twell"]}, "plain file names"),
    (lambda m: {**m, "blocks": ["block-00000.twell"] * 2}, "names a file twice"),
], ids=["json", "object", "format", "missing", "unknown", "version", "shape", "negative",
        "dtype", "tile-width", "tile-width-type", "row-sum", "row-type", "count", "path",
        "twice"])
def test_load_rejects_bad_manifests(tmp_path, change, message):
    _write(tmp_path, change(_saved(tmp_path)))
    with pytest.raises(ValueError,
                       match=f"manifest.json: invalid twell.dask manifest: .*{message}"):
        tdask.load(tmp_path)


def test_load_checks_blocks(tmp_path):
    m = _saved(tmp_path)
    _write(tmp_path, {**m, "row_chunks": [3, 2]})  # rows swapped: blocks do not match
    B = tdask.load(tmp_path)
    with pytest.raises(ValueError, match=r"block-0000[01].twell: does not match the manifest"):
        B.to_blocks()
    _write(tmp_path, m)
    (tmp_path / "block-00001.twell").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="block-00001.twell: not a twell file"):
        tdask.load(tmp_path).to_blocks()
    os.remove(tmp_path / "block-00001.twell")
    with pytest.raises(FileNotFoundError, match="block-00001.twell"):
        tdask.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        tdask.load(tmp_path / "nowhere")


# -- GPU ---------------------------------------------------------------------------------------

def test_cupy_blocks(gpu, rng):
    """CuPy chunks give CuPy blocks; products stay on the GPU; get() brings blocks home."""
    cupy = gpu.xp
    x = sparse_dense(rng, (40, 300))
    b = rng.standard_normal((300, 6)).astype(np.float32)
    chunks = da.from_array(x, chunks=(15, 100)).map_blocks(
        cupy.asarray, meta=cupy.empty((0, 0), dtype=np.float32))
    A = tdask.from_dask_array(chunks)
    assert A.device == "cuda" and A.row_chunks == (15, 15, 10)
    y = A @ cupy.asarray(b)
    assert isinstance(y._meta, cupy.ndarray)
    assert_matmul_close(cupy.asnumpy(y.compute()), x, b, F32)
    host = A.get()
    assert host.device == "cpu"
    np.testing.assert_array_equal(host.to_dask_array().compute(), x)


def test_benchmark_csr_contender_is_named_afresh(rng):
    """The Dask benchmark's CSR product is a new graph at each call, as twell.dask's is: named
    by its inputs alone, a timed rep would get back the result the cluster still holds
    without computing it."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import dask_suite
    finally:
        sys.path.pop(0)
    w = {"m": 60, "k": 20, "n": 3, "density": 0.2}
    dense = dask_suite.dask_matrix(w, 3, on_gpu=False)
    a = dask_suite.csr_matrix(w, 3, on_gpu=False)
    b = da.from_array(rng.standard_normal((20, 3)).astype(np.float32), chunks=(20, 3))
    first, second = (dask_suite.csr_product(a, b, 3, on_gpu=False) for _ in range(2))
    assert first.name != second.name
    want = dense.compute().astype(np.float64) @ b.compute().astype(np.float64)
    np.testing.assert_allclose(second.compute(), want, rtol=1e-5, atol=1e-5)
