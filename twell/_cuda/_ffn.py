"""Launchers of ``cuda_src/ffn.cu`` and ``cuda_src/matmul_pack_sm90.cu``: the GEMM that
writes its output in TwELL (``relu(x @ w.T)`` packed in its epilogue), the gated
feed-forward layer's up projection taken at the gate's entries, and the layer without a host
synchronisation (:func:`sparse_ffn_without_sync`) with its fix-up of the rows whose overflow
did not fit.
"""

import functools
from typing import NamedTuple

import cupy
import numpy as np

from .. import _layout
from .._arguments import check_storage
from . import _compile, _cublas, _policy, _tma
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
from ._reduce import count_buffer, count_positive, overflow_offsets, read_counts
from ._spmm import spmm_with

#: Block tile of twell_matmul_pack and twell_matmul_pack_sm90_* (rows, columns) and their
#: dynamic shared memory in bytes: 3 (4) pipeline stages of a 128 x 64 and a 256 x 64 tile of
#: 16-bit values; the Hopper kernel adds 32 KB for its packing's words, its 8 mbarriers, and
#: aligns its tiles to 1024 bytes by hand (+1024 of slack). The Hopper kernel runs 288
#: threads (a producer warp) in clusters of 2 that share each w tile, the other 256.
_MATMUL_TILE = (128, 256)
_MATMUL_SMEM = 3 * (128 + 256) * 64 * 2
_MATMUL_SM90_SMEM = 4 * (128 + 256) * 64 * 2 + 8 * 256 * 16 + 2 * 4 * 8 + 1024
_MATMUL_THREADS = {"mma": 256, "sm90": 288, "sm90_gated": 384}
_SM90_CLUSTER = 2
_SM90_KERNELS = {"bfloat16": "twell_matmul_pack_sm90_bf16", "float16": "twell_matmul_pack_sm90_f16"}
#: The gated Hopper kernel: relu(x @ w_gate.T) * (x @ w_up.T) at the gate's non-zeros, 384
#: threads (its producer warp in a warpgroup of its own, whose registers go to the consumers).
_SM90_GATED_KERNELS = {"bfloat16": "twell_gated_pack_sm90_bf16",
                       "float16": "twell_gated_pack_sm90_f16"}
#: The gated Hopper kernel with a dense epilogue: relu(x @ w_gate.T) * (x @ w_up.T) written
#: whole, zero where the gate is.
_SM90_GATED_DENSE_KERNELS = {"bfloat16": "twell_gated_dense_sm90_bf16",
                             "float16": "twell_gated_dense_sm90_f16"}
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


def _matmul_operands(x, w, variant, w_up=None, kernels=None):
    """The kernel, its operand arguments and its shared memory for ``variant`` (with
    ``w_up``: the gated Hopper kernel; ``kernels``: another Hopper kernel of the same operands,
    by dtype name)."""
    if variant == "sm90":
        bm, bn = _MATMUL_TILE
        # w in boxes of half its tile: each CTA of a cluster loads one half for both.
        maps = (_tma.tensor_map_2d(x, _MATMUL_DEPTH, bm),
                *(_tma.tensor_map_2d(v, _MATMUL_DEPTH, bn // _SM90_CLUSTER)
                  for v in ((w,) if w_up is None else (w, w_up))))
        names = kernels or (_SM90_KERNELS if w_up is None else _SM90_GATED_KERNELS)
        kernel = _compile.function(_policy.SM90_SOURCE, names[x.dtype.name])
        return kernel, maps, _MATMUL_SM90_SMEM
    if w_up is not None:
        raise ValueError(f"the gated kernel runs on the sm90 variant only; got {variant!r}")
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
                        spill_capacity, spill_indices, spill_data, counter=None, zero_fill=True,
                        w_up=None):
    """One launch of the fused kernel; returns its overflow counter (a device array:
    ``counter``, zeroed, or a new one). ``zero_fill=False`` leaves the slots past each pair's
    count unwritten, for a caller that reads only the counted ones. With ``w_up`` (the sm90
    variant only), the gated kernel: the gate ``w``'s non-zeros packed with the values
    ``relu(x @ w.T) * (x @ w_up.T)``."""
    m, k = x.shape
    n = w.shape[0]
    kernel, operands, smem = _matmul_operands(x, w, variant, w_up)
    kernel.max_dynamic_shared_size_bytes = smem
    bm, bn = _MATMUL_TILE
    threads = _MATMUL_THREADS[variant if w_up is None else "sm90_gated"]
    counter = overflow_counter() if counter is None else counter
    if variant == "sm90":
        grid = _sm90_grid(kernel, m, n, smem, threads)
    else:  # one 128 x 256 output tile a block, the column tiles of a row consecutive
        grid = -(-m // bm) * -(-n // bn)
    kernel((grid,), (threads,), (
        *operands, i64(m), i64(n), i64(k), i32(tile_width), i32(slots),
        i32(zero_fill), totals,
        parts.counts, parts.data, parts.indices, spill_start, spill_indices, spill_data,
        i64(spill_capacity), counter), shared_mem=smem)
    return counter


def _sm90_grid(kernel, m, n, smem, threads):
    """CTAs of a Hopper kernel's launch on an ``m x n`` output: persistent clusters, as many as
    the device holds at once (a cluster launched after the others would add its whole share
    of the tiles to the time), none without a tile pair."""
    bm, bn = _MATMUL_TILE
    pairs = -(-m // (_SM90_CLUSTER * bm)) * -(-n // bn)
    return _SM90_CLUSTER * min(pairs, _sm90_clusters(kernel, smem, threads))


def _sm90_clusters(kernel, smem, threads=_MATMUL_THREADS["sm90"]):
    """A Hopper kernel's co-resident clusters on the current device at ``threads`` threads a
    CTA (the driver's count; else one per two multiprocessors, the most there can be)."""
    device = cupy.cuda.Device().id
    found = _SM90_CLUSTER_COUNTS.get((device, threads))
    if found is None:
        found = (kernel.max_active_clusters(threads, smem, _SM90_CLUSTER)
                 or _sm_count(device) // _SM90_CLUSTER)
        _SM90_CLUSTER_COUNTS[(device, threads)] = found
    return found


_SM90_CLUSTER_COUNTS = {}


def matmul_pack(x, w, tile_width, slots, w_up=None, nnz_hint=None):
    """``relu(x @ w.T)`` packed into TwELL parts by a fused GEMM -> TwELL kernel: returns
    ``(parts, nnz)``; with ``w_up`` (passing :func:`matmul_pack_supported` with ``x``), the
    gated layer's hidden values at those entries (:func:`_gated`), their way chosen by the
    gate's expected ``nnz_hint`` entries (:func:`._policy.gated_fused`; None: the gated
    kernel where it runs).

    The operands pass :func:`matmul_pack_supported`. Products accumulate in float32 and
    round once to the inputs' dtype; the dense product is never written to global memory.
    A device of compute capability 9.0 (H100/H200) runs ``twell_matmul_pack_sm90_bf16`` or
    ``_f16`` (wgmma fed by TMA), every other ``twell_matmul_pack`` (mma.sync); both give the
    same bits. Synchronises once with the host (the overflow size and the histogram of the
    per-tile totals, which gives ``nnz``), twice when the spill buffer was too small and the
    kernel reruns.
    """
    fused = _fused_up(x, w, w_up, nnz_hint)
    parts, nnz = _matmul_pack(matmul_plan(x, w, tile_width), x, w, tile_width, slots, fused)
    return _gated(parts, x, w, w_up, fused, tile_width, nnz), nnz


def _fused_up(x, w, w_up, nnz_hint=None):
    """``w_up`` where the gated Hopper kernel takes it with the gate ``w``
    (:func:`._policy.gated_fused`, for a gate of ``nnz_hint`` entries), else None."""
    return w_up if w_up is not None and _policy.gated_fused(x, w, w_up, nnz_hint) else None


def _gated(parts, x, w, w_up, fused, tile_width, nnz):
    """The packed gate's ``parts`` as they are without ``w_up`` or when the gated kernel
    (``fused``) packed them, else with :func:`gated_up`'s values."""
    if w_up is None or fused is not None:
        return parts
    return gated_up(parts, (x.shape[0], w.shape[0]), tile_width, x, w_up, nnz)


def _matmul_pack(plan, x, w, tile_width, slots, w_up=None):
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
                            counter=counter, w_up=w_up)
        without = no_overflow(parts)  # made while the kernel runs
        # Queued before the read: after it the GPU waits for each launch the host makes.
        offset, row_starts = overflow_offsets(plan.totals, slots)
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
    parts = with_overflow(parts, row_starts, n_over)
    _spill_to_overflow(plan.totals, slots, plan.spill_start, spill_indices, spill_data, offset,
                       n_over, parts)
    return parts, nnz


def _spill_to_overflow(totals, slots, spill_start, spill_indices, spill_data, offset, capacity,
                       parts):
    """The spilled runs moved to ``parts``' overflow of ``capacity`` entries, at ``offset``."""
    m, nt = totals.shape
    move = _compile.function("ffn.cu", instance("twell_spill_to_overflow", parts.data.dtype))
    # One warp per 32 consecutive (row, tile) pairs.
    move(blocks(-(-m * nt // 32), WARPS), (BLOCK,), (
        totals, i64(m * nt), i32(slots), spill_start, spill_indices, spill_data, offset,
        i64(capacity), parts.overflow_indices, parts.overflow_data))


class PackLoss(NamedTuple):
    """What :func:`ffn_fixup` reads to find the rows that a :func:`matmul_pack_bounded` may
    have lost entries of: the fused GEMM's totals and spill counter, the slots and the
    capacity."""

    totals: object
    counter: object
    slots: int
    capacity: int


def matmul_pack_bounded(x, w, tile_width, slots, w_up=None):
    """``relu(x @ w.T)`` packed at ``slots`` with no host synchronisation: ``(parts, loss)``;
    with ``w_up`` (where :func:`._policy.gated_fused`), the gated layer's hidden values
    ``relu(x @ w.T) * (x @ w_up.T)`` at the non-zeros of ``relu(x @ w.T)``, from one kernel.

    One fused launch, the overflow's prefix sum and the move of the spilled runs, all queued
    without reading anything back, so that the pack can be captured in a CUDA graph. The
    overflow arrays hold the spill buffer's :func:`._policy.spill_capacity` entries whatever
    the product holds: ``overflow_indptr`` (clamped to the capacity) says how many are used,
    and every kernel that reads the overflow stops at ``overflow_indptr[M]``. A product whose
    overflow exceeds the capacity loses the entries past it in the rows that hold them (they
    read as zeros at column 0); ``loss`` (a :class:`PackLoss`, None for an empty product)
    lets :func:`ffn_fixup` recompute them on the device (with every other row past its
    slots). The operands pass :func:`matmul_pack_supported`.
    """
    plan = matmul_plan(x, w, tile_width)
    m, nt = plan.totals.shape
    parts = empty_parts(m, nt, slots, x.dtype, zeroed=False, overflow=False)
    if m * nt == 0:
        return no_overflow(parts), None
    capacity = plan.spill_capacity
    counter = _launch_matmul_pack(x, w, plan.variant, tile_width, slots, plan.totals, parts,
                                  plan.spill_start, capacity, plan.spill_indices,
                                  plan.spill_data, w_up=w_up)
    offset, row_starts = overflow_offsets(plan.totals, slots, capacity)
    parts = with_overflow(parts, row_starts, capacity)
    _spill_to_overflow(plan.totals, slots, plan.spill_start, plan.spill_indices,
                       plan.spill_data, offset, capacity, parts)
    return parts, PackLoss(plan.totals, counter, slots, capacity)


def ffn_fixup(loss, x, w_gate, w_up, w_down_t, y):
    """Queue ``twell_ffn_fixup``: the rows of ``y`` (M, d_model), the output of a layer whose
    first projection was packed by :func:`matmul_pack_bounded` with ``loss``, are recomputed
    from the layer's definition where the pack lost entries (gated where ``w_gate`` is given;
    ``w_down_t`` the down weight transposed, C-contiguous ``(hidden, d_model)``): every row
    with entries past the slots, since which of them lost entries depends on the order of the
    fused GEMM's atomic claims, and the layer's bits must not. Its blocks return after one
    read when nothing was lost. No host synchronisation."""
    if loss is None:
        return
    m, depth = x.shape
    hidden = w_up.shape[0]
    device = cupy.cuda.Device()
    grid = max(1, min(m, _sm_count(device.id)))
    scratch = cupy.empty((grid, hidden), dtype=np.float32)
    weights = (w_up,) if w_gate is None else (w_gate, w_up)
    vec = vector_for(x.dtype, depth % _compile.vector_width(x.dtype) == 0, aligned(x, *weights))
    kernel = _compile.function("ffn.cu", instance("twell_ffn_fixup", x.dtype, vec))
    kernel((grid,), (BLOCK,), (
        loss.totals, loss.counter, i64(m),
        i64(loss.totals.shape[1]), i32(loss.slots), i64(loss.capacity),
        i32(w_gate is not None), x, w_up if w_gate is None else w_gate, w_up, w_down_t,
        i64(depth), i64(hidden), scratch, y))


@functools.cache
def _sm_count(device_id):
    return cupy.cuda.Device(device_id).attributes["MultiProcessorCount"]


#: ``matmul_pack_auto`` packs at ``tile_width // _PROVISIONAL_SHARE`` slots before it knows
#: the counts: room for 12.5% non-zeros, past any slot count that ``slots="auto"`` picks for
#: a ReLU product at 90-99.9% sparsity (32 at tile width 256; 90% picks ~32, 99% ~6), with
#: the rest in the spill buffer.
_PROVISIONAL_SHARE = 8


def matmul_pack_auto(x, w, tile_width, w_up=None, nnz_hint=None):
    """``relu(x @ w.T)`` packed with ``slots="auto"`` picked from its own per-tile counts
    (with ``w_up`` and ``nnz_hint``, as :func:`matmul_pack`: the gated layer's hidden values).

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
    fused = _fused_up(x, w, w_up, nnz_hint)
    parts = empty_parts(m, nt, provisional, x.dtype, zeroed=False, overflow=False)
    both, counter = count_buffer(tile_width)
    _launch_matmul_pack(x, w, plan.variant, tile_width, provisional, plan.totals, parts,
                        plan.spill_start, plan.spill_capacity, plan.spill_indices,
                        plan.spill_data, counter=counter,
                        zero_fill=False,  # twell_reslot reads the counted slots only
                        w_up=fused)
    hist, spilled = read_counts(both, plan.totals, tile_width)
    slots, n_over, nnz = _layout.auto_choice(hist, tile_width)
    check_storage((m, n), tile_width, slots)
    if spilled > plan.spill_capacity:
        # A second launch at the chosen slots, with a spill buffer of exactly their overflow.
        variant = plan.variant
        del parts, plan  # freed before the second launch allocates its own
        rerun = _plan(x, w, tile_width, variant, max(n_over, 1))
        parts = _matmul_pack(rerun, x, w, tile_width, slots, fused)[0]
        return _gated(parts, x, w, w_up, fused, tile_width, nnz), slots, nnz
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
    return _gated(result, x, w, w_up, fused, tile_width, nnz), slots, nnz


def _gemm_nt_float32(x, w):
    """``x @ w.T`` as float32 (M, N) from ``x`` (M, K) and ``w`` (N, K), both C-contiguous and
    of one dtype, 16-bit or float32: cuBLAS ``GemmEx`` with float32 accumulation and a float32
    output (16-bit inputs on tensor cores: ``cupy.matmul`` would round their products to the
    inputs' dtype; float32 inputs never rounded to TF32, whatever CuPy's setting), through
    twell's own handle, which a CUDA graph can capture (:mod:`._cublas`)."""
    out = cupy.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    return _cublas.gemm(x, w, out, trans_b=True)


#: Bytes of a row of x that ``twell_gated_up`` stages in shared memory (its
#: ``kGatedStaged``): the most a launch takes without opting in.
_GATED_STAGED_BYTES = 49152


def gated_up(parts, shape, tile_width, x, w_up, nnz_hint=None):
    """Parts with the gate's structure and values ``gate * (x[row] . w_up[col])``.

    ``parts`` is the gate (M, H); ``x`` (M, D) and ``w_up`` (H, D) are C-contiguous and of the
    parts' dtype. Each product accumulates in float32 (float64) and rounds once, in one of two
    ways (:func:`._policy.gated_up_way`, by the gate's entry count ``nnz_hint``):
    ``twell_gated_up``, a warp's dot product per entry (a block a row of x, staged in
    shared memory; each entry's row of w_up read from L2: its time grows with the entries),
    or, for a dense enough gate of 16-bit or float32 values, cuBLAS's whole ``x @ w_up.T``
    in float32 (an ``M x H`` float32 temporary) and ``twell_gated_take`` at the gate's
    entries; the dot product runs instead if the temporary cannot be allocated. Products
    that come out zero stay stored: the result feeds a product at once and is never handed
    to the user.
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
    if m and parts.counts.size + n_over:
        vec = vector_for(dtype, depth % _compile.vector_width(dtype) == 0, aligned(x, w_up))
        kernel = _compile.function("ffn.cu", instance("twell_gated_up", dtype, vec))
        # A block a row, its row of x staged in shared memory (at most 48 KB of it).
        staged = min(depth, _GATED_STAGED_BYTES // dtype.itemsize) * dtype.itemsize
        kernel((m,), (BLOCK,), (*common, x, w_up, i64(depth), out, overflow_out),
               shared_mem=staged)
    return parts._replace(data=out, overflow_data=overflow_out)


def gated_dense(x, w_gate, w_up):
    """The gated layer's hidden values ``relu(x @ w_gate.T) * (x @ w_up.T)`` as a dense
    ``(M, N)`` array of x's dtype, +0 where the gate is zero, from one Hopper kernel
    (``twell_gated_dense_sm90_*``): the gated pack's GEMMs and products, its values bit for bit
    where the gate is non-zero, written whole instead of packed. For a down projection that
    cuBLAS runs faster than the SpMM: the hidden layer is never densified. The operands pass
    :func:`._policy.gated_fused` (Hopper) and N (the hidden size) is even: every row starts
    at a 4-byte boundary, so that each two columns are one aligned 32-bit word. No host
    synchronisation.
    """
    return _gated_dense_launch(x, w_gate, w_up)()


def _gated_dense_launch(x, w_gate, w_up):
    """:func:`gated_dense`'s host work done now (its checks, output, kernel, tensor maps and
    grid): returns the function that queues the kernel and returns the hidden layer."""
    m, k = x.shape
    n = w_gate.shape[0]
    if n % 2:
        raise ValueError(f"gated_dense needs an even hidden size (w_gate.shape[0]); got {n}")
    out = cupy.empty((m, n), dtype=x.dtype)
    if m * n == 0:
        return lambda: out
    if k == 0:
        def zeros():
            out.fill(0)
            return out
        return zeros
    kernel, maps, smem = _matmul_operands(x, w_gate, "sm90", w_up,
                                          _SM90_GATED_DENSE_KERNELS)
    kernel.max_dynamic_shared_size_bytes = smem
    threads = _MATMUL_THREADS["sm90_gated"]
    grid = (_sm90_grid(kernel, m, n, smem, threads),)
    args = (*maps, i64(m), i64(n), i64(k), out)

    def launch():
        kernel(grid, (threads,), args, shared_mem=smem)
        return out
    return launch


def gate_nnz_hint(x, w_gate, w_up):
    """The expected entries of the gate ``relu(x @ w_gate.T)`` where the gated Hopper kernel
    runs (:func:`._policy.gated_fused` without a count), else None: the non-zeros of the gate
    of :data:`._policy.GATE_SAMPLE_ROWS` rows of ``x`` spread evenly over it (every row of a
    shorter ``x``), scaled to its M rows.

    For a caller that knows nothing of the gate before its kernel runs (``sparse_ffn``, by
    :func:`gated_ffn_by_sample`), so that it chooses the hidden layer's form and the up
    projection's way (:func:`matmul_pack`'s ``nnz_hint``) as the modules do with the density
    of their first call. One cuBLAS GEMM of the sampled rows, rounded to x's dtype as the
    kernels round the gate, and one read-back of its positive count (a host
    synchronisation). An estimate: it chooses between ways that give the same layer to the
    dtype's rounding.
    """
    if not _policy.gated_fused(x, w_gate, w_up):
        return None
    return _queue_gate_sample(x, w_gate)()


def _queue_gate_sample(x, w_gate):
    """Queue :func:`gate_nnz_hint`'s sample; returns the function that reads its estimate
    (the host synchronisation).

    Three operations before the read-back (the GEMM, the count's zeroing, the count),
    because the host's work around it is the sample's cost: the GEMM reads the sampled rows
    in place (its leading dimension is their stride), and one kernel counts the positive
    values (:func:`._reduce.count_positive`).
    """
    m = x.shape[0]
    rows = _policy.GATE_SAMPLE_ROWS
    sample = x if m <= rows else x[::m // rows][:rows]
    if sample.size == 0:
        return lambda: 0
    gate = _cublas.gemm(sample, w_gate, cupy.empty((sample.shape[0], w_gate.shape[0]),
                                                   dtype=x.dtype), trans_b=True)
    positive, sampled = count_positive(gate), sample.shape[0]
    return lambda: int(positive) * m // sampled


def gated_ffn_by_sample(x, w_gate, w_up, w_down):
    """The gated layer ``(relu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T`` with its hidden
    layer dense where :func:`._policy.dense_hidden` says so for the gate's density, estimated
    by :func:`gate_nnz_hint`: ``(y, nnz_hint)``, ``y`` None where the layer takes another way
    (``nnz_hint`` None where no way depends on it).

    The dense way is :func:`gated_dense`, then cuBLAS's product with ``w_down`` in
    ``nn.Linear`` layout (read in place when it or its transpose is C-contiguous). Its host
    work (buffers, tensor maps, the kernel, the grid) is done while the sample runs, so that
    after the read-back the host only compares and launches: the GPU waits for each step the
    host takes there. A layer that takes another way has allocated the dense way's hidden
    layer and output for nothing (they return to the memory pool); the policy allows them
    only within 1/8 of the device's memory. One host synchronisation.
    """
    if not _policy.gated_fused(x, w_gate, w_up):
        return None, None
    read = _queue_gate_sample(x, w_gate)
    launch = (_dense_hidden_launch(x, w_gate, w_up, w_down)
              if _policy.dense_hidden_allowed(x, w_gate, w_down) else None)
    nnz_hint = read()  # host synchronisation
    if launch is None or not _policy.dense_hidden_pays_at(x.shape[0], w_gate.shape[0],
                                                           w_down.shape[0], nnz_hint):
        return None, nnz_hint
    return launch(), nnz_hint


def _dense_hidden_launch(x, w_gate, w_up, w_down):
    """The dense way of :func:`gated_ffn_by_sample` prepared: returns the function that
    queues :func:`gated_dense` and cuBLAS's down projection and returns the layer's output."""
    hidden = _gated_dense_launch(x, w_gate, w_up)
    out = cupy.empty((x.shape[0], w_down.shape[0]), dtype=x.dtype)

    def launch():
        if w_down.flags.c_contiguous:
            return _cublas.gemm(hidden(), w_down, out, trans_b=True)
        if w_down.T.flags.c_contiguous:  # a transposed view: the modules' product
            return _cublas.gemm(hidden(), w_down.T, out)
        return _cublas.gemm(hidden(), cupy.ascontiguousarray(w_down), out, trans_b=True)
    return launch


def without_sync_supported(x, w_gate, w_up, w_down):
    """Whether :func:`sparse_ffn_without_sync` takes these CuPy arrays: one 16-bit dtype, and
    the first projection's operands :func:`matmul_pack_supported` at tile width 256."""
    first = w_up if w_gate is None else w_gate
    return (all(w is None or w.dtype == x.dtype for w in (w_gate, w_up, w_down))
            and matmul_pack_supported(x, first, _layout.GEMM_TILE_WIDTH)
            and w_up.flags.c_contiguous)


def sparse_ffn_without_sync(x, w_gate, w_up, w_down, slots, nnz_hint=None):
    """The ReLU feed-forward layer ``(relu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T`` (without
    ``w_gate``: ``relu(x @ w_up.T) @ w_down.T``) with no host synchronisation, so that a CUDA
    graph can capture it.

    The arrays pass :func:`without_sync_supported`; ``slots`` is an int. The SpMM reads
    ``w_down.T`` C-contiguous: a transposed view of a ``(hidden, d_model)`` array costs no
    copy (the modules keep one), any other ``w_down`` a copy per call. The hidden layer is
    :func:`matmul_pack_bounded` at tile width 256 (the GEMM's, whatever the library's
    default): where :func:`._policy.gated_fused` (Hopper), the gate's and the up projection's
    GEMMs in one kernel that packs their product at the gate's non-zeros, else the gate's
    and then the gated up projection :func:`gated_up`; the down projection is the SpMM, the
    ways of the up and down projections chosen by ``nnz_hint`` (the hidden layer's expected
    entries; None: the gather kernels); then :func:`ffn_fixup` recomputes the rows whose
    overflow did not fit the capacity, so that nothing is lost. Where
    :func:`._policy.dense_hidden` says so (a gated layer on Hopper whose gate's ``nnz_hint``
    makes cuBLAS's down projection beat the gather), the hidden layer is instead written dense
    by :func:`gated_dense` and multiplied by cuBLAS: nothing is packed, nothing overflows.
    Each kernel is deterministic:
    the same inputs give the same bits, eagerly or replayed.
    """
    w_down_t = cupy.ascontiguousarray(w_down.T)  # no copy for a transposed view
    if w_gate is not None and _policy.dense_hidden(x, w_gate, w_up, w_down, nnz_hint):
        return _cublas.matmul(gated_dense(x, w_gate, w_up), w_down_t)
    tile_width = _layout.GEMM_TILE_WIDTH
    first = w_up if w_gate is None else w_gate
    fused = None if w_gate is None else _fused_up(x, w_gate, w_up, nnz_hint)
    parts, loss = matmul_pack_bounded(x, first, tile_width, slots, w_up=fused)
    shape = (x.shape[0], first.shape[0])
    if w_gate is not None:
        parts = _gated(parts, x, w_gate, w_up, fused, tile_width, nnz_hint)
    y = spmm_with(_cublas.matmul, parts, shape, tile_width, w_down_t, x.dtype,
                  nnz_hint=nnz_hint)
    ffn_fixup(loss, x, w_gate, w_up, w_down_t, y)
    return y
