"""TwELL matrices from torch tensors, sharing their memory (through :mod:`twell._dlpack`).

torch is imported inside the functions that need it, never at module level.
"""

import numpy as np

from . import _layout
from ._algorithms import Parts
from ._arguments import check_dense
from ._dlpack import _check_tensor, _tensor_to_array, _torch
from ._dtypes import bfloat16
from ._twell import TwELLMatrix


def _value_dtype(torch, dtype):
    """``dtype`` as a NumPy dtype when it is a torch float dtype; anything else passes."""
    if not isinstance(dtype, torch.dtype):
        return dtype
    floats = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
              torch.float16: np.dtype(np.float16), torch.bfloat16: bfloat16}
    if dtype not in floats:
        raise TypeError(
            "dtype must be one of torch.float64, torch.float32, torch.float16, torch.bfloat16 "
            f"(or a NumPy dtype); got dtype={dtype}"
        )
    return floats[dtype]


def from_torch(tensor, *, tile_width="auto", slots="auto", dtype=None):
    """Pack a dense 2-D torch tensor (CPU or CUDA) into a TwELLMatrix.

    The tensor is read where it is, through DLPack: a CPU tensor becomes a
    NumPy-backed matrix, a CUDA tensor a CuPy-backed one on the tensor's GPU.
    The result is :class:`TwELLMatrix` of the shared array, so everything the
    constructor does to NumPy or CuPy input happens here too.

    Parameters
    ----------
    tensor : torch.Tensor, 2-D
        float64, float32, float16 or bfloat16 values are kept; bool and integer
        tensors become float64, as NumPy input does.
    tile_width, slots
        As for :class:`TwELLMatrix`.
    dtype : numpy dtype or torch float dtype, optional
        Value dtype of the matrix (``torch.bfloat16`` is ``twell.bfloat16``).
        Default: that of the tensor.

    Returns
    -------
    TwELLMatrix
        On the tensor's device; its storage arrays are new (packing writes
        them), the tensor is not modified.

    Raises
    ------
    TypeError
        Not a dense torch tensor, a dtype twell cannot hold (complex, float8,
        ...), or a non-float torch ``dtype``.
    ValueError
        A tensor that is not 2-D, or on a device other than the CPU or CUDA;
        the constructor's errors for bad ``tile_width`` or ``slots``.
    ImportError
        Without PyTorch, or a CUDA tensor without CuPy.

    See Also
    --------
    TwELLMatrix.to_torch : the storage arrays as tensors.
    from_torch_parts : a matrix from storage tensors.
    torch.Tensor.to_sparse_csr : torch's own sparse conversion.

    Notes
    -----
    Nothing is copied on the way in: the array twell packs is the tensor's
    memory. As for NumPy and CuPy input, the constructor makes a
    non-contiguous (e.g. transposed) tensor contiguous with one copy, and a
    ``dtype`` other than the tensor's casts with one. A tensor that requires
    grad is detached: gradients do not flow through twell.

    Examples
    --------
    >>> import torch, twell                                    # doctest: +SKIP
    >>> t = torch.relu(torch.randn(4, 512) - 2)                # doctest: +SKIP
    >>> a = twell.from_torch(t, slots=4)                       # doctest: +SKIP
    >>> bool((twell.to_torch(a.toarray()) == t).all())         # doctest: +SKIP
    True
    """
    torch = _torch()
    x = _tensor_to_array(torch, tensor, "tensor")
    check_dense(x, "tensor")  # the constructor's checks, with errors that name the tensor
    return TwELLMatrix(x, tile_width=tile_width, slots=slots, dtype=_value_dtype(torch, dtype))


def from_torch_parts(parts, shape, tile_width=_layout.GEMM_TILE_WIDTH):
    """A TwELLMatrix from its six storage arrays as torch tensors, sharing their memory.

    The inverse of :meth:`TwELLMatrix.to_torch`:
    ``twell.from_torch_parts(A.to_torch(), A.shape, A.tile_width)`` is ``A``
    again, on the same memory.

    Parameters
    ----------
    parts : TorchParts or tuple of 6 torch.Tensor
        ``(counts, data, indices, overflow_indptr, overflow_indices,
        overflow_data)`` with the dtypes of :class:`TorchParts`, all on the
        CPU or all on one CUDA device, C-contiguous.
    shape : tuple of int
        ``(M, K)``.
    tile_width : int, optional
        Columns per tile. Default 256.

    Returns
    -------
    TwELLMatrix
        NumPy-backed for CPU tensors, CuPy-backed for CUDA tensors; its storage
        arrays are the tensors' memory.

    Raises
    ------
    TypeError
        ``parts`` is not a sequence of torch tensors, or a tensor has the
        wrong dtype (``indices`` must be ``torch.uint16``, or ``torch.int32`` for
        tiles wider than 65536 columns: view an int16 tensor with
        ``.view(torch.uint16)``).
    ValueError
        Tensors on different devices, not six of them, or storage that breaks
        an invariant of the format (:meth:`TwELLMatrix.validate`; this
        synchronises with the host on the GPU).

    See Also
    --------
    TwELLMatrix : the constructor, which takes the six arrays as NumPy/CuPy arrays.

    Notes
    -----
    This is the constructor's tuple form, ``TwELLMatrix((counts, ...),
    shape=shape, tile_width=tile_width)``, on the arrays that share the
    tensors' memory: nothing is copied, and the arrays are checked as that
    form checks them. The matrix and the tensors then see each other's writes;
    a write that breaks the format's invariants is not detected until the next
    :meth:`TwELLMatrix.validate`. Tensors that require grad are detached.

    Examples
    --------
    >>> import numpy as np, twell                              # doctest: +SKIP
    >>> a = twell.TwELLMatrix(np.eye(3, 300, dtype=np.float32))  # doctest: +SKIP
    >>> parts = a.to_torch()                                   # doctest: +SKIP
    >>> b = twell.from_torch_parts(parts, a.shape, a.tile_width)  # doctest: +SKIP
    >>> b.counts.ctypes.data == parts.counts.data_ptr()        # doctest: +SKIP
    True
    """
    torch = _torch()
    if isinstance(parts, torch.Tensor) or not isinstance(parts, (tuple, list)):
        raise TypeError(
            f"parts must be a tuple of the {len(Parts._fields)} storage tensors "
            f"{Parts._fields}; got {type(parts).__name__} (twell.from_torch packs a dense "
            "tensor)"
        )
    if len(parts) != len(Parts._fields):
        raise ValueError(
            f"parts must be a tuple of the {len(Parts._fields)} storage arrays "
            f"{Parts._fields}; got a tuple of {len(parts)}"
        )
    names = [f"parts.{name}" for name in Parts._fields]
    for tensor, name in zip(parts, names, strict=True):
        _check_tensor(torch, tensor, name)
    devices = sorted({str(t.device) for t in parts})
    if len(devices) > 1:
        raise ValueError(f"parts must all be on one device; got tensors on {', '.join(devices)}")
    arrays = tuple(_tensor_to_array(torch, t, name) for t, name in zip(parts, names, strict=True))
    return TwELLMatrix(arrays, shape=shape, tile_width=tile_width)
