"""twell: TwELL (Tile-wise ELLPACK) sparse matrices for NumPy and CuPy.

TwELL splits the columns of a matrix into tiles of ``tile_width`` columns and
stores, for every (row, tile), up to ``slots`` non-zeros ELLPACK-style; the
rest go, losslessly, to a CSR overflow part. The same API runs on NumPy
(host) and CuPy (GPU) arrays; the backend follows the data.

Public API
----------
TwELLMatrix, ELLMatrix, from_packed, auto_slots, auto_tile_width, bfloat16, cuda_available,
matmul_to_twell, sparse_ffn, save, load; PyTorch interop (torch is optional):
from_torch, to_torch, from_torch_parts, from_torch_array, TorchParts.

Imported on their own: twell.torch (PyTorch modules of sparse feed-forward layers),
twell.dask (row blocks for Dask) and twell.plot (pictures of the layout, with matplotlib).
"""

from ._arrays import cupy_available as cuda_available
from ._dlpack import TorchParts, from_torch_array, to_torch
from ._dtypes import SUPPORTED_DTYPES, bfloat16
from ._ell import ELLMatrix
from ._ffn import matmul_to_twell, sparse_ffn
from ._io import load, save
from ._layout import (
    AUTO_MAX_FACTOR,
    AUTO_OVERFLOW_FRACTION,
    GEMM_TILE_WIDTH,
    ONE_TILE_PADDING,
    ONE_TILE_SLOT_BYTES,
    STORAGE_BUDGET,
    auto_slots,
    auto_tile_width,
)
from ._torch import from_torch, from_torch_parts
from ._twell import TwELLMatrix
from ._version import __version__

from_packed = TwELLMatrix.from_packed

__all__ = [
    "AUTO_MAX_FACTOR",
    "AUTO_OVERFLOW_FRACTION",
    "ELLMatrix",
    "GEMM_TILE_WIDTH",
    "ONE_TILE_PADDING",
    "ONE_TILE_SLOT_BYTES",
    "STORAGE_BUDGET",
    "SUPPORTED_DTYPES",
    "TorchParts",
    "TwELLMatrix",
    "__version__",
    "auto_slots",
    "auto_tile_width",
    "bfloat16",
    "cuda_available",
    "from_packed",
    "from_torch",
    "from_torch_array",
    "from_torch_parts",
    "load",
    "matmul_to_twell",
    "save",
    "sparse_ffn",
    "to_torch",
]
