"""validate(): every invariant of the TwELL (and row-wise ELL) storage arrays, one message each."""

import numpy as np

from . import _arrays, _layout
from ._algorithms import expand_indptr, is_nonzero, slot_mask
from ._dtypes import SUPPORTED_DTYPES


def _expect(ok, message):
    if not bool(ok):  # host sync on the GPU: validation must decide here
        raise ValueError(message)


def _expect_all(ok, message, name, array):
    """Raise when ``ok`` is not all true, naming the first failing position and its value."""
    if bool(ok.all()):  # host sync on the GPU: validation must decide here
        return
    xp = _arrays.array_module(ok)
    where = tuple(int(i) for i in xp.argwhere(~ok)[0])
    at = where[:array.ndim]
    value = array[at].item() if hasattr(array[at], "item") else array[at]
    index = ", ".join(map(str, at))
    raise ValueError(f"{message}; got {name}[{index}]={value!r}")


def _dtype(name, array, expected):
    if array.dtype != expected:
        raise TypeError(f"{name} must have dtype {expected}; got {name}.dtype={array.dtype}")


def validate_parts(parts, shape, tile_width):
    """Raise TypeError/ValueError naming the first broken invariant."""
    xp = _arrays.array_module(*parts)
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    counts, data, indices, indptr, ocols, odata = parts

    # Kinds, dtypes and shapes.
    _dtype("counts", counts, _layout.COUNT_DTYPE)
    _dtype("indices", indices, _layout.index_dtype(tile_width))
    _dtype("overflow_indptr", indptr, _layout.OVERFLOW_INDPTR_DTYPE)
    _dtype("overflow_indices", ocols, _layout.OVERFLOW_INDEX_DTYPE)
    if data.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"data must have a dtype among {SUPPORTED_DTYPES}; got {data.dtype}")
    _dtype("overflow_data", odata, data.dtype)
    if counts.shape != (m, nt):
        raise ValueError(f"counts must have shape (M, n_tiles) = {(m, nt)}; got {counts.shape}")
    if data.ndim != 3 or data.shape[:2] != (m, nt):
        raise ValueError(f"data must have shape (M, n_tiles, slots) with (M, n_tiles) = "
                         f"{(m, nt)}; got {data.shape}")
    slots = data.shape[2]
    if not 1 <= slots <= tile_width:
        raise ValueError(f"slots must be between 1 and tile_width={tile_width}; got slots={slots}")
    if indices.shape != data.shape:
        raise ValueError(f"indices must have the shape of data {data.shape}; got {indices.shape}")
    if indptr.shape != (m + 1,):
        raise ValueError(f"overflow_indptr must have shape (M + 1,) = {(m + 1,)}; "
                         f"got {indptr.shape}")
    if ocols.ndim != 1 or odata.shape != ocols.shape:
        raise ValueError(f"overflow_indices and overflow_data must be 1-D of equal length; got "
                         f"{ocols.shape} and {odata.shape}")
    for name, a in zip(("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                        "overflow_data"), parts, strict=True):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")

    # Slots.
    _expect_all((counts >= 0) & (counts <= slots),
                f"counts must be between 0 and slots={slots}", "counts", counts)
    used = slot_mask(counts, slots)
    # Only the last tile can be narrower than tile_width: no array of n_tiles elements
    # (validation memory stays proportional to the storage arrays, whatever K is).
    if tile_width < _layout.NARROW_TILE_WIDTH:  # uint16 columns are all below 65536
        _expect((~used | (indices < np.uint16(tile_width))).all(),
                f"indices: a slot column lies outside its tile (at or past "
                f"tile_width={tile_width})")
    elif tile_width > _layout.NARROW_TILE_WIDTH:  # int32 columns: no negative one either
        _expect((~used | ((indices >= 0) & (indices < tile_width))).all(),
                f"indices: a slot column lies outside its tile (negative, or at or past "
                f"tile_width={tile_width})")
    if nt and m:
        last = k - (nt - 1) * tile_width
        _expect((~used[:, -1] | (indices[:, -1] < last)).all(),
                f"indices: a slot column lies outside its tile (the last tile holds columns "
                f"0..{last - 1}, K={k})")
    if slots > 1:
        _expect((~used[..., 1:] | (indices[..., 1:] > indices[..., :-1])).all(),
                "indices: slot columns must be strictly increasing within a (row, tile)")
    nonzero = is_nonzero(data)
    _expect((~used | nonzero).all(), "data: a used slot holds an explicit zero")
    _expect((used | ~nonzero).all(), "data: an unused slot (at or after the count) is not zero")
    _expect((used | (indices == 0)).all(),
            "indices: an unused slot (at or after the count) is not zero")

    # Overflow.
    _expect(indptr[0] == 0, "overflow_indptr[0] must be 0")
    _expect((xp.diff(indptr) >= 0).all(), "overflow_indptr must be non-decreasing")
    _expect(indptr[-1] == ocols.size, "overflow_indptr[-1] must equal len(overflow_indices)")
    if ocols.size:
        _expect_all((ocols >= 0) & (ocols < k), f"overflow_indices must be in [0, K={k})",
                    "overflow_indices", ocols)
        rows = expand_indptr(indptr, ocols.size)
        same_row = rows[1:] == rows[:-1]
        _expect((~same_row | (ocols[1:] > ocols[:-1])).all(),
                "overflow_indices must be strictly increasing within each row")
        _expect(is_nonzero(odata).all(), "overflow_data holds an explicit zero")
        tiles = ocols.astype(np.int64) // tile_width
        _expect((counts[rows, tiles] == slots).all(),
                "overflow: an entry overflows a (row, tile) whose slots are not all used")
        last = indices[rows, tiles, slots - 1].astype(np.int64) + tiles * tile_width
        _expect((ocols > last).all(),
                "overflow: the slots must hold the first entries of a tile by column; an overflow "
                "entry precedes a slot entry")


def validate_ell(data, indices, shape):
    """Raise TypeError/ValueError naming the first broken invariant of ELL storage arrays."""
    m, k = shape
    if data.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"data must have a dtype among {SUPPORTED_DTYPES}; got {data.dtype}")
    _dtype("indices", indices, np.dtype(np.int32))
    if data.ndim != 2 or data.shape[0] != m:
        raise ValueError(f"data must have shape (M, width) with M = {m}; got {data.shape}")
    if indices.shape != data.shape:
        raise ValueError(f"indices must have the shape of data {data.shape}; got {indices.shape}")
    for name, a in (("data", data), ("indices", indices)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    used = is_nonzero(data)
    if data.shape[1] > 1:
        _expect((used[:, :-1] | ~used[:, 1:]).all(),
                "data: an entry follows a padding slot (entries must come first in each row)")
        _expect((~used[:, 1:] | (indices[:, 1:] > indices[:, :-1])).all(),
                "indices: columns must be strictly increasing within a row")
    _expect((~used | ((indices >= 0) & (indices < k))).all(), f"indices must be in [0, K={k})")
    _expect((used | (indices == 0)).all(), "indices: a padding slot is not zero")


def check_csr(indptr, indices, shape, names=("indptr", "indices")):
    """Raise ValueError unless ``indptr`` is a row pointer over ``indices`` whose entries all
    name a column in ``[0, K)``.

    What scipy's ``check_format`` asks of a CSR matrix, asked again because its arrays can
    be changed after construction (scipy and cupyx check them only there). ``names``: the
    two arrays as the user knows them, for the message. Synchronises with the host on the
    GPU; the GPU's own CSR path counts the same faults inside its sort kernel and calls this
    only to name one.
    """
    pname, iname = names
    m, k = shape
    if indptr.shape != (m + 1,):
        raise ValueError(f"{pname} must have M + 1 = {m + 1} elements (x.shape[0] = {m}); "
                         f"got {pname}.shape={indptr.shape}")
    first, last = (int(v) for v in indptr[[0, -1]].tolist())  # host sync on the GPU
    if first != 0:
        raise ValueError(f"{pname}[0] must be 0; got {pname}[0]={first}")
    if last > indices.size:
        raise ValueError(f"{pname}[-1] must be at most len({iname}) = {indices.size}; "
                         f"got {pname}[-1]={last}")
    if m > 0:
        step = indptr[1:] >= indptr[:-1]
        if not bool(step.all()):
            xp = _arrays.array_module(step)
            i = int(xp.argmin(step)) + 1
            raise ValueError(f"{pname} must never decrease; got {pname}[{i}]={int(indptr[i])} "
                             f"after {pname}[{i - 1}]={int(indptr[i - 1])}")
    cols = indices[:last]
    # The extremes first (two reductions, no temporaries); the mask only to name a fault.
    if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= k):  # host sync on the GPU
        _expect_all((cols >= 0) & (cols < k), f"{iname} must be in [0, K={k}) (x.shape[1])",
                    iname, cols)


def check_coo(rows, cols, shape, names=("row", "col")):
    """Raise ValueError unless every ``(rows, cols)`` pair lies within ``shape``.

    Synchronises with the host once on the GPU when the pairs are good.
    """
    m, k = shape
    rows_ok, cols_ok = (rows >= 0) & (rows < m), (cols >= 0) & (cols < k)
    if bool((rows_ok & cols_ok).all()):  # host sync on the GPU
        return
    _expect_all(rows_ok, f"{names[0]} must be in [0, M={m}) (x.shape[0])", names[0], rows)
    _expect_all(cols_ok, f"{names[1]} must be in [0, K={k}) (x.shape[1])", names[1], cols)
