"""PROTOTYPE check and timing of ``pack_stream.cu``: the dense pack's count and slots passes
with each warp looping over its groups and a ring of groups in shared memory filled by
cp.async (NOTES, open question 4), against the shipped ``twell_pack_dense`` (v4 until
9560815, the lean form since; the table's "v4" row is the shipped kernel).

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernel's bits (totals, counts, slots, overflow count; outputs poisoned first) on
the paper's activations at 99%, 95% and 90% and on small odd shapes with NaN, Inf and -0.0,
in bfloat16 and float32; and how fast are both passes alone (CUDA events, medians, every
contender interleaved in rounds: the card's clock drops once warm), beside a read-only kernel
and a device-to-device copy of the same bytes. Run from the repository root on a GPU:

    PYTHONPATH=. python benchmarks/prototypes/pack_stream.py
"""

import pathlib
import sys

import cupy
import numpy as np

import twell
from twell import _cupy_backend as gb
from twell import _kernels, _layout

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the development helpers
import _dev  # noqa: E402

WARPS = 8  # kStreamWarps
STAGE_CHOICES = (2, 3, 4)
KINDS = (3,)  # checked and timed: the streaming kernel with 3 stages
i32, i64 = np.int32, np.int64


def shape_of(dtype, tile_width):
    """(VEC, PAIRS, CHUNKS) as the shipped launcher picks them for one-load or staged tiles."""
    vec = _kernels.vector_width(dtype)
    loads = -(-tile_width // (32 * vec))
    if loads == 1:
        return vec, _kernels.PACK_PAIRS, 1
    pairs, chunks = _kernels.PACK_STAGED_SHAPES[2 if loads == 2 else 4]
    return vec, pairs, chunks


def expr(dtype, tile_width, stages):
    """The streaming kernel with ``stages`` stages."""
    vec, pairs, chunks = shape_of(dtype, tile_width)
    ctype = _kernels.CTYPES[np.dtype(dtype)]
    return f"proto_pack_stream<{ctype}, {vec}, {pairs}, {chunks}, {stages}>"


_MODULES = {}


def module(exprs):
    key = tuple(exprs)
    if key not in _MODULES:
        options = (*_kernels.OPTIONS, f"-I{_kernels.source_dir()}", f"-I{HERE}",
                   *_kernels._nvrtc_includes())
        _MODULES[key] = cupy.RawModule(code=(HERE / "pack_stream.cu").read_text(),
                                       options=options, name_expressions=list(exprs))
    return _MODULES[key]


class Stream:
    """proto_pack_stream for one dtype, tile width and stage count, called as the launcher's
    slots and count passes; its grid is what the device holds at once."""

    def __init__(self, dtype, tile_width, stages):
        self.dtype, self.tile_width, self.stages = np.dtype(dtype), tile_width, stages
        name = expr(dtype, tile_width, stages)
        mod = module([expr(d, tile_width, s) for d in (twell.bfloat16, np.float32)
                      for s in STAGE_CHOICES])
        self.kernel = mod.get_function(name)
        vec, pairs, chunks = shape_of(dtype, tile_width)
        self.pairs = pairs
        self.smem = WARPS * pairs * chunks * 32 * (16 * stages + 2 * vec)
        self.kernel.max_dynamic_shared_size_bytes = self.smem
        dev = cupy.cuda.Device()
        per_sm_smem = dev.attributes["MaxSharedMemoryPerMultiprocessor"]
        regs = self.kernel.num_regs * WARPS * 32
        self.per_sm = max(1, min(per_sm_smem // (self.smem + 1024), 65536 // regs, 64 // WARPS))
        self.grid_cap = self.per_sm * dev.attributes["MultiProcessorCount"]

    def __call__(self, z, slots, mode, totals, parts, counter):
        m, k = z.shape
        groups = -(-m * _layout.n_tiles(k, self.tile_width) // self.pairs)
        grid = max(1, min(-(-groups // WARPS), self.grid_cap))
        self.kernel((grid,), (WARPS * 32,), (
            z, i64(m), i64(k), i32(self.tile_width), i32(slots), i32(mode), totals,
            parts.counts, parts.data, parts.indices, counter), shared_mem=self.smem)


def shipped(z, tile_width, slots, mode, totals, parts, counter):
    gb._launch_pack_dense(z, tile_width, slots, mode, totals, parts, None, counter)


def outputs(z, tile_width, slots):
    m, k = z.shape
    nt = _layout.n_tiles(k, tile_width)
    parts = gb._empty_parts(m, nt, slots, z.dtype, zeroed=False, overflow=False)
    totals = cupy.empty((m, nt), dtype=_layout.COUNT_DTYPE)
    for a in (parts.counts, parts.data, parts.indices, totals):
        a.view(np.uint8).fill(0xA5)  # poison: every element is written or the check fails
    return totals, parts, cupy.zeros(1, dtype=np.uint64)


def bits(a):
    return a.view(np.uint8)


def check(z, tile_width, slots, stages):
    """Both passes of the prototype against the shipped kernel's; returns a failure or ''."""
    fn = Stream(z.dtype, tile_width, stages)
    want, got = outputs(z, tile_width, slots), outputs(z, tile_width, slots)
    for mode in (gb._MODE_COUNT, gb._MODE_SLOTS):
        shipped(z, tile_width, slots, mode, *want)
        fn(z, slots, mode, *got)
        names = ("totals",) if mode == gb._MODE_COUNT else (
            "totals", "counts", "data", "indices", "overflow count")
        def arrays(o, mode=mode):
            return (o[0],) if mode == gb._MODE_COUNT else (
                o[0], o[1].counts, o[1].data, o[1].indices, o[2])
        for name, a, b in zip(names, arrays(want), arrays(got), strict=True):
            if not bool(cupy.array_equal(bits(a), bits(b))):
                return f"mode {mode}: {name} differ"
    return ""


def odd_matrix(rng, m, k, dtype):
    z = rng.standard_normal((m, k)).astype(np.float32)
    z[rng.random((m, k)) < 0.93] = 0.0
    z.flat[rng.integers(0, m * k, 40)] = np.nan
    z.flat[rng.integers(0, m * k, 40)] = np.inf
    z.flat[rng.integers(0, m * k, 40)] = -0.0
    z[: m // 7, : k // 3] = rng.standard_normal((m // 7, k // 3))  # dense corner: overflow
    return cupy.asarray(z.astype(dtype))


def main():
    dev = cupy.cuda.Device()
    print(f"{cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, "
          f"CuPy {cupy.__version__}")
    rng = np.random.default_rng(3)
    failures = 0
    for dtype in (twell.bfloat16, np.float32):
        for m, k, tw, slots in ((1000, 1000, 256, 4), (333, 2056, 64, 2), (77, 5632, 128, 16),
                                (257, 800, 256, 1)):
            z = odd_matrix(rng, m, k, dtype)
            for stages in KINDS:
                err = check(z, tw, slots, stages)
                failures += bool(err)
                if err:
                    print(f"  FAIL {np.dtype(dtype).name} {m}x{k} T={tw} S={slots} "
                          f"stages={stages}: {err}")
    m, k = 16384, 5632
    cases = {}
    for s in (0.99, 0.95, 0.90):
        for dtype in (twell.bfloat16, np.float32):
            z = _dev.activations(m, k, 2048, s, np.random.default_rng(0)).astype(dtype)
            slots = twell.TwELLMatrix(z).slots
            for stages in KINDS:
                err = check(z, 256, slots, stages)
                failures += bool(err)
                if err:
                    print(f"  FAIL {np.dtype(dtype).name} {s} S={slots} stages={stages}: {err}")
            cases[(s, np.dtype(dtype).name)] = (z, slots)
    print("all checks passed" if failures == 0 else f"{failures} CHECKS FAILED", flush=True)
    if failures:
        return

    read = module([expr(twell.bfloat16, 256, 2)]).get_function("proto_read_only")
    sink = cupy.zeros(1, dtype=np.uint32)
    rows = []
    for (s, dname), (z, slots) in cases.items():
        contenders = {"v4": lambda *a, z=z: shipped(z, 256, *a)}
        for stages in KINDS:
            fn = Stream(z.dtype, 256, stages)
            name = f"stream{stages} ({fn.per_sm}/SM)"
            contenders[name] = lambda *a, z=z, fn=fn: fn(z, *a)
        outs = outputs(z, 256, slots)
        copy_dst = cupy.empty_like(z)
        n_vec = z.nbytes // 16
        floors = {
            "read only": lambda z=z, n_vec=n_vec: read(
                (dev.attributes["MultiProcessorCount"] * 8,), (256,), (z, i64(n_vec), sink)),
            "copy (r+w)": lambda z=z, d=copy_dst: d.data.copy_from_device_async(z.data, z.nbytes),
        }
        times = {}
        for _ in range(3):  # rounds, interleaved
            for name, fn in contenders.items():
                for mode, label in ((gb._MODE_SLOTS, "slots"), (gb._MODE_COUNT, "count")):
                    t = _dev.timed(lambda fn=fn, mode=mode, slots=slots, outs=outs:
                                   fn(slots, mode, *outs), reps=20)
                    times.setdefault((name, label), []).append(t)
            for name, fn in floors.items():
                times.setdefault((name, ""), []).append(_dev.timed(fn, reps=20))
        for (name, label), ts in times.items():
            ms = float(np.median(ts))
            rows.append((f"{dname} {s:.2f} S={slots}", f"{name} {label}".strip(), ms * 1e3,
                         z.nbytes / (ms * 1e-3) / 1e12))
    print(f"\n{'case':<22} {'kernel':<24} {'us':>8} {'read TB/s':>10}")
    for case, name, us, tbps in rows:
        print(f"{case:<22} {name:<24} {us:8.1f} {tbps:10.2f}")


if __name__ == "__main__":
    main()
