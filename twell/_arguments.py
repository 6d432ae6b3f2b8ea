"""Checks of the arguments a user gives, done once at the API boundary.

Every message names the parameter, the limit and the value that was given. Backend
functions trust what passes these checks.
"""

import numbers

import numpy as np

from . import _layout
from ._dtypes import value_dtype


def check_shape(shape, name="shape"):
    """A pair of non-negative ints; row and column counts within the index limits."""
    try:
        m, k = (operator_index(v, name) for v in shape)
        if len(shape) != 2:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a pair of non-negative ints (M, K); got {name}={shape!r}"
        ) from None
    if m < 0 or k < 0:
        raise ValueError(f"{name} must be non-negative; got {name}={shape!r}")
    if m > _layout.MAX_ROWS:
        raise ValueError(
            f"{name}[0] (rows) must be at most {_layout.MAX_ROWS}; got {name}={shape!r}"
        )
    if k > _layout.MAX_COLUMNS:
        raise ValueError(
            f"{name}[1] (columns) must be at most {_layout.MAX_COLUMNS}; got {name}={shape!r}"
        )
    return (m, k)


def check_storage(shape, tile_width, slots=1):
    """``M * n_tiles * slots`` within :data:`twell._layout.MAX_STORED_SLOTS`.

    Checked before anything of that size is allocated, so that a huge request
    is a ValueError instead of a MemoryError or a kernel launch failure.
    """
    m, k = shape
    nt = _layout.n_tiles(k, tile_width)
    stored = m * nt * slots
    if stored > _layout.MAX_STORED_SLOTS:
        raise ValueError(
            f"M * n_tiles * slots (stored slots) must be at most {_layout.MAX_STORED_SLOTS}; "
            f"got {m} * {nt} * {slots} = {stored} for shape={(m, k)!r}, "
            f"tile_width={tile_width}, slots={slots}"
        )


def operator_index(value, name):
    """``value`` as a Python int, rejecting bools, floats and other objects."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {name}={value!r}")
    return int(value)


def check_tile_width(tile_width):
    """Tile width: ``"auto"`` or an int in [1, 2**31 - 1]. Returns the int or ``"auto"``."""
    if isinstance(tile_width, str) and tile_width == "auto":
        return tile_width
    if isinstance(tile_width, (bool, np.bool_)) or not isinstance(tile_width, numbers.Integral):
        raise TypeError(f'tile_width must be "auto" or an int; got tile_width={tile_width!r}')
    t = int(tile_width)
    if not 1 <= t <= _layout.MAX_TILE_WIDTH:
        raise ValueError(
            f"tile_width must be between 1 and {_layout.MAX_TILE_WIDTH}; got tile_width={t}"
        )
    return t


def check_slots(slots, tile_width):
    """Slot count: ``"auto"`` or an int in [1, tile_width] (in [1, 2**31 - 1] when the tile
    width is ``"auto"``, which then takes tiles at least that wide). Returns the int or
    ``"auto"``."""
    limit = _layout.MAX_TILE_WIDTH if tile_width == "auto" else tile_width
    if isinstance(slots, str):
        if slots == "auto":
            return slots
        raise ValueError(
            f'slots must be "auto" or an int in [1, {limit}]; got slots={slots!r}'
        )
    s = operator_index(slots, "slots")
    if not 1 <= s <= limit:
        raise ValueError(f"slots must be between 1 and tile_width={tile_width}; got slots={s}")
    return s


def check_compression(compression):
    """Reference packed layout compression factor: 2, 4 or 8."""
    c = operator_index(compression, "compression")
    if c not in _layout.PACKED_COMPRESSIONS:
        raise ValueError(f"compression must be one of 2, 4, 8; got compression={c}")
    return c


def check_dense(x, name="x"):
    """A 2-D dense array of a supported (or castable) dtype."""
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got {name}.ndim={x.ndim} (shape {x.shape})")
    check_shape(x.shape, f"{name}.shape")
    return value_dtype(x.dtype, f"{name}.dtype")
