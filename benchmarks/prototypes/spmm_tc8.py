# ruff: noqa: B023 - closures are called inside the loop iteration that defines them
"""PROTOTYPE check and timing of ``spmm_tc8.cu`` (tensor-core SpMM, tokens as the MMA's n,
B tiles staged in shared memory) against the shipped SpMM ways and dense cuBLAS.

Open question 3 of benchmarks/NOTES.md: at 99% the shipped gather kernel reads every
entry's B row from L2 (0.47 ms on the paper's down projection; dense cuBLAS 0.42). One
device call answers: is the prototype right (relative error against the float64 product
within bf16 rounding; outputs poisoned with NaN, ``?n``: n left unwritten), on shapes with
partial row blocks, partial tiles, partial column blocks and overflow; and how fast is each
variant (v3 or v4, 2 or 3 pipeline stages; the records kernel timed apart too) against the
launcher's pick, the gather kernel and dense cuBLAS, on the same inputs (``--only 0.99
--variant v3_p2``: one case and one variant, for a profiler). Run from the repository root
on an H100/H200:

    PYTHONPATH=. timeout 400 python benchmarks/prototypes/spmm_tc8.py [--only 0.99 --variant V]
"""

import argparse
import pathlib
import sys

import cupy
import numpy as np

import twell
from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/
import _dev  # noqa: E402

ROWS, COLS, THREADS, MAX_TILE = 512, 64, 512, 256
#: name: (kernel, STAGES). v3 ("tc8s"): cp.async by every thread, a block barrier per tile;
#: v4 ("tc8b"): bulk copies by warp 0 on mbarriers, one per B row; v5 ("tc8t"): v4 with one
#: copy per tile from B's tiles swizzled beforehand (`b_tiles`, timed apart) (spmm_tc8.cu).
VARIANTS = {"v3_p2": ("tc8s", 2), "v3_p3": ("tc8s", 3), "v4_p2": ("tc8b", 2),
            "v5_p2": ("tc8t", 2), "v5_p3": ("tc8t", 3)}
RECORDS = {"tc8s": "", "tc8b": "_v4", "tc8t": "_v5"}
SMEM_LIMIT = 227 * 1024
MODULE = {}


def smem(cap, stages, kind):
    """Dynamic shared memory: the stages (B tile, records, lengths); v4 also its mbarriers and
    1 KB of scratch per warp (v3 borrows stage 0 for it)."""
    if kind in ("tc8b", "tc8t"):  # v4: B rows of 160 bytes
        row = 160 if kind == "tc8b" else 128
        return stages * (MAX_TILE * row + 64 * cap * 8 + 64 * 4) + 16 * stages + 16 * 1024
    return stages * (MAX_TILE * 128 + 64 * cap * 8 + 64 * 4)


def kernels():
    module = cupy.RawModule(code=(HERE / "spmm_tc8.cu").read_text(),
                            options=(*_kernels.OPTIONS, f"-I{_kernels.source_dir()}"))
    MODULE["m"] = module
    out = {}
    for name, (kind, stages) in VARIANTS.items():
        k = module.get_function(f"proto_spmm_{kind}_bf16_p{stages}")
        k.max_dynamic_shared_size_bytes = SMEM_LIMIT
        out[name] = k
    return out


def records(a, kind="tc8s"):
    """tc8_records: (records, lens, cap) of a, in the layout of kernel ``kind``."""
    p, (m, k) = a._parts, a.shape
    tiles, cap, groups = -(-k // a.tile_width), 8 * a.slots, -(-m // 32) * 4
    blocked = kind != "tc8s"
    if blocked:
        groups = -(-m // ROWS) * 64
    recs = cupy.empty(max(groups * tiles * cap * 2, 4), dtype=np.uint32)
    lens = (cupy.zeros if blocked else cupy.empty)(max(tiles * groups, 4), dtype=np.int32)
    kern = MODULE["m"].get_function(f"proto_tc8_records{RECORDS[kind]}_bf16_s"
                                    f"{8 if a.slots <= 8 else 16}")
    kern((-(-m // 256),), (256,), (p.counts, p.data, p.indices, np.int64(m), np.int64(k),
                                   np.int32(a.tile_width), np.int32(a.slots), recs, lens))
    return recs, lens, cap


TILES = {}


def b_tiles(b, tile_width):
    """v5's copy of B: [column block][row, padded to whole tiles][64 columns], each row's
    16-byte chunk c at c ^ 2 (row & 3) (the swizzle the records' offsets assume)."""
    k, n = b.shape
    kp, blocks = -(-k // tile_width) * tile_width, -(-n // COLS)
    padded = cupy.zeros((kp, blocks * COLS), dtype=b.dtype)
    padded[:k, :n] = b
    x = padded.reshape(kp, blocks, 8, 8).transpose(1, 0, 2, 3)
    rows = cupy.arange(kp)
    source = cupy.arange(8)[None, :] ^ (2 * (rows & 3))[:, None]  # chunk at each position
    return cupy.ascontiguousarray(x[:, rows[:, None], source, :])


def run(kernel, name, a, b, poison=False, built=None):
    """The records (unless ``built``), then the product; NaN-poisoned output if ``poison``.
    v5's swizzled B is built once per B and kept (``b_tiles``, timed apart)."""
    p, (m, k), n = a._parts, a.shape, b.shape[1]
    kind, stages = VARIANTS[name]
    recs, lens, cap = built or records(a, kind)
    y = cupy.full((m, n), np.nan, dtype=b.dtype) if poison else cupy.empty((m, n), b.dtype)
    extra = ()
    if kind != "tc8s":
        key = (b.data.ptr, b.shape, a.tile_width)
        if kind == "tc8t" and key not in TILES:
            TILES.clear()
            TILES[key] = b_tiles(b, a.tile_width)
        extra = (TILES[key] if kind == "tc8t" else b,)
    kernel((-(-n // COLS), -(-m // ROWS)), (THREADS,), (
        recs, lens, np.int32(cap), p.overflow_indptr, p.overflow_indices, p.overflow_data,
        np.int64(m), np.int64(k), np.int32(a.tile_width), b, *extra, np.int64(n), y),
        shared_mem=smem(cap, stages, kind))
    return y


def rel(y, want):
    y = y.astype(np.float64)
    return float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want))


def fits(name, a):
    kind, stages = VARIANTS[name]
    return (a.slots <= 16 and a.tile_width <= MAX_TILE
            and smem(8 * a.slots, stages, kind) <= SMEM_LIMIT)


def check(ks, label, z, b):
    """Poisoned outputs of every variant that fits, against the float64 product."""
    want = z.astype(np.float64) @ b.astype(np.float64)
    TILES.clear()  # a new B (the pool may give it a freed B's address)
    a = twell.TwELLMatrix(z, slots=SLOTS.get(label, "auto"))
    cells = []
    for name, kern in ks.items():
        if not fits(name, a):
            cells.append(f"{name}:-")
            continue
        try:
            y = run(kern, name, a, b, poison=True)
            cupy.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing variant is a cell (a trap is sticky)
            cells.append(f"{name}:{type(exc).__name__}")
            continue
        bad = int(cupy.isnan(y).sum())
        e = rel(y, want)
        again = run(kern, name, a, b, poison=True)
        same = bool(cupy.array_equal(y.view(np.uint16), again.view(np.uint16)))
        cells.append(f"{name}:{e:.1e}{'!' if e > 1e-2 else ''}{f'?{bad}' if bad else ''}"
                     f"{'' if same else ' NONDET'}")
    print(f"{label:34s} S={a.slots:2d} over={a.overflow_nnz:6d}  " + "  ".join(cells),
          flush=True)


SLOTS = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", type=float, default=None)
    ap.add_argument("--variant", default=None)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    ks = kernels()
    if args.variant:
        ks = {args.variant: ks[args.variant]}
    rng = np.random.default_rng(0)
    bf16 = twell.bfloat16
    if args.only is None:
        print("correctness: rel. error vs float64 (! above 1e-2, ?n unwritten, NONDET: two "
              "runs differ)")
        for (m, k, n, s, slots) in ((1000, 1000, 200, 0.9, 2), (1000, 1000, 200, 0.99, "auto"),
                                    (777, 5632, 2048, 0.97, 4), (513, 300, 72, 0.5, 8),
                                    (4096, 5632, 2048, 0.99, "auto")):
            z = _dev.activations(m, k, 64, s, rng).astype(bf16)
            b = cupy.asarray(rng.standard_normal((k, n), dtype=np.float32)).astype(bf16)
            label = f"M={m} K={k} N={n} s={s}"
            SLOTS[label] = slots
            check(ks, label, z, b)
    m, k, n = 16384, 5632, 2048
    print(f"\nFFN down projection M={m} K={k} N={n} bf16: ms (CUDA events, median of "
          f"{args.reps}); rel. error in brackets where above 5e-3")
    heads = ["dense", "launcher", "rows", "records", "v3_p2 main", "B tiles"] + list(ks)
    print(f"{'sparsity':10s}{'S':>4s} " + " ".join(f"{h:>13s}" for h in heads), flush=True)
    sparsities = [args.only] if args.only else [0.999, 0.995, 0.99, 0.95, 0.90]
    for s in sparsities:
        z = _dev.activations(m, k, n, s, rng).astype(bf16)
        down = (cupy.asarray(rng.standard_normal((k, n), dtype=np.float32))
                / np.sqrt(k)).astype(bf16)
        want = z.astype(np.float32) @ down.astype(np.float32)
        TILES.clear()
        for slots in ("auto", "max"):
            a = twell.TwELLMatrix(z)
            if slots == "max":
                top = int(a.tile_nnz().max())
                if top == a.slots or top > 32:
                    continue
                a = twell.TwELLMatrix(z, slots=top)
            fns = {"dense": lambda: z @ down, "launcher": lambda a=a: a @ down,
                   "rows": lambda a=a: _cupy_backend.spmm(a._parts, a.shape, a.tile_width, down,
                                                          down.dtype, variant="rows")}
            for name, kern in ks.items():
                if fits(name, a):
                    fns[name] = lambda kern=kern, name=name, a=a: run(kern, name, a, down)
            if "v3_p2" in ks and fits("v3_p2", a):
                built = records(a)
                fns["records"] = lambda a=a: records(a)[0]
                fns["v3_p2 main"] = lambda a=a, built=built: run(ks["v3_p2"], "v3_p2", a, down,
                                                                  built=built)
            fns["B tiles"] = lambda a=a: b_tiles(down, a.tile_width)
            cells = []
            for h in heads:
                if h not in fns:
                    cells.append(f"{'-':>13s}")
                    continue
                try:
                    y = fns[h]()
                    e = 0.0 if y.shape != want.shape else float(
                        cupy.linalg.norm(y.astype(np.float32) - want) / cupy.linalg.norm(want))
                    ms = _dev.timed(fns[h], reps=args.reps)
                    cells.append(f"{ms:8.3f}" + (f"[{e:.0e}]" if e > 5e-3 else "     "))
                except Exception as exc:  # noqa: BLE001 - a failing contender is a cell
                    cells.append(f"{type(exc).__name__[:13]:>13s}")
            print(f"{s:<6}{slots:>4s}{a.slots:4d} " + " ".join(cells), flush=True)
            if args.only:
                break


if __name__ == "__main__":
    main()
