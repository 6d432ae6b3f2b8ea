"""The backend contract: the primitives that the NumPy backend (:mod:`twell._numpy_backend`)
and the CuPy backend (:mod:`twell._cuda._backend`) both implement, with these names and
signatures.

Everything above the backends (the containers, conversions, products and the feed-forward
layers) calls these through :func:`twell._backend.backend`, chosen by where the arrays live.
Inputs are trusted (the public API validated them): dense inputs are C-contiguous 2-D arrays
of a supported value dtype, CSR inputs canonical (sorted columns, no duplicates, no explicit
zeros) except for :func:`canonical_csr`'s. ``parts`` is a :class:`twell._algorithms.Parts`
of the six storage arrays. A test checks that both backends match this module.
"""

from typing import Protocol


class Backend(Protocol):
    """The functions every backend module defines."""

    def canonical_csr(self, indptr, indices, data, shape, names=("indptr", "indices")):
        """CSR with rows in any column order -> canonical ``(indptr int64, indices int32,
        data)``: columns sorted, duplicates summed in input order, zeros dropped. Checks
        ``indptr`` and ``indices`` (``names`` name them in the error)."""

    def cast(self, values, dtype):
        """``values`` as a new C-contiguous array of ``dtype``, rounded once (subnormals
        kept)."""

    def count_histogram(self, counts, size):
        """int64 histogram of integer ``counts``: ``size`` bins, then one for everything
        outside ``[0, size)``."""

    def exclusive_scan(self, values):
        """``[0, v0, v0 + v1, ...]`` of the flattened integer ``values`` (int64)."""

    def tile_counts_dense(self, dense, tile_width):
        """Non-zeros of every (row, tile) of a dense matrix: int32 (M, n_tiles)."""

    def tile_counts_csr(self, indptr, indices, shape, tile_width):
        """Non-zeros of every (row, tile) of a canonical CSR matrix: int32 (M, n_tiles)."""

    def pack_dense(self, dense, tile_width, slots, n_over=None):
        """Dense -> ``(parts, nnz)``; NaN and Inf count as non-zeros. ``n_over``: the
        overflow size when the caller knows it (then ``nnz`` may be None)."""

    def pack_csr(self, indptr, indices, data, shape, tile_width, slots, n_over=None):
        """Canonical CSR -> parts (``n_over`` as for :meth:`pack_dense`)."""

    def to_dense(self, parts, shape, tile_width):
        """Parts -> dense C-contiguous array of the parts' dtype."""

    def to_csr(self, parts, shape, tile_width):
        """Parts -> canonical ``(indptr int64, indices int32, data)``."""

    def spmm(self, parts, shape, tile_width, b, out_dtype, nnz_hint=None, tile_index=None):
        """``A @ b`` for a C-contiguous 2-D ``b`` of the parts' dtype, accumulated in
        float32 (float64 for float64) in a fixed order. ``nnz_hint``: A's entry count when
        known without a read-back; ``tile_index``: the layout's tile index, or None."""

    def spmv(self, parts, shape, tile_width, dtype, tile_index=None):
        """The function ``x -> A @ x`` for a C-contiguous vector ``x`` of ``dtype`` (the
        parts') with ``K`` values: :meth:`spmm`'s product with one column, its launch
        chosen once (on the GPU, the kernel, the grid and the arguments)."""

    def matmul_pack_supported(self, x, w, tile_width):
        """Whether :meth:`matmul_pack` takes these operands."""

    def matmul_pack(self, x, w, tile_width, slots, w_up=None, nnz_hint=None):
        """``relu(x @ w.T)`` packed: ``(parts, nnz)``; products accumulate in float32 and
        round once to the operands' dtype. With ``w_up`` (of ``w``'s shape, passing
        :meth:`matmul_pack_supported` with ``x``), the gated layer's hidden values: the
        entries of ``relu(x @ w.T)``, each times ``x[row] . w_up[col]``, as
        :meth:`gated_up` computes them; ``nnz_hint`` (the gate's expected entries, from
        :meth:`gated_ffn_by_sample`) may choose how."""

    def matmul_pack_auto(self, x, w, tile_width, w_up=None, nnz_hint=None):
        """:meth:`matmul_pack` with ``slots="auto"`` (the gate's): ``(parts, slots, nnz)``."""

    def gated_ffn_by_sample(self, x, w_gate, w_up, w_down):
        """The gated layer where the backend runs it with its hidden layer dense for the
        gate's density estimated from a sample of rows (one host synchronisation on the
        GPU): ``(y, nnz_hint)``, ``y`` None where it takes another way, ``nnz_hint`` the
        gate's expected entries where the backend's choice of way depends on them, else
        None."""

    def gated_up(self, parts, shape, tile_width, x, w_up, nnz_hint=None):
        """Parts with the gate's structure and values ``gate * (x[row] . w_up[col])``."""


#: The names of the contract, in the order above.
FUNCTIONS = tuple(name for name in vars(Backend) if not name.startswith("_"))
