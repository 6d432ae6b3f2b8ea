"""Where arrays live: NumPy (host) or CuPy (device).

This is the only module that imports CuPy at import time. ``import twell`` works without
it; the CuPy backend (:mod:`twell._cuda`) loads on first use of a CuPy array.
"""

import numpy as np

try:  # CuPy is optional: the NumPy path runs everywhere.
    import cupy as _cupy
    import cupyx.scipy.sparse as _cupyx_sparse
except ImportError:  # pragma: no cover - depends on the machine
    _cupy = None
    _cupyx_sparse = None


def cupy_available():
    """True when CuPy imports and sees at least one CUDA device."""
    if _cupy is None:
        return False
    try:
        return _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any CUDA error means "no usable GPU"
        return False


def cupy_module():
    """The ``cupy`` module, or an ImportError that says how to get it."""
    if _cupy is None:
        raise ImportError(
            "this operation needs CuPy; install twell[cuda12] or twell[cuda13]"
        )
    return _cupy


def is_cupy_array(x):
    """True for a ``cupy.ndarray``."""
    return _cupy is not None and isinstance(x, _cupy.ndarray)


def is_cupyx_sparse(x):
    """True for any ``cupyx.scipy.sparse`` matrix."""
    return _cupyx_sparse is not None and _cupyx_sparse.issparse(x)


def cupyx_sparse():
    """The ``cupyx.scipy.sparse`` module (CuPy must be installed)."""
    cupy_module()
    return _cupyx_sparse


def array_module(*arrays):
    """``numpy`` or ``cupy``, whichever holds the given arrays.

    Raises
    ------
    TypeError
        When NumPy and CuPy arrays are mixed: twell never copies between host
        and device behind the user's back.
    """
    on_gpu = [is_cupy_array(a) for a in arrays if a is not None]
    if any(on_gpu):
        if not all(on_gpu):
            raise TypeError(
                "cannot mix NumPy (host) and CuPy (device) arrays; move one side "
                "explicitly with cupy.asarray(...) or .get()"
            )
        return _cupy
    return np


def to_numpy(x):
    """Device-to-host copy of a CuPy array; NumPy arrays pass through."""
    return x.get() if is_cupy_array(x) else x
