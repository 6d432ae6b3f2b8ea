"""NumPy model of ``spmm_tc8.cu``'s k-steps and record dealing (no GPU needed).

Two checks, run before and after the device calls of the thirteenth session:

1. ``check_fragments``: one group's records dealt as ``tc8_records`` deals them, each
   k-step's MMA operands built lane by lane as the kernel builds them (the A registers from
   byte permutes of each lane's 16-byte chunks, the selection register from the records'
   tokens), multiplied with the PTX fragment layouts of m16n8k8, and the lanes' outputs
   stored as the kernel stores them: the result must equal the plain sum of the entries.
2. ``dealing_cost``: the k-steps and shared-memory wavefronts (B loads only) per
   (group, tile) of the kernel's dealing, against filling each quad's missing bank classes
   with zero records (conflict-free, more k-steps), for Poisson-distributed record counts.

``python benchmarks/prototypes/spmm_tc8_emulation.py``
"""

import numpy as np


def dealt(i, nq):
    """Position of sorted record ``i`` among ``4 nq``: quad ``i % nq``, member ``i // nq``."""
    member = (i >= nq) + (i >= 2 * nq) + (i >= 3 * nq)
    quad = i - member * nq
    return 8 * (quad >> 1) + 2 * member + (quad & 1)


def deal(entries):
    """``entries[token]``: (value, column) pairs. Records (token, column, value) in the
    kernel's positions: sorted by class (column & 3), dealt over the quads, zero records
    padding to a multiple of 8."""
    flat = sorted(((c & 3, tok, c, v) for tok, row in enumerate(entries) for v, c in row),
                  key=lambda r: r[0])  # stable: the kernel keeps token order within a class
    length = -(-len(flat) // 8) * 8
    records = [(0, 0, 0.0)] * length
    for i in range(length):
        rec = flat[i][1:] if i < len(flat) else (0, 0, 0.0)
        records[dealt(i, length // 4)] = rec
    return records


def run_group(records, b):
    """The group's 8 x 64 output as the kernel's lanes compute and store it."""
    d = np.zeros((4, 16, 8))  # per column tile j: the MMA's m16 x n8 accumulator
    for k0 in range(0, len(records), 8):
        a = np.zeros((4, 16, 8))
        s = np.zeros((8, 8))
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            lo, hi = records[k0 + 2 * t], records[k0 + 2 * t + 1]
            x, y = b[lo[1], 8 * g:8 * g + 8], b[hi[1], 8 * g:8 * g + 8]
            for j in range(4):  # a0 = low halves (column 8g + 2j), a1 = high (8g + 2j + 1)
                a[j, g, 2 * t:2 * t + 2] = x[2 * j], y[2 * j]
                a[j, g + 8, 2 * t:2 * t + 2] = x[2 * j + 1], y[2 * j + 1]
            s[2 * t, g] = lo[2] if lo[0] == g else 0.0
            s[2 * t + 1, g] = hi[2] if hi[0] == g else 0.0
        d += a @ s
    out = np.zeros((8, 64))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for h in range(2):  # tokens 2t and 2t + 1: columns 8g .. 8g + 7
            out[2 * t + h, 8 * g:8 * g + 8:2] = d[:, g, 2 * t + h]
            out[2 * t + h, 8 * g + 1:8 * g + 8:2] = d[:, g + 8, 2 * t + h]
    return out


def check_fragments(rng, trials=200):
    for _ in range(trials):
        b = rng.standard_normal((256, 64))
        entries = []
        for _tok in range(8):
            cols = np.sort(rng.choice(256, size=min(rng.poisson(2.56), 8), replace=False))
            entries.append([(float(rng.standard_normal()), int(c)) for c in cols])
        want = np.zeros((8, 64))
        for tok, row in enumerate(entries):
            for v, c in row:
                want[tok] += v * b[c]
        np.testing.assert_allclose(run_group(deal(entries), b), want, atol=1e-12)
    print(f"fragments: {trials} groups equal to the plain sums")


def dealing_cost(rng, mean, trials=20000):
    """Mean (k-steps, wavefronts) per (group, tile): the kernel's dealing, then full quads."""
    kernel, full = np.zeros(2), np.zeros(2)
    for _ in range(trials):
        n = rng.poisson(mean)
        if n == 0:
            continue
        classes = np.sort(rng.integers(0, 4, n))
        length = -(-n // 8) * 8
        nq = length // 4
        quads = [[] for _ in range(nq)]
        for i, c in enumerate(classes):
            quads[i % nq].append(c)
        # 4 phases per LDS.128; a phase needs as many wavefronts as its most shared class.
        kernel += (length // 8, sum(4 * max(1, np.bincount(q, minlength=4).max()) if q else 4
                                    for q in quads))
        q_full = max(np.bincount(classes, minlength=4).max(), -(-n // 4))
        q_full += q_full % 2
        full += (q_full // 2, 4 * q_full)
    kernel, full = kernel / trials, full / trials
    print(f"records ~ Poisson({mean}): dealt {kernel[0]:.2f} k-steps, {kernel[1]:.1f} "
          f"wavefronts; full quads {full[0]:.2f} k-steps, {full[1]:.1f} wavefronts")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    check_fragments(rng)
    for mean in (10, 20.5, 41):  # 8 tokens x 256 columns at 99.5%, 99%, 98%
        dealing_cost(rng, mean)
