"""A NumPy model of the ranks of ``pack_accumulators`` (``cuda_src/wgmma.cuh``; written for the
prototype ``matmul_pack_sm90_regs.cu``, in git at 14e2bb0, which shipped as it): the per-lane
masks, the quad's swap and the popcount sums, checked against each entry's rank by column in
its tile (no GPU).

For one 256-column block of rows of random sparsity, every tile width the kernel takes
(8 * 2**i up to 256) and columns cut short by N: lane q of a quad holds the row's columns
8 j + 2 q + b as bit 2 j + b of its mask; the kernel's rank of an entry is the entries of
the four masks in its tile's chunks before j, plus those of lower lanes in chunk j, plus b;
its tile total the popcount of the four masks over the tile's bits. Run:

    python benchmarks/prototypes/matmul_pack_sm90_regs_emulation.py
"""

import numpy as np


def bit_range(first, count):
    """The kernel's bit_range: bits [first, first + count) of a 64-bit mask."""
    ones = (1 << 64) - 1 if count >= 64 else (1 << count) - 1
    return 0 if first >= 64 else (ones << first) & ((1 << 64) - 1)


def popc(v):
    return bin(v).count("1")


def lane_masks(row_nonzero, valid_cols):
    """Masks of the four lanes of a quad for one row of the block (256 booleans)."""
    masks = [0, 0, 0, 0]
    for j in range(32):
        for q in range(4):
            for b in range(2):
                col = 8 * j + 2 * q + b
                if row_nonzero[col] and col < valid_cols:
                    masks[q] |= 1 << (2 * j + b)
    return masks


def kernel_ranks(masks, tile_width):
    """{column: (tile, rank)} and {tile: total} as the kernel computes them."""
    log_chunks = (tile_width // 8).bit_length() - 1
    tile_bits = 2 << log_chunks
    totals = {t: sum(popc(m & bit_range(t * tile_bits, tile_bits)) for m in masks)
              for t in range(256 // tile_width)}
    ranks = {}
    for q, mask in enumerate(masks):
        rest = mask
        while rest:
            bit = (rest & -rest).bit_length() - 1
            rest &= rest - 1
            j, b = bit >> 1, bit & 1
            t = j >> log_chunks
            before = bit_range(t * tile_bits, 2 * j - t * tile_bits)
            r = (mask >> (2 * j) & 1) if b == 1 else 0
            for p in range(4):
                r += popc(masks[p] & before)
                if p < q:
                    r += popc((masks[p] >> (2 * j)) & 3)
            ranks[8 * j + 2 * q + b] = (t, r)
    return ranks, totals


def main():
    rng = np.random.default_rng(0)
    cases = 0
    for density in (0.01, 0.1, 0.5, 1.0):
        for valid_cols in (256, 255, 130, 1):
            for tile_width in (8, 16, 32, 64, 128, 256):
                for _ in range(20):
                    row = rng.random(256) < density
                    ranks, totals = kernel_ranks(lane_masks(row, valid_cols), tile_width)
                    kept = np.flatnonzero(row[:valid_cols])
                    want = {}
                    for col in kept:
                        t = col // tile_width
                        want[int(col)] = (t, int(np.sum((kept >= t * tile_width) & (kept < col))))
                    assert ranks == want, (density, valid_cols, tile_width)
                    for t, total in totals.items():
                        assert total == sum(1 for c in kept if c // tile_width == t)
                    cases += 1
    print(f"{cases} rows: the kernel's ranks and totals are the column ranks in each tile")


if __name__ == "__main__":
    main()
