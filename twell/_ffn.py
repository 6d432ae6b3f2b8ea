"""Sparse feed-forward layers: activations produced straight into TwELL, and the gated FFN.

The paper's use case (ReLU-sparse feed-forward layers): ``relu(x @ w.T)`` is packed into TwELL
as it is produced, and the gated FFN computes the up projection only where the gate is
non-zero. Weights follow PyTorch's ``nn.Linear`` layout: ``(out_features, in_features)``.

These functions are written once over the array module of their inputs. On the GPU,
``matmul_to_twell`` runs one fused kernel for 16-bit inputs (``cuda_src/ffn.cu``: the GEMM
packs its own output); elsewhere it composes the library's pieces (a dense product, the
activation, the packing kernel), as ``sparse_ffn`` does for its up and down projections.
"""

import numpy as np

from . import _arrays, _backend, _layout
from ._arguments import check_slots, check_storage, check_tile_width
from ._dtypes import accumulator_dtype, result_dtype, value_dtype
from ._twell import TwELLMatrix, _matmul

# Each activation, written for an array module; its zeros make the output sparse.
_ACTIVATE = {"relu": lambda xp, z: xp.maximum(z, 0)}

#: Activations whose zeros make the output sparse.
ACTIVATIONS = tuple(_ACTIVATE)

def _array(x, name, xp):
    if not (isinstance(x, np.ndarray) or _arrays.is_cupy_array(x)):
        x = xp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D; got {name}.shape={x.shape}")
    value_dtype(x.dtype, f"{name}.dtype")
    return x


def _as(be, a, dtype):
    """``a`` as a C-contiguous array of ``dtype``: itself when it is one already."""
    return a if a.dtype == dtype and a.flags.c_contiguous else be.cast(a, dtype)


def _check_linear(w, name, out_features, in_features, out_name, in_name):
    """``w`` must be ``(out_features, in_features)``, nn.Linear's layout."""
    if w.shape != (out_features, in_features):
        hint = " (transposed?)" if w.shape == (in_features, out_features) else ""
        raise ValueError(
            f"{name} must have nn.Linear's shape ({out_name}, {in_name}) = "
            f"({out_features}, {in_features}); got {name}.shape={w.shape}{hint}"
        )


def _activate(z, activation):
    """``activation`` (one of ACTIVATIONS: the callers check it first) applied to ``z``."""
    return _ACTIVATE[activation](_arrays.array_module(z), z)


def matmul_to_twell(x, w, activation="relu", *, tile_width=_layout.GEMM_TILE_WIDTH,
                    slots="auto"):
    """``activation(x @ w.T)`` as a TwELLMatrix.

    Parameters
    ----------
    x : ndarray, shape (M, K)
        Inputs (NumPy or CuPy), e.g. a batch of tokens.
    w : ndarray, shape (N, K)
        Weights in ``nn.Linear`` layout (``out_features, in_features``).
    activation : {"relu"}
        Applied before packing; its zeros are not stored. ReLU keeps NaN, as
        ``numpy.maximum(z, 0)`` does.
    tile_width : int
        As for :class:`TwELLMatrix`.
    slots : int or "auto"
        As for :class:`TwELLMatrix`: ``"auto"`` is the slot count that
        ``TwELLMatrix(activation(x @ w.T))`` picks, from the per-tile counts of the whole
        product. Entries past the slots go to the overflow, so the result is exact whatever
        the choice.

    Returns
    -------
    TwELLMatrix
        Shape (M, N), dtype of NumPy's promotion of ``x`` and ``w``; products accumulate in
        float32 (float64 for float64 inputs) and round once to that dtype.

    Raises
    ------
    ValueError
        When ``w`` is not ``(N, K)`` (a transposed weight is named as such), the activation
        is unknown, or ``tile_width``/``slots`` are invalid.

    Notes
    -----
    On the GPU, for float16 or bfloat16 ``x`` and ``w`` of one dtype, C-contiguous,
    ``K % 8 == 0`` and a tile width in {8, 16, ..., 256}, one kernel computes the product on
    tensor cores and packs it in its epilogue: the dense ``(M, N)`` product is never written to
    memory (``cuda_src/ffn.cu``, mma.sync; on a device of compute capability 9.0, H100/H200,
    ``cuda_src/matmul_pack_sm90.cu``, wgmma fed by TMA, compiled with NVRTC at first use; both
    give the same bits). It synchronises with the host once, to size the overflow, and the GPU
    waits for the host around that read (the design page measures it). A layer that only
    multiplies the result onward runs with no synchronisation, and can be captured in a CUDA
    graph, as :class:`twell.torch.SparseMLP` or :class:`twell.torch.SparseGatedMLP`: they pack
    into storage of a fixed capacity on the device. With ``slots="auto"`` the kernel packs at a
    provisional ``tile_width // 8`` slots (its entries past them spill), the histogram of its
    per-tile counts gives the slots, the overflow size and the entry count in that one read, and
    a second kernel (``twell_reslot``) moves every entry to its place; the provisional layout (4
    bytes per slot: half a byte per output, a quarter of the dense 16-bit product) lives until
    the call returns.
    Besides the result it allocates a spill buffer of ``M * N / 64 + 4096``
    entries (6 bytes each) and 12 bytes per (row, tile) pair; a product whose overflow does
    not fit the spill buffer runs a second time with one of the right size. Every other case
    (and the NumPy backend) computes the dense product in the accumulation dtype, applies the
    activation and packs it.

    Examples
    --------
    >>> import numpy as np, twell
    >>> x = np.array([[1.0, -1.0], [2.0, 0.5]])
    >>> w = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> twell.matmul_to_twell(x, w).toarray()
    array([[1. , 0. , 0. ],
           [2. , 0.5, 2.5]])
    """
    xp = _arrays.array_module(x, w)
    x, w = _array(x, "x", xp), _array(w, "w", xp)
    m, k = x.shape
    if w.ndim != 2 or w.shape[1] != k:
        raise ValueError(
            f"w must have nn.Linear's shape (N, K) with K = x.shape[1] = {k}; got "
            f"w.shape={w.shape}" + (" (transposed?)" if w.shape[0] == k else "")
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got activation={activation!r}")
    tile_width = check_tile_width(tile_width)
    slots = check_slots(slots, tile_width)
    if tile_width == "auto":
        # The width comes from the whole product's counts: the product packed at the GEMM's
        # width (by the fused kernel where it runs: the dense product never in memory), then
        # packed again at the width and slots that its counts give.
        a = matmul_to_twell(x, w, activation, tile_width=_layout.GEMM_TILE_WIDTH)
        nnz = a.nnz if a._nnz_hint is None else a._nnz_hint
        width = _layout.auto_tile_width(a.shape, nnz, slots)
        return TwELLMatrix(a, tile_width=width, slots=slots)
    out = result_dtype(x.dtype, w.dtype)
    be = _backend.backend(xp)
    if be.matmul_pack_supported(x, w, tile_width):
        return _fused_pack(be, x, w, tile_width, slots)
    acc = accumulator_dtype(out)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN and Inf are values like any
        z = _as(be, _activate(xp.matmul(_as(be, x, acc), _as(be, w, acc).T), activation), out)
    return TwELLMatrix.from_dense(z, tile_width=tile_width, slots=slots)


def _fused_pack(be, x, w, tile_width, slots, w_up=None, nnz_hint=None):
    """``relu(x @ w.T)`` (with ``w_up``: the gated layer's hidden values at its non-zeros,
    their way chosen by the gate's expected ``nnz_hint`` entries) from the backend's fused
    GEMM -> TwELL, for operands that ``be.matmul_pack_supported`` takes, ``tile_width`` and
    ``slots`` checked."""
    shape = (x.shape[0], w.shape[0])
    if slots == "auto":
        check_storage(shape, tile_width)
        parts, slots, nnz = be.matmul_pack_auto(x, w, tile_width, w_up=w_up, nnz_hint=nnz_hint)
    else:
        check_storage(shape, tile_width, slots)
        parts, nnz = be.matmul_pack(x, w, tile_width, slots, w_up=w_up, nnz_hint=nnz_hint)
    return TwELLMatrix._from_parts(parts, shape, tile_width, nnz)


def sparse_ffn(x, w_gate, w_up, w_down, gated=True, *, activation="relu",
               tile_width=_layout.GEMM_TILE_WIDTH, slots="auto"):
    """A ReLU-sparse feed-forward layer through TwELL.

    Gated: ``(relu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``, the up projection computed only
    where the gate is non-zero. Not gated: ``relu(x @ w_up.T) @ w_down.T`` (``w_gate`` unused,
    may be None).

    Parameters
    ----------
    x : ndarray, shape (M, d_model)
    w_gate, w_up : ndarray, shape (hidden, d_model)
        ``nn.Linear`` weights of the gate and up projections.
    w_down : ndarray, shape (d_model, hidden)
        ``nn.Linear`` weight of the down projection.
    gated : bool
    activation, tile_width, slots
        As for :func:`matmul_to_twell`.

    Returns
    -------
    ndarray, shape (M, d_model)
        Same array library as ``x``; dtype of NumPy's promotion of the inputs.

    Raises
    ------
    ValueError
        On any weight whose shape is not its ``nn.Linear`` layout (a transposed weight is
        named as such), or a missing ``w_gate`` when ``gated``.
    TypeError
        When ``gated`` is not a bool.

    Notes
    -----
    The gate (or, not gated, the up projection) is :func:`matmul_to_twell`, fused on the GPU.
    The gated up projection is one dot product per entry of the gate (a warp each on the GPU,
    ``twell_gated_up``), except on the GPU for 16-bit or float32 values where the gate is
    dense enough that the whole product pays (at the paper's shape about 1% non-zero for 16-bit
    values, 8.5% for float32; the cost model is
    ``twell._cuda._policy.dense_up_pays``): there cuBLAS computes ``x @ w_up.T`` in float32 (an
    ``M x hidden`` float32 temporary) and ``twell_gated_take`` reads it at the gate's
    entries. On an H100 or H200, for 16-bit ``x``, ``w_gate`` and ``w_up`` of one dtype
    that the fused GEMM takes, one kernel computes both projections and multiplies them in
    its epilogue at the gate's entries (``twell_gated_pack_sm90_*``: both projections are
    computed whole, as the cuBLAS way computes the up projection, without its float32
    temporary, its reading at the entries and its launches). There the layer first
    estimates the gate's density from 256 of its rows spread over ``x`` (one small cuBLAS
    GEMM and one read-back) and chooses by it as the ``twell.torch`` modules choose by their
    first call's: below about 0.85% non-zero the gate alone is packed and the up projection
    is the dot products; from about 0.85% (at the paper's shape, where cuBLAS's down
    projection beats the gather) the gated kernel writes the hidden layer dense
    (``twell_gated_dense_sm90_*``, nothing packed, ``tile_width`` and ``slots`` unused) and
    cuBLAS multiplies it by ``w_down``. Either way each product accumulates in float32 and
    rounds once. Otherwise the down projection is the TwELL SpMM, which picks its own way by
    density. Up-projection products that come out exactly zero stay stored in the
    intermediate, so that the layer computes what the dense layer computes (``0 * inf`` in
    ``w_down`` is NaN in both).

    Examples
    --------
    >>> import numpy as np, twell
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((4, 8))
    >>> wg, wu, wd = (rng.standard_normal(s) for s in [(16, 8), (16, 8), (8, 16)])
    >>> want = (np.maximum(x @ wg.T, 0) * (x @ wu.T)) @ wd.T
    >>> bool(np.allclose(twell.sparse_ffn(x, wg, wu, wd), want))
    True
    """
    if not isinstance(gated, (bool, np.bool_)):
        raise TypeError(f"gated must be True or False; got gated={gated!r}")
    if gated and w_gate is None:
        raise ValueError("w_gate is required when gated=True (gated=False computes "
                         "relu(x @ w_up.T) @ w_down.T without it)")
    xp = _arrays.array_module(x, w_gate if gated else None, w_up, w_down)
    x = _array(x, "x", xp)
    m, d_model = x.shape
    w_up = _array(w_up, "w_up", xp)
    # hidden is w_up's dimension that is not d_model, so that a transposed w_up is named.
    hidden = w_up.shape[0] if w_up.shape[1] == d_model else w_up.shape[1]
    _check_linear(w_up, "w_up", hidden, d_model, "hidden", "d_model")
    w_down = _array(w_down, "w_down", xp)
    _check_linear(w_down, "w_down", d_model, hidden, "d_model", "hidden")
    weights = [w_up, w_down]
    if gated:
        w_gate = _array(w_gate, "w_gate", xp)
        _check_linear(w_gate, "w_gate", hidden, d_model, "hidden", "d_model")
        weights.append(w_gate)
    out = x.dtype
    for w in weights:
        out = result_dtype(out, w.dtype)
    if not gated:
        h = matmul_to_twell(x, w_up, activation, tile_width=tile_width, slots=slots)
        return _matmul(h.astype(out, copy=False), w_down.T)
    be = _backend.backend(xp)
    if (activation == "relu" and x.dtype == w_gate.dtype == w_up.dtype == out
            and not isinstance(tile_width, str)):
        # The gate and the up projection from one backend call where the fused GEMM takes
        # both (on Hopper, one kernel: the up product at the gate's entries in its epilogue).
        tile_width = check_tile_width(tile_width)
        x, w_gate, w_up = (_as(be, a, out) for a in (x, w_gate, w_up))
        if (tile_width <= _layout.NARROW_TILE_WIDTH
                and be.matmul_pack_supported(x, w_gate, tile_width)
                and be.matmul_pack_supported(x, w_up, tile_width)):
            slots = check_slots(slots, tile_width)
            # The gate's density, estimated from a sample of rows where a way depends on it
            # (on Hopper), chooses as the modules choose by their first call's.
            y, hint = be.gated_ffn_by_sample(x, w_gate, w_up, w_down)
            if y is not None:
                return y
            return _matmul(_fused_pack(be, x, w_gate, tile_width, slots, w_up, hint),
                           w_down.T)
    gate = matmul_to_twell(x, w_gate, activation, tile_width=tile_width, slots=slots)
    gate = gate.astype(out, copy=False)
    if gate.tile_width > _layout.NARROW_TILE_WIDTH:
        # The up projection's kernels read 16-bit columns within a tile: a gate of wider
        # tiles (tile_width="auto" on a very wide, very sparse layer) is packed again.
        gate = TwELLMatrix(gate, tile_width=_layout.NARROW_TILE_WIDTH)
    # The up projection at the gate's entries only; products that come out zero stay stored
    # in this intermediate, which only feeds the down projection (as a dense layer would).
    parts = be.gated_up(gate._parts, gate.shape, gate.tile_width, _as(be, x, out),
                        _as(be, w_up, out), gate._nnz_hint)
    h = TwELLMatrix._from_parts(parts, gate.shape, gate.tile_width, gate._nnz_hint)
    return _matmul(h, w_down.T)
