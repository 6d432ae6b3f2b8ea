"""Memory: ``nbytes`` of every representation, and the peak of every host conversion.

Issue 6: conversions need no more than a documented multiple of input + output memory
(docs/spec.rst, "Memory"). NumPy reports its allocations to tracemalloc, so the peak of
a conversion (its output included) is measured exactly on the host. The multiple is
largest for 16-bit values, whose entries are 4 bytes while the working arrays hold
int64 rows, columns, keys and ranks per entry.
"""

import io
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import twell

#: The documented bound (docs/spec.rst): peak <= MULTIPLE * (input bytes + output bytes).
MULTIPLE = 16


def _nbytes(x):
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (twell.TwELLMatrix, twell.ELLMatrix)):
        return x.nbytes
    if isinstance(x, io.BytesIO):
        return len(x.getbuffer())
    arrays = (x.data, x.indices, x.indptr) if x.format == "csr" else (x.data, x.row, x.col)
    return sum(a.nbytes for a in arrays)


def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _matrices():
    rng = np.random.default_rng(6)
    m, k = 300, 1024
    for density in (0.002, 0.05, 1.0):
        x = np.where(rng.random((m, k)) < density, rng.integers(1, 9, (m, k)) / 4, 0.0)
        yield pytest.param(x, id=f"density {density}")
    x = np.zeros((m, k))
    x[7] = 1.0
    yield pytest.param(x, id="one dense row")


@pytest.mark.parametrize("x", list(_matrices()))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, twell.bfloat16],
                         ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize(("tile_width", "slots"), [(256, "auto"), (256, 1), (16, 2)],
                         ids=["256-auto", "256-1", "16-2"])
def test_every_host_conversion_stays_within_the_documented_multiple(x, dtype, tile_width,
                                                                    slots):
    x = x.astype(dtype)
    a = twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)
    e = a.to_ell()
    conversions = {
        "dense -> twell": (x, lambda: twell.TwELLMatrix(x, tile_width=tile_width, slots=slots)),
        "twell -> dense": (a, a.toarray),
        "twell -> ell": (a, a.to_ell),
        "ell -> twell": (e, lambda: twell.TwELLMatrix(e, tile_width=tile_width, slots=slots)),
        "transpose": (a, lambda: a.T),
        "relayout": (a, lambda: twell.TwELLMatrix(a, tile_width=7)),
        "save": (a, lambda: _saved(a)),
    }
    f = _saved(a)
    conversions["load"] = (f, lambda: twell.load(_rewound(f)))
    if dtype != twell.bfloat16:
        c = sp.csr_array(x)
        coo = c.tocoo()
        conversions.update({
            "csr -> twell": (c, lambda: twell.TwELLMatrix(c, tile_width=tile_width,
                                                          slots=slots)),
            "coo -> twell": (coo, lambda: twell.TwELLMatrix(coo, tile_width=tile_width,
                                                            slots=slots)),
            "twell -> csr": (a, a.tocsr),
            "twell -> coo": (a, a.tocoo),
        })
    else:
        b = twell.TwELLMatrix(x, tile_width=256, slots=4)
        try:
            words = b.to_packed(2)
        except ValueError:
            words = None
        if words is not None:
            conversions["twell -> packed"] = (b, lambda: b.to_packed(2))
            conversions["packed -> twell"] = (
                words, lambda: twell.TwELLMatrix.from_packed(words, x.shape, 2))
    for name, (src, fn) in conversions.items():
        out, peak = _peak(fn)
        budget = MULTIPLE * (_nbytes(src) + _nbytes(out))
        assert peak <= budget, f"{name}: peak {peak} bytes > {MULTIPLE} x (input + output)"


def _saved(a):
    f = io.BytesIO()
    twell.save(f, a)
    return f


def _rewound(f):
    f.seek(0)
    return f


def test_nbytes_of_every_representation():
    x = np.zeros((3, 10), dtype=np.float32)
    x[0, [1, 2, 3]] = 1
    x[1, 9] = 2
    a = twell.TwELLMatrix(x, tile_width=4, slots=2)
    # counts 3x3 int32, data and indices 3x3x2 (4 + 2 bytes), indptr 4 int64, 1 overflow
    # entry; then the host's compressed rows: 4 entries of int32 column and float32 value, a
    # row pointer of 4 int32
    storage = 9 * 4 + 18 * 6 + 4 * 8 + 1 * (4 + 4)
    rows = 4 * (4 + 4) + 4 * 4
    assert a.nbytes == storage + rows
    assert storage == sum(p.nbytes for p in (a.counts, a.data, a.indices, a.overflow_indptr,
                                             a.overflow_indices, a.overflow_data))
    e = a.to_ell()
    assert e.nbytes == 3 * 3 * (4 + 4) == e.data.nbytes + e.indices.nbytes
    # 16-bit values: kept as float32 in the compressed rows (scipy holds no 16-bit type),
    # made for the first product
    b = a.astype(twell.bfloat16)
    b @ np.ones(10, dtype=np.float32)
    assert b.nbytes == 9 * 4 + 18 * 4 + 4 * 8 + 1 * (4 + 2) + rows

