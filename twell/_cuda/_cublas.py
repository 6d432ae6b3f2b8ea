"""cuBLAS GEMMs that a CUDA graph can capture: twell's own handle, called through ctypes.

CuPy refuses every cuBLAS call while the current stream is being captured (its ``setStream``
raises NotImplementedError), although cuBLAS itself records its kernels in a capture when
the handle has a workspace of its own, so that no call allocates, and its scalars are host
values, read when the call is made. twell's handle, one per device, is made that way at the
first call (outside any capture), and the calls here set its stream to CuPy's current one
each time. Used by the gated layer's up projection and by the dense way of the layer's
down projection (:func:`._ffn.sparse_ffn_without_sync`), eagerly as in a capture, so that
both give the same bits.
"""

import ctypes
import functools
import os

import numpy as np

#: Workspace of twell's handle on each device, in bytes (cuBLAS asks for up to 32 MiB on
#: Hopper); allocated once, kept for the process.
WORKSPACE_BYTES = 32 << 20

#: cudaDataType_t (library_types.h) and the cuBLAS constants used here (cublas_api.h).
_CUDA_R = {"float16": 2, "bfloat16": 14, "float32": 0}
_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1


@functools.cache
def _library():
    """The libcublas that CuPy loaded (found in the process's mappings), else the first
    that loads by name."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads CuPy's libcublas

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libcublas.so"):
                    return _typed(ctypes.CDLL(path))
    except OSError:
        pass
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so", "cublas64_13.dll",
                 "cublas64_12.dll"):
        try:
            return _typed(ctypes.CDLL(name))
        except OSError:
            continue
    raise RuntimeError("libcublas could not be loaded through ctypes")


def _typed(lib):
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for name, args in (("cublasCreate_v2", [ctypes.POINTER(p)]),
                       ("cublasSetWorkspace_v2", [p, p, s]),
                       ("cublasSetStream_v2", [p, p]),
                       ("cublasGemmEx", [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i,
                                         i])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, i
    return lib


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


@functools.cache
def _handle(device_id):
    """twell's cuBLAS handle on a device, with its own workspace (made once, kept)."""
    import cupy

    lib = _library()
    with cupy.cuda.Device(device_id):
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        workspace = cupy.cuda.runtime.malloc(WORKSPACE_BYTES)
        _check(lib.cublasSetWorkspace_v2(handle, workspace, WORKSPACE_BYTES),
               "cublasSetWorkspace")
    return handle


_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)


def gemm(a, b, out, trans_b=False):
    """``out = a @ b`` (``a @ b.T`` with ``trans_b``) for 2-D CuPy arrays: ``a`` and ``b`` of
    one 16-bit dtype (products on tensor cores) or float32 (``CUBLAS_COMPUTE_32F``: never
    TF32), ``out`` of it or float32, products accumulated in float32, queued on CuPy's
    current stream. Dimensions below 2**31.

    ``b`` and ``out`` are C-contiguous; ``a``'s rows are contiguous and may lie apart (a view
    ``x[::step]`` is read in place, its row stride the GEMM's leading dimension)."""
    import cupy

    m, k = a.shape
    lda = a.strides[0] // a.itemsize if m > 1 else k
    n = b.shape[0] if trans_b else b.shape[1]
    if out.size == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    limit = np.iinfo(np.int32).max
    if max(m, n, k, lda) > limit:
        raise ValueError(f"cuBLAS takes dimensions and row strides up to {limit}; got "
                         f"a.shape={a.shape}, a's row stride {lda}, b.shape={b.shape}")
    if (k > 1 and a.strides[1] != a.itemsize) or lda < k or a.strides[0] % a.itemsize:
        raise ValueError(f"a's rows must be contiguous and apart by whole rows; got "
                         f"a.shape={a.shape}, a.strides={a.strides}")
    lib, handle = _library(), _handle(cupy.cuda.Device().id)
    _check(lib.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr),
           "cublasSetStream")
    dtype, out_dtype = _CUDA_R[a.dtype.name], _CUDA_R[out.dtype.name]
    # Column-major view of the row-major product: out^T (n x m) = op(b)^T-view @ a^T-view.
    _check(lib.cublasGemmEx(handle, _OP_T if trans_b else _OP_N, _OP_N, n, m, k,
                            _ONE.ctypes.data, b.data.ptr, dtype, k if trans_b else n,
                            a.data.ptr, dtype, lda, _ZERO.ctypes.data, out.data.ptr,
                            out_dtype, n, _COMPUTE_32F, _GEMM_DEFAULT), "cublasGemmEx")
    return out


def matmul(a, b):
    """``a @ b`` in ``a``'s dtype by :func:`gemm`, for the 16-bit products the GEMM takes,
    else ``cupy.matmul``."""
    import cupy

    if (a.dtype == b.dtype and a.dtype.name in ("float16", "bfloat16")
            and a.flags.c_contiguous and b.flags.c_contiguous):
        return gemm(a, b, cupy.empty((a.shape[0], b.shape[1]), dtype=a.dtype))
    return cupy.matmul(a, b)
