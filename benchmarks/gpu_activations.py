"""The GPU suite's activation workloads (``ffn``, ``sweep``, ``hot``): every contender of one
(workload, sparsity, dtype) on the same input sets.

Operations: dense -> TwELL (``pack``), the GEMM whose output is written in TwELL
(``gemm+pack``: ``twell.matmul_to_twell`` against cuBLAS plus a pack, and the reference's
fused GEMM, "D2T"), the gated feed-forward layer (``gated ffn``), CSR -> TwELL, TwELL -> CSR,
TwELL -> dense, ``A @ B`` (``spmm``; the reference's TwELL-times-dense kernel is "T2D") and
``A @ v`` (``spmv``).
"""

import math

import numpy as np
from arrays import (
    BF16,
    RNG,
    SHORT,
    acc_dtype,
    cast,
    csr_nbytes,
    matmul_same,
    relu,
    short_error,
    widen,
)
from checks import Checks
from contenders import Reference, reference_capacity, to_torch, torch_nbytes
from workloads import FFN_TILE_WIDTH, tile_counts

import twell


def run_activation_case(bench, case, inp32, dtype, with_gemm, sweep=False, layer=False):
    """Every contender of one (workload, sparsity, dtype) on the same input sets; a sweep
    case runs the SpMM only, and the gated layer too where ``layer`` (its sparsities past the
    ``ffn`` workload's: :data:`workloads.LAYER_SWEEP`)."""
    xp, sp, torch, ref, ck = bench.xp, bench.sp, bench.torch, bench.ref, Checks(bench)
    dt = np.dtype(dtype)
    acc = acc_dtype(dt)
    nb = len(inp32.z)
    z = [cast(xp, a, dt) for a in inp32.z]
    down = [cast(xp, a, dt) for a in inp32.down]
    v = [cast(xp, a, dt) for a in inp32.v]
    m, k = z[0].shape
    n = down[0].shape[1]
    isz = dt.itemsize
    z_ref = widen(xp, z[0], acc)  # buffer 0, as the contenders see it
    nnz = int(xp.count_nonzero(z_ref))
    dense_bytes = m * k * isz

    # Tile statistics without twell (a twell failure must not hide the baselines); the fixed
    # slot count is the largest tile count over all buffers: no overflow anywhere.
    tile = tile_counts(xp, z_ref != 0)
    s_max = max(1, int(tile.max()), *(int(tile_counts(xp, t != 0).max()) for t in z[1:]))
    hist = xp.bincount(tile.ravel())
    hist = np.asarray(hist.get() if bench.dev.gpu else hist)  # host copy, a few words
    case.info.update(
        shape=[m, k, n], nnz=nnz, density=nnz / (m * k), buffers=nb, slots_max=s_max,
        slots_auto_expected=twell.auto_slots(hist, FFN_TILE_WIDTH),
        max_per_tile=int(tile.max()), mean_per_tile=float(tile.mean()),
        tile_rows=int(tile.size), tile_rows_over_31=int((tile > 31).sum()),
        tile_rows_over_63=int((tile > 63).sum()),
        bytes_dense=dense_bytes, bytes_csr=csr_nbytes(nnz, m, isz))
    del tile, hist
    tiles31 = case.info["tile_rows_over_31"]

    # TwELL layouts (untimed) for the consumers: auto slots and s_max slots.
    a_auto = a_max = None
    try:
        a_auto = [twell.TwELLMatrix(t) for t in z]
        a_max = [twell.TwELLMatrix(t, slots=s_max) for t in z]
        case.info.update(
            slots_auto=a_auto[0].slots, occupancy_auto=a_auto[0].occupancy,
            overflow_nnz_auto=a_auto[0].overflow_nnz,
            overflow_rows_auto=a_auto[0].overflow_rows, bytes_twell_auto=a_auto[0].nbytes,
            bytes_twell_max=a_max[0].nbytes)
        v_auto = f"S=auto({a_auto[0].slots})"
        if a_auto[0].tile_width != FFN_TILE_WIDTH:
            v_auto = f"T={a_auto[0].tile_width} {v_auto}"
        built = ""
    except Exception as exc:  # noqa: BLE001 - timed below as failures; baselines still run
        v_auto = "S=auto"
        built = f"building TwELL failed: {short_error(exc)}"
        bench.notes.append(f"{case.id}: {built}")
    v_max = f"S={s_max}"

    def twell_skip(op, variant=v_auto):
        bench.skip(case, op, "twell", built, family="twell", variant=variant)

    has_sp = dt in (np.float32, np.float64)
    csr = [sp.csr_matrix(t) for t in z] if has_sp else None
    tz = tdown = tv = tcsr = None
    if torch is not None:
        try:
            tz = [to_torch(torch, t) for t in z]
            tdown = [to_torch(torch, t) for t in down]
            tv = [to_torch(torch, t) for t in v]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch views failed: {short_error(exc)}")
            tz = tdown = tv = None
    tcsr_why = None
    if tz is not None and tz[0].device.type == "cpu" and np.dtype(dt).itemsize == 2:
        # The dry run's CPU torch: its CSR products (MKL) take no 16-bit values.
        tcsr_why = "torch's CPU CSR has no float16/bfloat16 products"
    elif tz is not None:
        try:
            tcsr = [t.to_sparse_csr() for t in tz]
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch to_sparse_csr failed: {short_error(exc)}")
    ref_ok, ref_why = (False, "no --reference given") if ref is None else \
        Reference.t2d_supports(m, n, k)
    if ref is not None and dt != BF16:
        ref_ok, ref_why = False, "the reference is bf16 only"
    elif ref_ok and tdown is None:
        ref_ok, ref_why = False, "torch inputs unavailable"

    def spmm_ops():
        out_ref = z_ref @ widen(xp, down[0], acc)
        flops = 2 * nnz * n
        chk = ck.close(out_ref, dt)
        out_bytes = m * n * isz + k * n * isz
        bench.measure(case, "spmm", "cupy.matmul", lambda i: matmul_same(xp, z[i], down[i]),
                      family="dense", nbuf=nb, check=chk, flops=2 * m * k * n,
                      nbytes=dense_bytes + out_bytes, impl="cuBLAS")
        if tz is not None:
            bench.measure(case, "spmm", "torch.matmul", lambda i: tz[i] @ tdown[i],
                          family="dense", nbuf=nb, check=chk, flops=2 * m * k * n, impl="cuBLAS")
        if csr is not None:
            bench.measure(case, "spmm", f"{bench.dev.sparse_name} csr", lambda i: csr[i] @ down[i],
                          family="cupyx", nbuf=nb, check=chk, flops=flops, impl="cuSPARSE")
        if tcsr is not None:
            bench.measure(case, "spmm", "torch csr", lambda i: tcsr[i] @ tdown[i],
                          family="torch", nbuf=nb, check=chk, flops=flops, impl="cuSPARSE")
        elif tcsr_why:
            bench.skip(case, "spmm", "torch csr", tcsr_why, family="torch")
        if ref_ok and tiles31:
            bench.skip(case, "spmm", "ref T2D C=8",
                       f"overflow: {tiles31} (row, tile) pairs hold more than 31 entries; the "
                       "reference packed layout (C=8) cannot hold this matrix", family="ref")
        elif ref_ok and a_auto is None:
            bench.skip(case, "spmm", "ref T2D C=8", "no TwELL matrix to pack: " + built,
                       family="ref")
        elif ref_ok:
            try:
                packed = [to_torch(torch, a.to_packed(8)) for a in a_auto]
                out = torch.empty((m, n), dtype=torch.bfloat16, device=bench.tdev)
                bench.measure(case, "spmm", "ref T2D C=8",
                              lambda i: ref.t2d_out(packed[i], tdown[i], out), family="ref",
                              nbuf=nb, check=chk, flops=flops)
            except ValueError as exc:  # to_packed refuses what the layout cannot hold
                bench.skip(case, "spmm", "ref T2D C=8", short_error(exc), family="ref")
        elif ref is not None:
            bench.skip(case, "spmm", "ref T2D C=8", ref_why, family="ref")
        for a, var in ((a_auto, v_auto), (a_max, v_max)):
            if a is None:
                twell_skip("spmm", var)
                continue
            bench.measure(case, "spmm", "twell", lambda i, a=a: a[i] @ down[i], family="twell",
                          variant=var, nbuf=nb, check=chk, flops=flops,
                          nbytes=a[0].nbytes + out_bytes)

    if sweep:
        bench.guarded(case, "spmm", spmm_ops)
        if layer:
            bench.guarded(case, "gated ffn", lambda: run_gated_ffn(
                bench, case, inp32, dt, s_max, case.info["max_per_tile"], nb))
        _tag_nnz(bench, case, nnz)
        return

    eq = ck.equal(z_ref, dt)

    def pack_ops():
        """dense -> TwELL (and dense -> CSR for the others)."""
        _pack_ops(bench, case, z, tz, csr, eq, dense_bytes, v_auto, s_max)

    def csr_ops():
        """CSR -> TwELL (cupyx holds float32/float64 only)."""
        if csr is None:
            bench.skip(case, "csr->twell", "twell",
                       f"cupyx.scipy.sparse cannot hold {SHORT[dt]} CSR input", family="twell")
            return
        bench.measure(case, "csr->twell", "twell", lambda i: twell.TwELLMatrix(csr[i]),
                      family="twell", variant="S=auto", nbuf=nb, check=eq,
                      nbytes=lambda a: case.info["bytes_csr"] + a.nbytes)

    def tocsr_ops():
        """TwELL -> CSR: scipy.sparse and cupyx hold float32/float64 values only."""
        if a_auto is None:
            twell_skip("twell->csr")
            return
        if not has_sp:
            bench.skip(case, "twell->csr", "twell",
                       f"A.tocsr(): cupyx.scipy.sparse cannot hold {SHORT[dt]} values",
                       family="twell", variant=v_auto)
            return
        bench.measure(case, "twell->csr", "twell", lambda i: a_auto[i].tocsr(), family="twell",
                      variant=v_auto, nbuf=nb, check=eq,
                      nbytes=a_auto[0].nbytes + csr_nbytes(nnz, m, isz), impl="A.tocsr()")

    def todense_ops():
        """TwELL -> dense (and CSR -> dense for the others)."""
        if csr is not None:
            bench.measure(case, "twell->dense", f"{bench.dev.sparse_name} csr.toarray",
                          lambda i: csr[i].toarray(), family="cupyx", nbuf=nb, check=eq,
                          nbytes=case.info["bytes_csr"] + dense_bytes)
        if tcsr is not None:
            bench.measure(case, "twell->dense", "torch csr.to_dense",
                          lambda i: tcsr[i].to_dense(), family="torch", nbuf=nb, check=eq,
                          nbytes=lambda d: torch_nbytes(d, tcsr[0].crow_indices(),
                                                        tcsr[0].col_indices(), tcsr[0].values()))
        if a_auto is None:
            twell_skip("twell->dense")
            return
        bench.measure(case, "twell->dense", "twell", lambda i: a_auto[i].toarray(),
                      family="twell", variant=v_auto, nbuf=nb, check=eq,
                      nbytes=a_auto[0].nbytes + dense_bytes)

    def spmv_ops():
        vref = z_ref @ widen(xp, v[0], acc)
        chk = ck.close(vref, dt)
        bench.measure(case, "spmv", "cupy.matmul", lambda i: matmul_same(xp, z[i], v[i]),
                      family="dense", nbuf=nb, check=chk, nbytes=dense_bytes, impl="cuBLAS")
        if tz is not None:
            bench.measure(case, "spmv", "torch.matmul", lambda i: tz[i] @ tv[i],
                          family="dense", nbuf=nb, check=chk, impl="cuBLAS")
        if csr is not None:
            bench.measure(case, "spmv", f"{bench.dev.sparse_name} csr", lambda i: csr[i] @ v[i],
                          family="cupyx", nbuf=nb, check=chk, impl="cuSPARSE")
        if tcsr is not None:
            bench.measure(case, "spmv", "torch csr", lambda i: tcsr[i] @ tv[i],
                          family="torch", nbuf=nb, check=chk, impl="cuSPARSE")
        elif tcsr_why:
            bench.skip(case, "spmv", "torch csr", tcsr_why, family="torch")
        if a_auto is None:
            twell_skip("spmv")
            return
        bench.measure(case, "spmv", "twell", lambda i: a_auto[i] @ v[i], family="twell",
                      variant=v_auto, nbuf=nb, check=chk,
                      nbytes=a_auto[0].nbytes + (k + m) * isz)

    bench.guarded(case, "pack", pack_ops)
    if with_gemm:  # relu(X @ W^T) -> sparse: the reference fuses it into its GEMM
        bench.guarded(case, "gemm+pack", lambda: run_gemm_pack(
            bench, case, inp32, dt, s_max, case.info["max_per_tile"], nb))
        bench.guarded(case, "gated ffn", lambda: run_gated_ffn(
            bench, case, inp32, dt, s_max, case.info["max_per_tile"], nb))
    bench.guarded(case, "csr->twell", csr_ops)
    bench.guarded(case, "twell->csr", tocsr_ops)
    bench.guarded(case, "twell->dense", todense_ops)
    bench.guarded(case, "spmm", spmm_ops)
    bench.guarded(case, "spmv", spmv_ops)
    _tag_nnz(bench, case, nnz)


def _pack_ops(bench, case, z, tz, csr, eq, dense_bytes, v_auto, s_max):
    sp, nb = bench.sp, len(z)
    if csr is not None:
        bench.measure(case, "pack", f"{bench.dev.sparse_name} csr_matrix(dense)",
                      lambda i: sp.csr_matrix(z[i]), family="cupyx", nbuf=nb, check=eq,
                      nbytes=lambda c: dense_bytes + c.data.nbytes + c.indices.nbytes
                      + c.indptr.nbytes)
    if tz is not None:
        bench.measure(case, "pack", "torch to_sparse_csr", lambda i: tz[i].to_sparse_csr(),
                      family="torch", nbuf=nb, check=eq,
                      nbytes=lambda t: dense_bytes + torch_nbytes(
                          t.crow_indices(), t.col_indices(), t.values()))
    bench.measure(case, "pack", "twell", lambda i: twell.TwELLMatrix(z[i]), family="twell",
                  variant=v_auto, nbuf=nb, check=eq, nbytes=lambda a: dense_bytes + a.nbytes)
    bench.measure(case, "pack", "twell", lambda i: twell.TwELLMatrix(z[i], slots=s_max),
                  family="twell", variant=f"S={s_max}", nbuf=nb, check=eq,
                  nbytes=lambda a: dense_bytes + a.nbytes)


def _tag_nnz(bench, case, nnz):
    for r in bench.rows:
        if r["case"] == case.id:
            r["nnz"] = nnz


def run_gemm_pack(bench, case, inp32, dt, s_max, max_tile, nb):
    """relu(X @ W^T) packed: dense GEMM + twell pack vs dense GEMM alone vs reference D2T."""
    xp, torch, ref, ck = bench.xp, bench.torch, bench.ref, Checks(bench)
    x = [cast(xp, a, dt) for a in inp32.x]
    w = cast(xp, inp32.w, dt)
    m, n = x[0].shape
    k = w.shape[0]
    acc = acc_dtype(dt)
    flops = 2 * m * n * k
    up_ref = relu(xp, matmul_same(xp, x[0], w.T))  # what the twell pipeline packs, buffer 0
    chk = ck.close(widen(xp, up_ref, acc), dt)
    del up_ref
    bench.measure(case, "gemm+pack", "cupy.matmul+relu (dense)",
                  lambda i: relu(xp, matmul_same(xp, x[i], w.T)), family="dense", nbuf=nb,
                  check=chk, flops=flops, impl="cuBLAS")
    tx = tw = None
    if torch is not None:
        try:
            tx = [to_torch(torch, a) for a in x]
            tw = to_torch(torch, w)
            bench.measure(case, "gemm+pack", "torch relu(matmul) (dense)",
                          lambda i: torch.relu(tx[i] @ tw.T), family="dense", nbuf=nb,
                          check=chk, flops=flops, impl="cuBLAS")
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch GEMM inputs failed: {short_error(exc)}")
            tx = None
    if ref is not None:
        ok, why = Reference.d2t_supports(m, n, k)
        if dt != BF16:
            ok, why = False, "the reference is bf16 only"
        if ok and tx is None:
            ok, why = False, "torch inputs unavailable"
        for cf in (8, 4):
            name, cap = f"ref D2T C={cf}", reference_capacity(cf)
            if not ok:
                bench.skip(case, "gemm+pack", name, why, family="ref")
            elif max_tile > cap:
                bench.skip(case, "gemm+pack", name,
                           f"overflow: up to {max_tile} entries per (row, tile) > capacity {cap}; "
                           "the reference output would be corrupt", family="ref")
            else:
                # int32 storage viewed as uint32: zeros() need not support uint32 itself.
                packed = [torch.zeros((m, k // cf), dtype=torch.int32, device=bench.tdev)
                          .view(torch.uint32) for _ in range(nb)]

                def words_dense(p, cf=cf):
                    words = xp.from_dlpack(p.view(torch.int32)).view(np.uint32)
                    return twell.TwELLMatrix.from_packed(words, (m, k), compression=cf)
                bench.measure(case, "gemm+pack", name,
                              lambda i, cf=cf, packed=packed: ref.d2t_out(tx[i], tw, packed[i], cf),
                              family="ref", nbuf=nb, check=lambda p, f=words_dense: chk(f(p)),
                              flops=flops)
    bench.measure(case, "gemm+pack", "cupy.matmul+relu+twell pack",
                  lambda i: twell.TwELLMatrix(relu(xp, matmul_same(xp, x[i], w.T)), slots=s_max),
                  family="composed", variant=f"S={s_max}", nbuf=nb, check=chk, flops=flops)
    # twell.matmul_to_twell: one fused kernel for 16-bit inputs on the GPU (the dense product
    # never reaches memory), a composed product + pack elsewhere.
    bench.measure(case, "gemm+pack", "twell.matmul_to_twell",
                  lambda i: twell.matmul_to_twell(x[i], w), family="twell", variant="auto",
                  nbuf=nb, check=chk, flops=flops)
    bench.measure(case, "gemm+pack", "twell.matmul_to_twell",
                  lambda i: twell.matmul_to_twell(x[i], w, slots=s_max), family="twell",
                  variant=f"S={s_max}", nbuf=nb, check=chk, flops=flops)


def run_gated_ffn(bench, case, inp32, dt, s_max, max_tile, nb):
    """(relu(X Wg^T) * (X Wu^T)) Wd^T: twell.sparse_ffn vs the dense layer vs the reference.

    Wg is the activation workload's W (its bias column sets the sparsity); Wu is random
    normal; the down weight is the workload's DOWN, (H, D) as the reference takes it, so
    twell gets its nn.Linear form DOWN.T (a view). The check is against a float32 layer
    computed from the same rounded inputs.
    """
    xp, torch, ref, ck = bench.xp, bench.torch, bench.ref, Checks(bench)
    x = [cast(xp, a, dt) for a in inp32.x]
    wg = cast(xp, inp32.w, dt)
    h, d = wg.shape
    m = x[0].shape[0]
    wu = cast(xp, RNG(xp, 17).normal((h, d)) / np.float32(math.sqrt(d)), dt)
    down = [cast(xp, a, dt) for a in inp32.down]
    acc = acc_dtype(dt)
    x0 = widen(xp, x[0], acc)
    hidden = relu(xp, x0 @ widen(xp, wg, acc).T) * (x0 @ widen(xp, wu, acc).T)
    chk = ck.close(hidden @ widen(xp, down[0], acc), dt)
    del hidden, x0
    flops = 3 * 2 * m * d * h  # the dense layer's
    bench.measure(case, "gated ffn", "cupy 3 GEMMs (dense)",
                  lambda i: matmul_same(xp, relu(xp, matmul_same(xp, x[i], wg.T))
                                        * matmul_same(xp, x[i], wu.T), down[i]),
                  family="dense", nbuf=nb, check=chk, flops=flops, impl="cuBLAS")
    tx = None
    if torch is not None:
        try:
            tx = [to_torch(torch, a) for a in x]
            twg, twu = to_torch(torch, wg), to_torch(torch, wu)
            tdown = [to_torch(torch, a) for a in down]
            bench.measure(case, "gated ffn", "torch 3 GEMMs (dense)",
                          lambda i: (torch.relu(tx[i] @ twg.T) * (tx[i] @ twu.T)) @ tdown[i],
                          family="dense", nbuf=nb, check=chk, flops=flops, impl="cuBLAS")
        except Exception as exc:  # noqa: BLE001
            bench.notes.append(f"{case.id}: torch FFN inputs failed: {short_error(exc)}")
            tx = None
    if ref is not None:
        ok, why = Reference.t2d_supports(m, d, h)
        if ok:
            ok, why = Reference.d2t_supports(m, d, h)
        if dt != BF16:
            ok, why = False, "the reference is bf16 only"
        if ok and tx is None:
            ok, why = False, "torch inputs unavailable"
        name = "ref gated FFN (D2T + gated T2D) C=8"
        if not ok:
            bench.skip(case, "gated ffn", name, why, family="ref")
        elif max_tile > reference_capacity(8):
            bench.skip(case, "gated ffn", name,
                       f"overflow: up to {max_tile} entries per (row, tile) > capacity "
                       f"{reference_capacity(8)}; the reference output would be corrupt",
                       family="ref")
        else:
            packed = [torch.zeros((m, h // 8), dtype=torch.int32, device=bench.tdev)
                      .view(torch.uint32) for _ in range(nb)]
            gout = [torch.zeros((m, d), dtype=torch.bfloat16, device=bench.tdev)
                    for _ in range(nb)]

            def ref_ffn(i):
                ref.d2t_out(tx[i], twg, packed[i], 8)
                return ref.gated_t2d_out(tx[i], packed[i], twu, tdown[i], gout[i])

            bench.measure(case, "gated ffn", name, ref_ffn, family="ref", nbuf=nb, check=chk,
                          flops=flops)
    for slots, variant in (("auto", "auto"), (s_max, f"S={s_max}")):
        bench.measure(case, "gated ffn", "twell.sparse_ffn",
                      lambda i, s=slots: twell.sparse_ffn(x[i], wg, wu, down[i].T, slots=s),
                      family="twell", variant=variant, nbuf=nb, check=chk, flops=flops)
    if tx is not None:
        _module_rows(bench, case, tx, twg, twu, tdown, chk, flops, nb)


def _module_rows(bench, case, tx, twg, twu, tdown, chk, flops, nb):
    """``twell.torch.SparseGatedMLP`` on the same weights (shared, not copied), one per
    input buffer: eager calls after the first (which fixes the slots and the density), and
    each buffer's call captured in a CUDA graph and replayed."""
    torch = bench.torch
    import twell.torch as tt

    def linear(weight):
        layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                                device=weight.device, dtype=weight.dtype)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        return layer

    gate, up = linear(twg), linear(twu)
    layers = [tt.SparseGatedMLP.from_linear(gate, up, linear(tdown[i].T)) for i in range(nb)]

    def eager(i):
        with torch.no_grad():
            return layers[i](tx[i])

    bench.measure(case, "gated ffn", "twell SparseGatedMLP", eager, family="twell",
                  variant="module, eager", nbuf=nb, check=chk, flops=flops)
    why = ("CUDA graphs need a GPU" if not bench.dev.gpu else
           None if tx[0].dtype in (torch.bfloat16, torch.float16) else
           "the layer is captured on 16-bit tensors only (the fused GEMM's)")
    if why:
        bench.skip(case, "gated ffn", "twell SparseGatedMLP", why, family="twell",
                   variant="module, CUDA graph")
        return
    graphs, outputs = [], []

    def replay(i):
        if len(graphs) < nb:  # the first call of each buffer: warm up, then capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                layers[i](tx[i])
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                outputs.append(layers[i](tx[i]))
            graphs.append(graph)
        graphs[i].replay()
        return outputs[i]

    bench.measure(case, "gated ffn", "twell SparseGatedMLP", replay, family="twell",
                  variant="module, CUDA graph", nbuf=nb, check=chk, flops=flops,
                  note="torch.cuda.CUDAGraph replays of the module's call on each buffer")
