"""Tensor maps for the TMA loads of the Hopper kernels (``cuda_src/tma.cuh``).

The fused GEMM of ``matmul_pack_sm90.cu`` reads its operands with TMA loads, which take a
tensor map that :func:`tensor_map_2d` encodes on the host through the driver's
``cuTensorMapEncodeTiled`` (CuPy does not wrap it).
"""

import ctypes
import functools

import numpy as np

from ._compile import driver_entry

#: cuTensorMapEncodeTiled's enum values (cuda.h, CUDA 12): the element types by NumPy dtype
#: name, no interleave, 128-byte swizzle, 256-byte L2 promotion, zeros for out-of-bounds
#: elements.
_TMAP_DTYPES = {"float16": 6, "bfloat16": 9}
_TMAP_INTERLEAVE_NONE, _TMAP_SWIZZLE_128B, _TMAP_L2_256B, _TMAP_OOB_ZERO = 0, 3, 3, 0
#: Bytes of a CUtensorMap; the driver writes it to a 64-byte aligned address.
TENSOR_MAP_BYTES = 128


@functools.cache
def _encode_tiled():
    """The driver's ``cuTensorMapEncodeTiled`` through ctypes, or None where the driver library
    or the entry point (CUDA 12+) is missing."""
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    return driver_entry("cuTensorMapEncodeTiled",
                        [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p,
                         ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(u32),
                         ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                         ctypes.c_int])


def tensor_maps_supported():
    """Whether :func:`tensor_map_2d` can encode tensor maps here (a CUDA 12+ driver)."""
    return _encode_tiled() is not None


def tensor_map_2d(array, box_cols, box_rows):
    """The tensor map of a C-contiguous 2-D float16 or bfloat16 CuPy array, for TMA loads of
    ``box_rows x box_cols`` boxes with a 128-byte swizzle and zeros past the array's edges.

    Returned as a size-one NumPy array of 128 bytes, which CuPy passes to a kernel by value
    (the kernel takes it as a ``__grid_constant__ TensorMap``, ``cuda_src/tma.cuh``). The
    array's address is 16-byte aligned and its row pitch a multiple of 16 bytes (the
    callers check both). A driver error is a RuntimeError naming the array's shape.
    """
    rows, cols = array.shape
    return _tensor_map(_TMAP_DTYPES[array.dtype.name], array.data.ptr, rows, cols,
                       cols * array.itemsize, box_cols, box_rows)


@functools.lru_cache(maxsize=256)
def _tensor_map(element, address, rows, cols, pitch, box_cols, box_rows):
    """:func:`tensor_map_2d`'s map, kept per argument tuple: the map holds nothing but these
    numbers (no device, no contents), so a kept one equals a new encoding for any array at
    that address with that shape, and the weights of a layer, called again and again, are
    encoded once (an encoding costs the host about as much as a launch, while the GPU
    waits). Read-only."""
    encode = _encode_tiled()
    if encode is None:
        raise RuntimeError("cuTensorMapEncodeTiled is not available (a CUDA 12+ driver is "
                           "needed for TMA)")
    raw = (ctypes.c_uint8 * (2 * TENSOR_MAP_BYTES))()
    buffer = ctypes.addressof(raw)
    aligned = buffer + (-buffer) % 64
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    result = encode(
        ctypes.c_void_p(aligned), element, 2, ctypes.c_void_p(address),
        (u64 * 2)(cols, rows), (u64 * 1)(pitch), (u32 * 2)(box_cols, box_rows),
        (u32 * 2)(1, 1), _TMAP_INTERLEAVE_NONE, _TMAP_SWIZZLE_128B, _TMAP_L2_256B,
        _TMAP_OOB_ZERO)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {result} on an array "
                           f"of shape {(rows, cols)}")
    encoded = np.frombuffer(ctypes.string_at(aligned, TENSOR_MAP_BYTES),
                            dtype=np.dtype((np.void, TENSOR_MAP_BYTES)))
    encoded.flags.writeable = False
    return encoded
