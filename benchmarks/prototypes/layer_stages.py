"""Stages of the layer without a host sync at the paper's shape (bf16), against the GEMM."""
import statistics, sys, warnings
import cupy, numpy as np, torch
sys.path[:0] = [".", "benchmarks"]
import twell
from twell._cuda import _cublas, _ffn, _policy, _spmm
from workloads import ffn_inputs32
warnings.filterwarnings("ignore")
BF = np.dtype(twell.bfloat16)

def ev(f, reps=30):
    for _ in range(3):
        f()
    cupy.cuda.Device().synchronize()
    evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for s, e in evs:
        s.record(); f(); e.record()
    evs[-1][1].synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs)

m, h, d = 16384, 5632, 2048
for s in (0.99, 0.95):
    inp = ffn_inputs32(cupy, m, h, d, s, 1, 0)
    x = inp.x[0].astype(BF); wg = inp.w.astype(BF)
    wu = (cupy.random.default_rng(3).standard_normal((h, d), dtype=np.float32) / np.float32(45)).astype(BF)
    wd = cupy.ascontiguousarray(inp.down[0].T).astype(BF)  # (d, h) nn.Linear
    del inp
    g = twell.matmul_to_twell(x, wg)
    slots, nnz = g.slots, g.nnz
    shape = (m, h)
    parts, loss = _ffn.matmul_pack_bounded(x, wg, 256, slots)
    up = _ffn.gated_up(parts, shape, 256, x, wu, nnz)
    wdT = cupy.ascontiguousarray(wd.T)
    y = _spmm.spmm_with(_cublas.matmul, up, shape, 256, wdT, BF, nnz_hint=nnz)
    tx, twg, twd = (torch.from_dlpack(a) for a in (x, wg, wd))
    t = {
        "pack (bounded)": ev(lambda: _ffn.matmul_pack_bounded(x, wg, 256, slots)),
        "gated up": ev(lambda: _ffn.gated_up(parts, shape, 256, x, wu, nnz)),
        "w_down.T copy": ev(lambda: cupy.ascontiguousarray(wd.T)),
        "spmm down": ev(lambda: _spmm.spmm_with(_cublas.matmul, up, shape, 256, wdT, BF, nnz_hint=nnz)),
        "fixup (none lost)": ev(lambda: _ffn.ffn_fixup(loss, x, wg, wu, wdT, y)),
        "layer": ev(lambda: _ffn.sparse_ffn_without_sync(x, wg, wu, wd, slots, nnz_hint=nnz)),
        "torch GEMM x@wg.T": ev(lambda: tx @ twg.T),
        "dense layer (torch)": ev(lambda: (torch.relu(tx @ twg.T) * (tx @ twg.T)) @ twd.T),
    }
    ways = (_policy.gated_up_way(m, h, d, BF, nnz), _policy.spmm_way(m, h, d, BF, nnz))
    print(f"s={s} slots={slots} nnz={nnz} ({nnz / m / h:.4f}) ways up/down={ways}")
    for k, v in t.items():
        print(f"  {k:22} {v:.3f} ms")
    del x, wg, wu, wd, parts, up, y, g, wdT, tx, twg, twd
    cupy.get_default_memory_pool().free_all_blocks()
