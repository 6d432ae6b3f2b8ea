"""Backend choice: the NumPy or the CuPy backend, decided by where the arrays live.

Both backends implement the contract of :mod:`twell._contract`; :func:`backend` returns the
one for an array module. The CuPy backend is imported on first use (it imports CuPy and
compiles nothing until a kernel runs).
"""

import functools

import numpy as np


@functools.cache
def backend(xp):
    """The backend module (:mod:`twell._numpy_backend` or :mod:`twell._cuda._backend`) for
    ``xp``."""
    if xp is np:
        from . import _numpy_backend

        return _numpy_backend
    from ._cuda import _backend as cuda_backend

    return cuda_backend
