"""Launchers of ``cuda_src/ffn.cu`` and ``cuda_src/matmul_pack_sm90.cu``: the GEMM that
writes its output in TwELL (``relu(x @ w.T)`` packed in its epilogue) and the gated
feed-forward layer's up projection taken at the gate's entries.
"""

from typing import NamedTuple

import cupy
import numpy as np

from .. import _layout
from .._arguments import check_storage
from . import _compile, _policy, _tma
from ._launch import (
    BLOCK,
    WARPS,
    aligned,
    blocks,
    empty_parts,
    i32,
    i64,
    instance,
    no_overflow,
    overflow_counter,
    vector_for,
    with_overflow,
)
from ._reduce import count_buffer, overflow_offsets, read_counts

#: Block tile of twell_matmul_pack and twell_matmul_pack_sm90_* (rows, columns) and their
#: dynamic shared memory in bytes: 3 (4) pipeline stages of a 128 x 64 and a 256 x 64 tile of
#: 16-bit values; the Hopper kernel adds its 8 mbarriers and aligns its tiles to 1024 bytes by
#: hand (+1024 of slack). The Hopper kernel runs 288 threads (a producer warp), the other 256.
_MATMUL_TILE = (128, 256)
_MATMUL_SMEM = 3 * (128 + 256) * 64 * 2
_MATMUL_SM90_SMEM = 4 * (128 + 256) * 64 * 2 + 2 * 4 * 8 + 1024
_MATMUL_THREADS = {"mma": 256, "sm90": 288}
_SM90_KERNELS = {"bfloat16": "twell_matmul_pack_sm90_bf16", "float16": "twell_matmul_pack_sm90_f16"}
#: Depth of a k tile of the GEMM: the Hopper kernel's x and w boxes are 64 columns wide.
_MATMUL_DEPTH = 64

def matmul_pack_supported(x, w, tile_width):
    """Whether twell_matmul_pack computes ``relu(x @ w.T)`` for these operands.

    Both float16 or both bfloat16, C-contiguous and 16-byte aligned, ``K % 8 == 0`` (whole
    16-byte chunks of each row) and a tile width in {8, 16, ..., 256} (a divisor of the
    kernel's 256 columns, so that a (row, tile) pair never spans two blocks).
    """
    return (x.dtype == w.dtype and x.dtype in _compile.HALF_DTYPES and x.shape[1] % 8 == 0
            and 8 <= tile_width <= _MATMUL_TILE[1] and _MATMUL_TILE[1] % tile_width == 0
            and x.flags.c_contiguous and w.flags.c_contiguous and aligned(x, w))


def _matmul_operands(x, w, variant):
    """The kernel, its operand arguments and its shared memory for ``variant``."""
    if variant == "sm90":
        bm, bn = _MATMUL_TILE
        maps = (_tma.tensor_map_2d(x, _MATMUL_DEPTH, bm), _tma.tensor_map_2d(w, _MATMUL_DEPTH, bn))
        kernel = _compile.function(_policy.SM90_SOURCE, _SM90_KERNELS[x.dtype.name])
        return kernel, maps, _MATMUL_SM90_SMEM
    kernel = _compile.function("ffn.cu", instance("twell_matmul_pack", x.dtype))
    return kernel, (x, w), _MATMUL_SMEM


class MatmulPlan(NamedTuple):
    """The kernel variant and buffers of one fused GEMM -> TwELL call that do not depend on
    the slots (:func:`matmul_plan`)."""

    variant: str  # "sm90" or "mma"
    totals: object  # int32 (M, n_tiles): every pair's entries, slots or not
    spill_start: object  # int64 (M, n_tiles): where a pair's entries past the slots went
    spill_capacity: int
    spill_indices: object
    spill_data: object


def matmul_plan(x, w, tile_width):
    """The slot-independent buffers of a fused call on ``x``, ``w`` at ``tile_width``: the
    kernel variant (:func:`._policy.matmul_variant`), totals, spill starts and the spill
    buffer (:func:`._policy.spill_capacity` entries).

    The operands pass :func:`matmul_pack_supported`. No host synchronisation.
    """
    return _plan(x, w, tile_width, _policy.matmul_variant(x, w),
                 _policy.spill_capacity(x.shape[0], w.shape[0]))


def _plan(x, w, tile_width, variant, spill_capacity):
    m = x.shape[0]
    nt = _layout.n_tiles(w.shape[0], tile_width)
    return MatmulPlan(variant, cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE),
                      cupy.empty((m, nt), dtype=np.int64), spill_capacity,
                      *_spill_buffers(spill_capacity, x.dtype))


def _spill_buffers(capacity, dtype):
    """Column indices and values of ``capacity`` spilled entries (uninitialised)."""
    return (cupy.empty(capacity, dtype=_layout.OVERFLOW_INDEX_DTYPE),
            cupy.empty(capacity, dtype=dtype))


def _launch_matmul_pack(x, w, variant, tile_width, slots, totals, parts, spill_start,
                        spill_capacity, spill_indices, spill_data, counter=None, zero_fill=True):
    """One launch of the fused kernel; returns its overflow counter (a device array:
    ``counter``, zeroed, or a new one). ``zero_fill=False`` leaves the slots past each pair's
    count unwritten, for a caller that reads only the counted ones."""
    m, k = x.shape
    n = w.shape[0]
    kernel, operands, smem = _matmul_operands(x, w, variant)
    kernel.max_dynamic_shared_size_bytes = smem
    bm, bn = _MATMUL_TILE
    counter = overflow_counter() if counter is None else counter
    # Blocks: one 128 x 256 output tile each, the column tiles of a row block consecutive.
    kernel((-(-m // bm) * -(-n // bn),), (_MATMUL_THREADS[variant],), (
        *operands, i64(m), i64(n), i64(k), i32(tile_width), i32(slots),
        i32(zero_fill), totals,
        parts.counts, parts.data, parts.indices, spill_start, spill_indices, spill_data,
        i64(spill_capacity), counter), shared_mem=smem)
    return counter


def matmul_pack(x, w, tile_width, slots):
    """``relu(x @ w.T)`` packed into TwELL parts by a fused GEMM -> TwELL kernel: returns
    ``(parts, nnz)``.

    The operands pass :func:`matmul_pack_supported`. Products accumulate in float32 and
    round once to the inputs' dtype; the dense product is never written to global memory.
    A device of compute capability 9.0 (H100/H200) runs ``twell_matmul_pack_sm90_bf16`` or
    ``_f16`` (wgmma fed by TMA), every other ``twell_matmul_pack`` (mma.sync); both give the
    same bits. Synchronises once with the host (the overflow size and the histogram of the
    per-tile totals, which gives ``nnz``), twice when the spill buffer was too small and the
    kernel reruns.
    """
    return _matmul_pack(matmul_plan(x, w, tile_width), x, w, tile_width, slots)


def _matmul_pack(plan, x, w, tile_width, slots):
    """:func:`matmul_pack` with the buffers and kernel of ``plan``."""
    m, nt = plan.totals.shape
    # The overflow part is made after the launch: the GPU need not wait for it.
    parts = empty_parts(m, nt, slots, x.dtype, zeroed=False, overflow=False)
    if m * nt == 0:
        return no_overflow(parts), 0
    capacity, spill_indices, spill_data = plan.spill_capacity, plan.spill_indices, plan.spill_data
    while True:
        both, counter = count_buffer(tile_width)
        _launch_matmul_pack(x, w, plan.variant, tile_width, slots, plan.totals, parts,
                            plan.spill_start, capacity, spill_indices, spill_data,
                            counter=counter)
        without = no_overflow(parts)  # made while the kernel runs
        hist, n_over = read_counts(both, plan.totals, tile_width)
        if n_over <= capacity:
            break
        # A rerun gets a buffer of exactly the size counted: the same product spills
        # exactly that much again, so nothing is dropped.
        capacity = n_over
        spill_indices, spill_data = _spill_buffers(capacity, x.dtype)
    nnz = _layout.histogram_nnz(hist)
    if n_over == 0:
        return without, nnz
    offset, row_starts = overflow_offsets(plan.totals, slots)
    parts = with_overflow(parts, row_starts, n_over)
    move = _compile.function("ffn.cu", instance("twell_spill_to_overflow", x.dtype))
    # One warp per 32 consecutive (row, tile) pairs.
    move(blocks(-(-m * nt // 32), WARPS), (BLOCK,), (
        plan.totals, i64(m * nt), i32(slots), plan.spill_start, spill_indices, spill_data,
        offset, parts.overflow_indices, parts.overflow_data))
    return parts, nnz


#: ``matmul_pack_auto`` packs at ``tile_width // _PROVISIONAL_SHARE`` slots before it knows
#: the counts: room for 12.5% non-zeros, past any slot count that ``slots="auto"`` picks for
#: a ReLU product at 90-99.9% sparsity (32 at tile width 256; 90% picks ~32, 99% ~6), with
#: the rest in the spill buffer.
_PROVISIONAL_SHARE = 8


def matmul_pack_auto(x, w, tile_width):
    """``relu(x @ w.T)`` packed with ``slots="auto"`` picked from its own per-tile counts.

    Returns ``(parts, slots, nnz)``. One fused launch packs the product at a provisional slot
    count (``tile_width // 8``, lowered to fit ``MAX_STORED_SLOTS``; entries past it spill;
    the empty slots are left unwritten), then the histogram of its totals gives
    :func:`twell._layout.auto_slots`, the overflow size and the entry count, read with the
    spill counter in one synchronisation, and ``twell_reslot`` moves every entry to its slot
    or overflow place. When the provisional spill did not fit its buffer (a dense product:
    more than 1/64 of the outputs past the provisional slots), the histogram is whole all the
    same, and :func:`matmul_pack` runs once more straight at the chosen slots with a spill
    buffer of exactly their overflow: never a third launch. The slots are those that
    ``TwELLMatrix`` picks for the dense product, and the result has the bits of
    :func:`matmul_pack` with them. Besides the result it holds the provisional layout
    (4 bytes per slot) until it returns.
    """
    m, n = x.shape[0], w.shape[0]
    nt = _layout.n_tiles(n, tile_width)
    if m * nt == 0:
        return empty_parts(m, nt, 1, x.dtype), 1, 0
    provisional = max(1, min(tile_width // _PROVISIONAL_SHARE,
                             _layout.MAX_STORED_SLOTS // (m * nt)))
    plan = matmul_plan(x, w, tile_width)
    parts = empty_parts(m, nt, provisional, x.dtype, zeroed=False, overflow=False)
    both, counter = count_buffer(tile_width)
    _launch_matmul_pack(x, w, plan.variant, tile_width, provisional, plan.totals, parts,
                        plan.spill_start, plan.spill_capacity, plan.spill_indices,
                        plan.spill_data, counter=counter,
                        zero_fill=False)  # twell_reslot reads the counted slots only
    hist, spilled = read_counts(both, plan.totals, tile_width)
    slots, n_over, nnz = _layout.auto_choice(hist, tile_width)
    check_storage((m, n), tile_width, slots)
    if spilled > plan.spill_capacity:
        # A second launch at the chosen slots, with a spill buffer of exactly their overflow.
        variant = plan.variant
        del parts, plan  # freed before the second launch allocates its own
        rerun = _plan(x, w, tile_width, variant, max(n_over, 1))
        return _matmul_pack(rerun, x, w, tile_width, slots)[0], slots, nnz
    result = empty_parts(m, nt, slots, x.dtype, zeroed=False, overflow=False)
    if n_over:
        offset, row_starts = overflow_offsets(plan.totals, slots)
        result = with_overflow(result, row_starts, n_over)
    else:
        offset, result = None, no_overflow(result)
    kernel = _compile.function("ffn.cu", instance("twell_reslot", x.dtype))
    kernel(blocks(m * nt, BLOCK), (BLOCK,), (
        plan.totals, i64(m * nt), i64(nt), i32(tile_width), i32(provisional), parts.data,
        parts.indices, plan.spill_start, plan.spill_indices, plan.spill_data, i32(slots),
        result.counts, result.data, result.indices, offset, result.overflow_indices,
        result.overflow_data))
    return result, slots, nnz


#: cudaDataType_t of the 16-bit inputs and the float32 output of :func:`_gemm_nt_float32`
#: (CUDA's library_types.h).
_CUDA_R = {"float16": 2, "bfloat16": 14, "float32": 0}


def _gemm_nt_float32(x, w):
    """``x @ w.T`` as float32 (M, N) from 16-bit ``x`` (M, K) and ``w`` (N, K), both
    C-contiguous and of one dtype: cuBLAS ``GemmEx`` on tensor cores with float32 accumulation
    and a float32 output (``cupy.matmul`` would round the products to the inputs' dtype)."""
    from cupy_backends.cuda.libs import cublas

    m, k = x.shape
    n = w.shape[0]
    out = cupy.empty((m, n), dtype=np.float32)
    if k == 0:
        out.fill(0)
    if k == 0 or out.size == 0:
        return out
    limit = np.iinfo(np.int32).max
    if max(m, n, k) > limit:
        raise ValueError(f"cuBLAS takes dimensions up to {limit}; got x.shape={x.shape}, "
                         f"w.shape={w.shape}")
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    dtype = _CUDA_R[x.dtype.name]
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        # Column-major view: out^T (N x M) = w^T (w is K x N column-major) @ x (K x M).
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k,
                      one.ctypes.data, w.data.ptr, dtype, k, x.data.ptr, dtype, k,
                      zero.ctypes.data, out.data.ptr, _CUDA_R["float32"], n,
                      cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    finally:
        cublas.setPointerMode(handle, mode)
    return out


def gated_up(parts, shape, tile_width, x, w_up, nnz_hint=None):
    """Parts with the gate's structure and values ``gate * (x[row] . w_up[col])``.

    ``parts`` is the gate (M, H); ``x`` (M, D) and ``w_up`` (H, D) are C-contiguous and of the
    parts' dtype. Each product accumulates in float32 (float64) and rounds once, in one of two
    ways (:func:`._policy.gated_up_way`, by the gate's entry count ``nnz_hint``):
    ``twell_gated_up``, a warp's dot product per entry (x and w_up rows read from L2: its
    time grows with the entries), or, for a dense enough 16-bit gate, cuBLAS's whole
    ``x @ w_up.T`` in float32 (an ``M x H`` float32 temporary) and ``twell_gated_take`` at
    the gate's entries; the dot product runs instead if the temporary cannot be allocated.
    Products that come out zero stay stored: the result feeds a product at once and is never
    handed to the user.
        """
    m, k = shape
    depth = x.shape[1]
    dtype = parts.data.dtype
    way = _policy.gated_up_way(m, k, depth, dtype, nnz_hint)
    out = cupy.empty_like(parts.data)
    overflow_out = cupy.empty_like(parts.overflow_data)
    n_over = parts.overflow_indices.size
    common = (parts.counts, parts.data, parts.indices, parts.overflow_indptr,
              parts.overflow_indices, parts.overflow_data, i64(m), i64(k), i32(tile_width),
              i32(parts.data.shape[2]), i64(n_over))
    up = None
    if way == "dense":
        try:
            up = _gemm_nt_float32(x, w_up)
        except cupy.cuda.memory.OutOfMemoryError:
            pass  # the memory is in use elsewhere: the dot products need none
    if up is not None:
        items = parts.data.size + n_over
        if items:
            kernel = _compile.function("ffn.cu", instance("twell_gated_take", dtype))
            # One thread per slot, then one per overflow entry.
            kernel(blocks(items, BLOCK), (BLOCK,), (*common, up, out, overflow_out))
        return parts._replace(data=out, overflow_data=overflow_out)
    items = parts.counts.size + n_over
    if items:
        vec = vector_for(dtype, depth % _compile.vector_width(dtype) == 0, aligned(x, w_up))
        kernel = _compile.function("ffn.cu", instance("twell_gated_up", dtype, vec))
        # One warp per (row, tile) pair, then one per overflow entry.
        kernel(blocks(items, WARPS), (BLOCK,), (
            *common, x, w_up, i64(depth), out, overflow_out))
    return parts._replace(data=out, overflow_data=overflow_out)
