"""PyTorch interop through DLPack: torch tensors in and out, sharing memory.

torch is imported inside the functions that need it, never at module level:
``import twell`` works, and everything but these functions runs, without
PyTorch installed.

Every exchange is ``from_dlpack`` on the receiving side (``numpy.from_dlpack``
for CPU tensors, ``cupy.from_dlpack`` for CUDA tensors, ``torch.from_dlpack``
for arrays), so the memory is shared, not copied. On the GPU the DLPack stream
protocol orders the receiver's current stream after the producer's; nothing
synchronises with the host.

Some types cross as an integer view of the same width, a reinterpretation on
both sides that copies nothing:

* bfloat16 as int16: NumPy and CuPy take no DLPack bfloat16 (twell's bfloat16
  is the ml_dtypes type), so the bits cross and each side views them as its
  own bfloat16;
* uint16, uint32 and uint64 as int16, int32 and int64: the signed types are
  the ones every DLPack producer and consumer reads, whatever their release;
  torch then views them as ``torch.uint16``/``uint32``/``uint64`` (torch 2.3
  or newer has these);
* bool as uint8, for the same reason.

An empty array or tensor has no memory to share: it arrives as a new empty one
(DLPack's null data pointers trip some importers).
"""

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import _arrays
from ._base import SparseMatrix
from ._dtypes import SUPPORTED_DTYPES, bfloat16

if TYPE_CHECKING:  # annotations only: torch stays optional
    import torch

#: NumPy dtypes that cross DLPack as they are.
_DIRECT = frozenset(np.dtype(d) for d in (
    np.float64, np.float32, np.float16, np.complex128, np.complex64,
    np.int64, np.int32, np.int16, np.int8, np.uint8))

#: NumPy dtypes that cross DLPack as an integer view of the same width (see the module notes).
_CARRIED = {bfloat16: np.dtype(np.int16), np.dtype(np.bool_): np.dtype(np.uint8),
            np.dtype(np.uint16): np.dtype(np.int16), np.dtype(np.uint32): np.dtype(np.int32),
            np.dtype(np.uint64): np.dtype(np.int64)}

#: Every dtype that crosses, by name: torch names each of them as NumPy does
#: (``torch.float32``, ``torch.bfloat16``, ``torch.bool``, ``torch.uint16``, ...).
_BY_NAME = {d.name: d for d in (*_DIRECT, *_CARRIED)}


class TorchParts(NamedTuple):
    """The six storage arrays of a TwELL matrix as torch tensors.

    Returned by :meth:`TwELLMatrix.to_torch`; :func:`twell.from_torch_parts`
    turns it (or any tuple of six such tensors) back into a matrix. The field
    names and order are those of the storage arrays of :class:`TwELLMatrix`.

    Attributes
    ----------
    counts : torch.Tensor of torch.int32, shape (M, n_tiles)
    data : torch.Tensor, shape (M, n_tiles, slots)
        torch.float64, float32, float16 or bfloat16, as the matrix.
    indices : torch.Tensor of torch.uint16, shape (M, n_tiles, slots)
        torch.int32 for tiles wider than 65536 columns.
    overflow_indptr : torch.Tensor of torch.int64, shape (M + 1,)
    overflow_indices : torch.Tensor of torch.int32, shape (overflow_nnz,)
    overflow_data : torch.Tensor, shape (overflow_nnz,)
        The dtype of ``data``.
    """

    counts: "torch.Tensor"
    data: "torch.Tensor"
    indices: "torch.Tensor"
    overflow_indptr: "torch.Tensor"
    overflow_indices: "torch.Tensor"
    overflow_data: "torch.Tensor"


def _torch():
    """The ``torch`` module, or an ImportError that says twell does not need it otherwise."""
    try:
        import torch
    except ImportError:
        raise ImportError(
            "this operation needs PyTorch (pip install torch); the rest of twell works "
            "without it"
        ) from None
    return torch


def _check_tensor(torch, tensor, name):
    """The array module a tensor crosses to; TypeError/ValueError for what cannot cross."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(
            f"{name} must be a dense (strided) tensor; got {name}.layout={tensor.layout} "
            f"(convert with {name}.to_dense())"
        )
    if tensor.device.type == "cpu":
        return np
    if tensor.device.type == "cuda":
        return _arrays.cupy_module()
    raise ValueError(
        f"{name} must be on the CPU or a CUDA device; got {name}.device={tensor.device}"
    )


def _tensor_to_array(torch, tensor, name):
    """``from_torch_array`` with the tensor's name for the error messages."""
    xp = _check_tensor(torch, tensor, name)
    dtype = _BY_NAME.get(str(tensor.dtype).removeprefix("torch."))
    if dtype is None:
        values = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"{name}.dtype={tensor.dtype} has no NumPy/CuPy equivalent; convert with "
            f"{name}.to(torch.float32) (twell's values are {values})"
        )
    if tensor.numel() == 0:
        # Nothing to share (see the module notes).
        if xp is np:
            return np.empty(tuple(tensor.shape), dtype=dtype)
        with xp.cuda.Device(tensor.device.index):
            return xp.empty(tuple(tensor.shape), dtype=dtype)
    # DLPack refuses tensors that require grad, and tensors whose conjugation or negation
    # is a pending flag (complex views); both calls return the tensor itself otherwise.
    tensor = tensor.detach().resolve_conj().resolve_neg()
    carrier = _CARRIED.get(dtype)
    if carrier is None:
        return xp.from_dlpack(tensor)
    return xp.from_dlpack(tensor.view(getattr(torch, carrier.name))).view(dtype)


def from_torch_array(tensor):
    """A torch tensor -> the NumPy (CPU) or CuPy (CUDA) array that shares its memory.

    The inverse of :func:`twell.to_torch`, for operands twell takes as arrays:
    the right-hand side of ``A @ B``, the weights of :func:`twell.sparse_ffn`,
    the packed words for :func:`twell.from_packed`.

    Parameters
    ----------
    tensor : torch.Tensor
        Dense (strided), on the CPU or a CUDA device; any shape and strides.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        Same shape, strides and values, on the tensor's GPU for a CUDA tensor.
        The dtype is NumPy's equivalent: ``torch.bfloat16`` gives
        ``twell.bfloat16``, ``torch.uint32`` gives ``numpy.uint32``, and so on.

    Raises
    ------
    TypeError
        Not a dense torch tensor, or a dtype NumPy/CuPy has no equivalent for
        (float8 types, complex32, quantized types, ...).
    ValueError
        A tensor on a device other than the CPU or CUDA.
    ImportError
        Without PyTorch, or a CUDA tensor without CuPy.

    See Also
    --------
    numpy.from_dlpack, cupy.from_dlpack : what this calls, after the bfloat16/unsigned views.

    Notes
    -----
    Zero copy: the array's pointer is ``tensor.data_ptr()``, and writes through
    either are seen by the other. A tensor that requires grad is detached
    first: the array is outside autograd.

    Examples
    --------
    >>> import torch, twell                                    # doctest: +SKIP
    >>> w = torch.ones(3, 2, dtype=torch.bfloat16)             # doctest: +SKIP
    >>> twell.from_torch_array(w).dtype                        # doctest: +SKIP
    dtype(bfloat16)
    """
    torch = _torch()
    return _tensor_to_array(torch, tensor, "tensor")


def to_torch(array):
    """A NumPy or CuPy array -> the torch tensor that shares its memory.

    Parameters
    ----------
    array : numpy.ndarray or cupy.ndarray
        Any array twell returns: the dense result of ``A @ B``,
        ``A.toarray()``, ``A.to_packed()``, a storage array, ... A NumPy
        scalar (``A.sum()`` on the host) is accepted too.

    Returns
    -------
    torch.Tensor
        Same shape, strides and values, on the CPU for NumPy arrays and on the
        array's GPU for CuPy arrays. The dtype is torch's equivalent:
        ``twell.bfloat16`` gives ``torch.bfloat16``, uint16/uint32/uint64 give
        ``torch.uint16``/``uint32``/``uint64``.

    Raises
    ------
    TypeError
        Not a NumPy or CuPy array (a TwELLMatrix's arrays come from
        :meth:`TwELLMatrix.to_torch`), or a dtype torch has no equivalent for.
    ValueError
        An array with negative strides (``x[::-1]``), which no tensor has.
    ImportError
        Without PyTorch.

    See Also
    --------
    torch.from_dlpack : what this calls, after the bfloat16/unsigned views.
    TwELLMatrix.to_torch : the six storage arrays at once.

    Notes
    -----
    Zero copy: the tensor's ``data_ptr()`` is the array's pointer, and writes
    through either are seen by the other. The tensor keeps the array's memory
    alive. A NumPy scalar has no memory to share and is copied into a 0-d
    tensor.

    ``twell.to_torch(A.to_packed(compression))`` is the packed layout of the
    reference TwELL kernels (SakanaAI/sparser-faster-llms) as they take it: a
    C-contiguous ``torch.uint32`` tensor of shape ``(M, K // compression)``,
    on the GPU when ``A`` is.

    Examples
    --------
    >>> import numpy as np, torch, twell                       # doctest: +SKIP
    >>> a = twell.TwELLMatrix(np.eye(4, 512, dtype=twell.bfloat16))  # doctest: +SKIP
    >>> y = twell.to_torch(a @ np.ones((512, 2), twell.bfloat16))  # doctest: +SKIP
    >>> y.dtype, tuple(y.shape)                                # doctest: +SKIP
    (torch.bfloat16, (4, 2))
    >>> w = twell.to_torch(a.to_packed())                      # doctest: +SKIP
    >>> w.dtype, tuple(w.shape)                                # doctest: +SKIP
    (torch.uint32, (4, 64))
    """
    torch = _torch()
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not (isinstance(array, np.ndarray) or _arrays.is_cupy_array(array)):
        hint = (" (A.to_torch() gives a matrix's storage arrays, twell.to_torch(A.toarray()) "
                "its dense values)" if isinstance(array, SparseMatrix) else "")
        raise TypeError(f"array must be a NumPy or CuPy array; got {type(array).__name__}{hint}")
    dtype = array.dtype
    if dtype not in _BY_NAME.values():
        raise TypeError(
            "array.dtype must be a numeric type torch holds (floats, complex, integers, bool, "
            f"bfloat16) in native byte order; got array.dtype={dtype}"
        )
    target = getattr(torch, dtype.name, None)
    if target is None:
        raise TypeError(
            f"torch {torch.__version__} has no torch.{dtype.name} (torch 2.3 added uint16, "
            "uint32 and uint64); upgrade torch or cast the array"
        )
    if any(stride < 0 for stride in array.strides):
        raise ValueError(
            f"array has negative strides {array.strides} (a reversed view), which torch tensors "
            "cannot have; copy it first with ascontiguousarray"
        )
    if array.size == 0:
        # Nothing to share (see the module notes).
        device = "cpu" if isinstance(array, np.ndarray) else torch.device("cuda", array.device.id)
        return torch.empty(array.shape, dtype=target, device=device)
    carrier = _CARRIED.get(dtype)
    if carrier is None:
        return torch.from_dlpack(array)
    return torch.from_dlpack(array.view(carrier)).view(target)


def parts_to_torch(parts):
    """Storage arrays as a :class:`TorchParts` of tensors (see ``TwELLMatrix.to_torch``)."""
    return TorchParts(*(to_torch(x) for x in parts))
