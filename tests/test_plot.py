"""twell.plot: object types, what is drawn for known matrices, both backends, no show()."""

import sys

import numpy as np
import pytest
import scipy.sparse as sp

import twell

matplotlib = pytest.importorskip(
    "matplotlib", reason="matplotlib is not installed (pip install 'twell[plot]')"
)
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - after the backend choice
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import twell.plot as tp  # noqa: E402

# The matrix of the documentation's pictures: 4 x 8, tile_width=4, slots=2. Row 2 holds three
# non-zeros in tile 1 (columns 4, 5, 6): column 6 goes to the overflow.
SMALL = np.array([[0, 1.5, 0, 0, 2, 0, 0, 0],
                  [3, 0, 0, 4, 0, 0, 0, 0],
                  [0, 0, 0, 0, 5, 6, 7, 0],
                  [0, 0, 8, 0, 0, 0, 0, 9]])


@pytest.fixture(autouse=True)
def no_show_and_close(monkeypatch):
    """Fail any test whose function calls show(); close the figures each test made."""
    def show(*args, **kwargs):
        raise AssertionError("twell.plot called show()")

    monkeypatch.setattr(plt, "show", show)
    monkeypatch.setattr(Figure, "show", show)
    yield
    plt.close("all")


def small(backend, **kw):
    kw = {"tile_width": 4, "slots": 2, **kw}
    return twell.TwELLMatrix(backend.asarray(SMALL), **kw)


def random_matrix(rng, shape=(24, 40), density=0.3):
    x = rng.standard_normal(shape)
    x[rng.random(shape) >= density] = 0
    return x


def collection(ax, label):
    found = [c for c in ax.collections if c.get_label() == label]
    assert len(found) == 1, f"one collection labelled {label!r}; got {len(found)}"
    return found[0]


# -- layout ----------------------------------------------------------------------------------


def test_layout_known_matrix(backend):
    a = small(backend)
    ax = tp.layout(a)
    assert isinstance(ax, Axes)
    over = collection(ax, "overflow entries").get_offsets()
    slot = collection(ax, "slot entries").get_offsets()
    assert len(over) == a.overflow_nnz == 1
    assert len(slot) == a.nnz - a.overflow_nnz == 8
    # Markers sit at (column, row - 0.15): the overflow entry is column 6 of row 2.
    np.testing.assert_allclose(np.asarray(over), [[6, 2 - 0.15]])


def test_layout_gauges_show_used_slots(backend):
    a = small(backend)
    ax = tp.layout(a, gauges=True)
    (gauges,) = [c for c in ax.collections if c.get_label() == "_gauges"]
    faces = gauges.get_facecolors()
    used = np.all(np.isclose(faces, matplotlib.colors.to_rgba(tp.SLOT_COLOR)), axis=1)
    m, nt = a.shape[0], a.n_tiles
    assert faces.shape[0] == m * nt * a.slots
    assert int(used.sum()) == int(backend.to_host(a.counts).sum())


def test_layout_random_matrix_counts_markers(backend, rng):
    x = random_matrix(rng)
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=8, slots=2)
    assert a.overflow_nnz > 0  # the test needs overflow
    ax = tp.layout(a)
    assert len(collection(ax, "overflow entries").get_offsets()) == a.overflow_nnz
    assert len(collection(ax, "slot entries").get_offsets()) == a.nnz - a.overflow_nnz


def test_layout_max_rows_draws_the_first_rows(rng):
    x = random_matrix(rng, (30, 16))
    a = twell.TwELLMatrix(x, tile_width=8, slots=1)
    ax = tp.layout(a, max_rows=5)
    drawn = np.count_nonzero(x[:5])
    slot = len(collection(ax, "slot entries").get_offsets())
    over = len(collection(ax, "overflow entries").get_offsets())
    assert slot + over == drawn
    assert "first 5 of 30 rows" in ax.get_title()
    with pytest.raises(ValueError, match="max_rows must be positive"):
        tp.layout(a, max_rows=0)


def test_layout_draws_on_the_given_axes():
    fig, ax = plt.subplots()
    assert tp.layout(twell.TwELLMatrix(SMALL, tile_width=4, slots=2), ax=ax) is ax
    assert plt.get_fignums() == [fig.number]  # no other figure made


def test_layout_empty_matrix():
    ax = tp.layout(twell.TwELLMatrix(np.zeros((3, 10)), tile_width=4))
    assert len(collection(ax, "slot entries").get_offsets()) == 0


@pytest.mark.parametrize("func", [tp.layout, tp.occupancy, tp.tile_histogram],
                         ids=["layout", "occupancy", "tile_histogram"])
def test_matrix_functions_reject_other_objects(func):
    with pytest.raises(TypeError, match="A must be a TwELLMatrix; got ndarray"):
        func(SMALL)


# -- occupancy and histogram --------------------------------------------------------------


def test_occupancy_image_is_tile_nnz(backend):
    a = small(backend)
    ax = tp.occupancy(a)
    assert isinstance(ax, Axes)
    (image,) = ax.images
    np.testing.assert_array_equal(image.get_array(), backend.to_host(a.tile_nnz()))
    assert image.colorbar is not None
    (outlines,) = [c for c in ax.collections if c.get_label() == "_overflowing"]
    assert len(outlines.get_paths()) == 1  # row 2, tile 1


def test_tile_histogram_bars(backend, rng):
    a = twell.TwELLMatrix(backend.asarray(random_matrix(rng, (32, 64))), tile_width=16, slots=3)
    ax = tp.tile_histogram(a)
    assert isinstance(ax, Axes)
    tile_nnz = backend.to_host(a.tile_nnz()).ravel()
    heights = [int(p.get_height()) for p in ax.patches]
    assert heights == np.bincount(tile_nnz).tolist()
    red = [i for i, p in enumerate(ax.patches)
           if np.allclose(p.get_facecolor(), matplotlib.colors.to_rgba(tp.OVERFLOW_COLOR))]
    assert red == list(range(a.slots + 1, len(ax.patches)))
    assert ax.lines[0].get_xdata()[0] == a.slots + 0.5


# -- format comparison ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, twell.bfloat16], ids=["f32", "bf16"])
def test_format_bytes_match_the_objects(rng, dtype):
    x = random_matrix(rng, (40, 300), 0.05).astype(dtype)
    sizes = tp._format_bytes(x, tile_width=64, slots=2)
    a = sizes["twell"]
    ell = twell.ELLMatrix(x)
    csr = sp.csr_array(x.astype(np.float32))
    isz = np.dtype(dtype).itemsize
    # The storage arrays (what the format takes), without the host's compressed rows.
    assert sizes["TwELL"]["total"] == sum(p.nbytes for p in (
        a.counts, a.data, a.indices, a.overflow_indptr, a.overflow_indices, a.overflow_data))
    assert sizes["ELL"]["total"] == ell.data.nbytes + ell.indices.nbytes
    assert sizes["CSR"]["total"] == csr.nnz * isz + csr.indices.nbytes + csr.indptr.nbytes
    assert sizes["dense"]["total"] == x.size * isz
    for name in ("dense", "CSR", "ELL", "TwELL"):
        assert sizes[name]["values"] == a.nnz * isz


def test_format_comparison_bars(backend, rng):
    x = random_matrix(rng, (40, 300), 0.05)
    ax = tp.format_comparison(backend.asarray(x), tile_width=64, slots=2)
    assert isinstance(ax, Axes)
    assert len(ax.containers) == 3  # values, structure, padding
    totals = sum(np.array([bar.get_width() for bar in c]) for c in ax.containers)
    sizes = tp._format_bytes(x, tile_width=64, slots=2)
    assert totals.tolist() == [sizes[n]["total"] for n in ("dense", "CSR", "ELL", "TwELL")]
    ax = tp.format_comparison(x, dense=False)
    assert len(ax.containers[0]) == 3


# -- formats side by side ---------------------------------------------------------------


def test_formats_side_by_side(backend):
    fig = tp.formats_side_by_side(backend.asarray(SMALL), tile_width=4, slots=2)
    assert isinstance(fig, Figure)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert [t.split(" ")[0] for t in titles] == ["dense", "CSR", "ELL", "TwELL"]
    texts = [t.get_text() for t in fig.axes[3].texts]
    # TwELL: the overflow entry (value 7 at global column 6) is in the overflow arrays, and the
    # slots of row 2, tile 1 hold 5 and 6 at local columns 0 and 1.
    assert {"overflow_indices", "overflow_data", "5 @0", "6 @1"} <= set(texts)
    csr_texts = [t.get_text() for t in fig.axes[1].texts]
    assert "indptr" in csr_texts


def test_formats_side_by_side_refuses_large_matrices():
    with pytest.raises(ValueError, match="at most 16x32"):
        tp.formats_side_by_side(np.ones((17, 4)))


def test_formats_side_by_side_reuses_a_given_figure():
    fig = plt.figure()
    assert tp.formats_side_by_side(SMALL, fig=fig) is fig
    assert len(fig.axes) == 4


# -- packed words -----------------------------------------------------------------------


def hex_texts(ax):
    return [t.get_text() for t in ax.texts if t.get_text().startswith("0x")]


def test_packed_words_worked_example(backend):
    x = np.zeros((1, 512), dtype=np.float32)
    x[0, 3], x[0, 100], x[0, 300] = 1.5, 2.0, 0.25
    a = twell.TwELLMatrix(backend.asarray(x))
    ax = tp.packed_words(a, row=0, tile=1)
    assert isinstance(ax, Axes)
    words = hex_texts(ax)
    assert len(words) == 32
    assert words[:2] == ["0x00000001", "0x3E80012C"]  # global column 300
    assert set(words[2:]) == {"0x00000000"}


@pytest.mark.parametrize("compression", [8, 4, 2])
def test_packed_words_match_to_packed(rng, compression):
    x = random_matrix(rng, (3, 512), 0.05).astype(twell.bfloat16)
    a = twell.TwELLMatrix(x)
    words = a.to_packed(compression)
    wpt = 256 // compression
    ax = tp.packed_words(a, row=2, tile=1, compression=compression)
    assert hex_texts(ax) == [f"0x{w:08X}" for w in words[2, wpt:2 * wpt].tolist()]


def test_packed_words_errors():
    a = twell.TwELLMatrix(np.ones((2, 512)), slots=256)
    with pytest.raises(ValueError, match="row must be in"):
        tp.packed_words(a, row=2, tile=0)
    with pytest.raises(ValueError, match="tile must be in"):
        tp.packed_words(a, row=0, tile=2)
    with pytest.raises(ValueError, match="no overflow"):  # 256 non-zeros in a tile
        tp.packed_words(a, row=0, tile=0)
    with pytest.raises(ValueError, match="multiple of 256"):
        tp.packed_words(twell.TwELLMatrix(np.ones((1, 100))), row=0, tile=0)


# -- matplotlib missing -----------------------------------------------------------------


ALL = [
    pytest.param(lambda: tp.layout(twell.TwELLMatrix(SMALL)), id="layout"),
    pytest.param(lambda: tp.occupancy(twell.TwELLMatrix(SMALL)), id="occupancy"),
    pytest.param(lambda: tp.tile_histogram(twell.TwELLMatrix(SMALL)), id="tile_histogram"),
    pytest.param(lambda: tp.format_comparison(SMALL), id="format_comparison"),
    pytest.param(lambda: tp.formats_side_by_side(SMALL), id="formats_side_by_side"),
    pytest.param(lambda: tp.packed_words(twell.TwELLMatrix(np.eye(1, 256)), 0, 0),
                 id="packed_words"),
]


@pytest.mark.parametrize("call", ALL)
def test_missing_matplotlib_is_a_clear_import_error(monkeypatch, call):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # every matplotlib import now fails
    with pytest.raises(ImportError, match=r"twell\[plot\]"):
        call()


@pytest.mark.parametrize("call", ALL)
def test_every_function_returns_a_matplotlib_object(call):
    assert isinstance(call(), (Axes, Figure))
