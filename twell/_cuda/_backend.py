"""The CuPy backend: the functions of the backend contract (:mod:`twell._contract`), each
from the launcher module of its kernel family."""

import cupy

from .._algorithms import register_scan
from ._canonical import canonical_csr
from ._cast import cast
from ._ffn import (
    gated_ffn_by_sample,
    gated_up,
    matmul_pack,
    matmul_pack_auto,
    matmul_pack_supported,
)
from ._pack import pack_csr, pack_dense, tile_counts_csr, tile_counts_dense
from ._reduce import count_histogram, exclusive_scan
from ._spmm import spmm, spmv
from ._unpack import to_csr, to_dense

register_scan(cupy, exclusive_scan)

__all__ = [
    "canonical_csr",
    "cast",
    "count_histogram",
    "exclusive_scan",
    "gated_ffn_by_sample",
    "gated_up",
    "matmul_pack",
    "matmul_pack_auto",
    "matmul_pack_supported",
    "pack_csr",
    "pack_dense",
    "spmm",
    "spmv",
    "tile_counts_csr",
    "tile_counts_dense",
    "to_csr",
    "to_dense",
]
