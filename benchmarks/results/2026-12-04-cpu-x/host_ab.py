"""The host (NumPy) path before and after the twenty-fourth session, in one process.

Usage: python host_ab.py OLD_DIR, where OLD_DIR holds the old package renamed ``twell_old``:

    mkdir -p /tmp/old && git archive 3db3656 twell | tar -x -C /tmp/old
    mv /tmp/old/twell /tmp/old/twell_old
    PYTHONPATH=. python benchmarks/results/2026-12-04-cpu-x/host_ab.py /tmp/old

Prints best-of-n milliseconds (perf_counter) for ``A @ B`` and ``A.toarray()`` on uniform
float32 matrices (4096 x 5632, 512 columns) and for ``A @ B`` on the benchmark's power-law
graphs at 200 000 rows (64 columns), with scipy.sparse's and NumPy's times beside them.
Products must be bit-identical between the two versions wherever both have the same layout.
"""

import functools
import operator
import pathlib
import sys
import time

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import bench as B  # noqa: E402
import twell_old  # noqa: E402

import twell  # noqa: E402


def best(f, n=3):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def product(x, y):
    """``x @ y`` as a function of no arguments."""
    return functools.partial(operator.matmul, x, y)


def main():
    rng = np.random.default_rng(0)
    m, k, n = 4096, 5632, 512
    print("| density | A @ B old | new | scipy CSR | dense | toarray old | new | scipy |")
    print("|---|---|---|---|---|---|---|---|")
    for density in (0.01, 0.05, 0.1):
        z = rng.standard_normal((m, k)).astype(np.float32)
        z[rng.random((m, k)) > density] = 0
        b = rng.standard_normal((k, n)).astype(np.float32)
        a, a_old, c = twell.TwELLMatrix(z), twell_old.TwELLMatrix(z), sp.csr_matrix(z)
        assert a.slots == a_old.slots
        same = np.array_equal((a @ b).view(np.uint32), (a_old @ b).view(np.uint32))
        assert same and np.array_equal(a.toarray(), z)
        t = [best(product(a_old, b), 2), best(product(a, b)), best(product(c, b)),
             best(product(z, b)), best(a_old.toarray, 5), best(a.toarray, 5),
             best(c.toarray, 5)]
        print(f"| {density:.0%} | " + " | ".join(f"{x:.0f}" for x in t) + " |", flush=True)
    cpu = B.CPU()
    print("\n| graph | T | slots (uncapped) | MB (uncapped) | A @ B old | new | scipy CSR |")
    print("|---|---|---|---|---|---|---|")
    for alpha in (2.0, 1.5):
        c, info = B.powerlaw_graph(cpu, 200_000, 16.0, alpha, 0, np.float32)
        b = rng.standard_normal((c.shape[1], 64)).astype(np.float32)
        for t in (65536, 4096):
            a = twell.TwELLMatrix(c, tile_width=t)
            hist = np.bincount(a.tile_nnz().ravel())
            uncapped = twell.auto_slots(hist, t, max_factor=None)
            pairs = a.shape[0] * a.n_tiles
            over = twell._layout.slot_overflow(hist, uncapped)
            mb = (pairs * (4 + uncapped * 6) + over * 8 + (a.shape[0] + 1) * 8) / 1e6
            old = "out of memory here"
            if pairs * uncapped < 5e8:
                a_old = twell_old.TwELLMatrix(c, tile_width=t)
                if a_old.slots == a.slots:
                    assert np.array_equal((a @ b).view(np.uint32), (a_old @ b).view(np.uint32))
                old = f"{best(product(a_old, b), 1):.0f}"
            print(f"| Pareto({alpha}), nnz {c.nnz}, max degree {info['max_degree']} | {t} | "
                  f"{a.slots} ({uncapped}) | {a.nbytes / 1e6:.0f} ({mb:.0f}) | {old} | "
                  f"{best(product(a, b)):.0f} | {best(product(c, b)):.0f} |", flush=True)


if __name__ == "__main__":
    main()
