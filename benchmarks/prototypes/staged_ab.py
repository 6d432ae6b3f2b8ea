"""The staged SpMM against the gather kernel and the dense way on the paper's down projection
(bf16, M=16384, K=5632, N=2048), one run, same inputs; then the layer without a sync."""
import statistics, sys, warnings
import cupy, numpy as np, torch
sys.path[:0] = [".", "benchmarks"]
import twell
from twell._cuda import _compile, _cublas, _ffn, _policy, _spmm
from workloads import ffn_inputs32
warnings.filterwarnings("ignore")
BF = np.dtype(twell.bfloat16)

def ev(f, reps=40):
    for _ in range(3):
        f()
    cupy.cuda.Device().synchronize()
    evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for s, e in evs:
        s.record(); f(); e.record()
    evs[-1][1].synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs)

def forced(way, f):
    saved = _policy.spmm_way
    _policy.spmm_way = lambda *a: way
    try:
        return f()
    finally:
        _policy.spmm_way = saved

m, h, d = 16384, 5632, 2048
VARIANTS = [(2, 2, "true", cf, rot) for cf in ("false", "true") for rot in ("false", "true")] + [(3, 2, "true", "true", "false")]
MOD = cupy.RawModule(code=_compile.source_text("spmm.cu"), options=_compile.OPTIONS,
                     name_expressions=[f"twell_spmm_staged<__nv_bfloat16, {sl}, {st}, {steps}, {pairs}, {cf}, {rot}>"
                                       for sl in (8, 16) for st, steps, pairs, cf, rot in VARIANTS])
print(torch.cuda.get_device_name(), "limits", _policy._device_limits())
for s in (0.99, 0.995):
    inp = ffn_inputs32(cupy, m, h, d, s, 1, 0)
    z = inp.z[0].astype(BF) if hasattr(inp, "z") else inp[0][0].astype(BF)
    down = inp.down[0].astype(BF)  # (h, d): B
    del inp
    a = twell.TwELLMatrix(z, tile_width=256)
    parts, shape, nnz = a._parts, a.shape, a._nnz_hint
    rows = forced("rows", lambda: _spmm.spmm(parts, shape, 256, down, BF, nnz_hint=nnz))
    t = {"rows": ev(lambda: forced("rows", lambda: _spmm.spmm(parts, shape, 256, down, BF, nnz_hint=nnz))),
         "dense": ev(lambda: forced("dense", lambda: _spmm.spmm(parts, shape, 256, down, BF, nnz_hint=nnz)))}
    sl = 8 if a.slots <= 8 else 16
    for st, steps, pairs, cf, rot in VARIANTS:
        name = f"twell_spmm_staged<__nv_bfloat16, {sl}, {st}, {steps}, {pairs}, {cf}, {rot}>"
        kern = MOD.get_function(name)
        smem = st * 256 * 256
        kern.max_dynamic_shared_size_bytes = smem
        def run(kern=kern, smem=smem, cf=cf):
            out = cupy.empty((m, d), dtype=BF)
            grid = ((m + 255) // 256, d // 128)
            kern(grid[::-1] if cf == "true" else grid, (512,), (*_spmm._common_args(parts, shape, 256), down, np.int64(d), out), shared_mem=smem)
            return out
        got = run()
        cupy.cuda.Device().synchronize()
        same = bool(cupy.array_equal(got.view(np.uint16), rows.view(np.uint16)))
        t[f"S{sl} st{st} cf={cf} rot={rot}{'' if same else ' DIFF'}"] = ev(run)
    t["default"] = ev(lambda: _spmm.spmm(parts, shape, 256, down, BF, nnz_hint=nnz))
    way = _policy.spmm_way(m, h, d, BF, nnz, _policy.staged_shape(parts, m, 256, d) is not None)
    model = (_policy.staged_seconds(m, h, d, nnz) * 1e3, nnz * d * _policy.GATHER_SECONDS[2] * 1e3,
             _policy.dense_seconds(m, h, d, 2) * 1e3)
    print(f"s={s} tw={a.tile_width} slots={a.slots} nnz={nnz} over={a.overflow_indices.size} way={way} "
          f"model staged/rows/dense={model[0]:.3f}/{model[1]:.3f}/{model[2]:.3f}")
    for k, v in t.items():
        print(f"  {k:24} {v:.4f} ms")
    del z, down, a, parts, rows
    cupy.get_default_memory_pool().free_all_blocks()


# The fixed cost: an empty A (the copies of B, the slot loads, the barriers), each variant.
down = ffn_inputs32(cupy, 64, h, d, 0.99, 1, 0).down[0].astype(BF)
e = twell.TwELLMatrix(cupy.zeros((m, h), dtype=BF), tile_width=256, slots=6)
for st, steps, pairs, cf, rot in VARIANTS:
    kern = MOD.get_function(f"twell_spmm_staged<__nv_bfloat16, 8, {st}, {steps}, {pairs}, {cf}, {rot}>")
    smem = st * 256 * 256
    kern.max_dynamic_shared_size_bytes = smem
    grid = ((m + 255) // 256, d // 128)
    grid = grid[::-1] if cf == "true" else grid
    out = cupy.empty((m, d), dtype=BF)
    print(f"empty A st{st} cf={cf} rot={rot}: {ev(lambda: kern(grid, (512,), (*_spmm._common_args(e._parts, e.shape, 256), down, np.int64(d), out), shared_mem=smem)):.4f} ms")
