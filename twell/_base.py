"""The base class of twell's sparse matrix containers.

:class:`SparseMatrix` holds what :class:`~twell.TwELLMatrix` and :class:`~twell.ELLMatrix`
share: the NumPy-facing class attributes, the conversions between the formats (each
container registers itself under its ``format`` name, so that neither container module
imports the other), scipy.sparse's common sparse-array API (:mod:`twell._sparse_api`), and
the behaviour of a two-dimensional sparse matrix that does not depend on the storage.
"""

import numpy as np

from . import _arrays
from ._sparse_api import SparseArrayAPI


class SparseMatrix(SparseArrayAPI):
    """A two-dimensional sparse matrix whose storage arrays live on the host (NumPy) or on a
    GPU (CuPy). Not instantiated itself: see :class:`~twell.TwELLMatrix` and
    :class:`~twell.ELLMatrix`.

    A subclass names its ``format``, keeps its arrays where its input lived, and implements
    the hooks that :mod:`twell._sparse_api` lists (its entries as canonical CSR, from which
    every other container is built, a value map, a row selection, ...).
    """

    format = None
    ndim = 2
    # As scipy's sparse arrays: no __array_ufunc__ and no __array__, so that NumPy wraps a
    # matrix in an object array, where numpy.sin(A) calls A.sin() and numpy.sum(A) calls
    # A.sum(); the priority makes ndarray operators (``ndarray @ A``, ``ndarray + A``) return
    # NotImplemented, so that A's reflected methods answer. Nothing densifies implicitly.
    # Above CuPy's ndarray (100), which defers only to a strictly higher priority.
    __array_priority__ = 101.0

    #: Container class by format name, filled as each subclass is defined.
    _formats = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.format is not None:
            SparseMatrix._formats[cls.format] = cls

    @property
    def _storage(self):
        raise NotImplementedError

    def _csr_input(self, dtype=None):
        raise NotImplementedError

    @property
    def _xp(self):
        return _arrays.array_module(self._storage)

    @property
    def device(self):
        """``"cpu"`` for NumPy-backed matrices, else the CuPy device."""
        return "cpu" if self._xp is np else self._storage.device

    def to_twell(self, tile_width="auto", slots="auto"):
        """Convert to :class:`~twell.TwELLMatrix` (see its constructor for the arguments)."""
        return self._formats["twell"](self, tile_width=tile_width, slots=slots)

    def to_ell(self, width=None):
        """Convert to row-wise :class:`~twell.ELLMatrix` (``width``: see ELLMatrix)."""
        return self._formats["ell"](self, width=width)

    def totwell(self, copy=False):
        """scipy's ``to<format>`` spelling: the matrix itself if it is a TwELLMatrix (a copy
        with ``copy=True``), else :meth:`to_twell` with the default layout."""
        if self.format == "twell":
            return self.copy() if copy else self
        return self.to_twell()

    def toell(self, copy=False):
        """scipy's ``to<format>`` spelling: the matrix itself if it is an ELLMatrix (a copy
        with ``copy=True``), else :meth:`to_ell`."""
        if self.format == "ell":
            return self.copy() if copy else self
        return self.to_ell()

    def __len__(self):
        raise TypeError("sparse matrix length is ambiguous; use .nnz or .shape[0]")

    def __bool__(self):
        if self.shape == (1, 1):
            return self.nnz != 0
        raise ValueError("the truth value of a matrix with more than one element is ambiguous")
