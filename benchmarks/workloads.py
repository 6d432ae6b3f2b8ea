"""The matrices the suites measure, made on NumPy or CuPy without twell.

Activations: Z = relu(X W^T) with the bias-column trick (X[:, 0] = 1, W[:, 0] = -Phi^-1(s)),
which makes each column fire with probability 1 - s, uniformly (the worst case for weight
reuse), or with per-column probabilities (hot neurons). Scientific matrices: the 2-D Poisson
5-point stencil and a random graph with Pareto-tailed out-degrees.
"""

import dataclasses
import math

import numpy as np
from arrays import RNG, relu, rows_of

#: The paper's 2B feed-forward shape: tokens, hidden width, model width.
FFN_M, FFN_K, FFN_N = 16384, 5632, 2048
FFN_SPARSITIES = (0.99, 0.95, 0.90)
SWEEP = (0.90, 0.92, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999)
#: Sweep sparsities at which the gated layer runs too (the ``ffn`` workload has 99% and 95%).
LAYER_SWEEP = (0.995, 0.999)
#: The tile width of the paper's kernels and of the reference packed layout: the tile
#: statistics of the activations are counted in tiles of this width.
FFN_TILE_WIDTH = 256
SCI_GRID = 1000            # Poisson grid side: n = 10^6
SCI_GRAPH_N = 1_000_000
SCI_GRAPH_DEGREE = 16.0    # mean degree
SCI_GRAPH_ALPHA = 2.0      # Pareto tail index: max degree ~ xmin * n^(1/alpha), thousands
SCI_RHS = (64, 256, 512)
SCI_TILE_WIDTHS = (65536, 4096, 256)


def _ndtri(p):
    from scipy.special import ndtri

    return float(ndtri(p))


def zipf_probabilities(k, density, seed):
    """Per-column firing probabilities ``rank^-a`` with mean ``density``, shuffled.

    ``a`` is found by bisection (the mean of ``rank^-a`` falls from 1 at a = 0 towards
    1/k); the most popular column always fires.
    """
    r = np.arange(1, k + 1, dtype=np.float64)
    lo, hi = 0.0, 64.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.mean(r ** -mid) > density:
            lo = mid
        else:
            hi = mid
    a = 0.5 * (lo + hi)
    p = np.minimum(r ** -a, 1.0)
    return p[np.random.default_rng(seed).permutation(k)], a


@dataclasses.dataclass
class Inputs:
    """Input sets of one activation case, one entry per rotating buffer."""

    z: list
    down: list
    v: list
    x: list | None = None
    w: object = None


def n_buffers(bench, nbytes):
    """Rotate among ``--buffers`` input sets when one set would sit in L2 (< 4 x L2)."""
    return bench.args.buffers if nbytes < 4 * bench.dev.l2_bytes else 1


def ffn_inputs32(xp, m, k, n, s, nbuf, seed, with_x=True, thresholds=None):
    """float32 inputs: Z = relu(X W^T) with the bias-column trick, DOWN, v.

    Column j of Z fires with probability 1 - s, or where ``thresholds`` (k,) is given,
    1 - Phi(thresholds[j]).
    """
    g = RNG(xp, seed)
    thr = _ndtri(s) if thresholds is None else xp.asarray(thresholds.astype(np.float32))
    w = g.normal((k, n)) / np.float32(math.sqrt(max(n - 1, 1)))
    w[:, 0] = -thr
    xs, zs = [], []
    for _ in range(nbuf):
        x = g.normal((m, n))
        x[:, 0] = 1.0
        zs.append(relu(xp, x @ w.T))
        xs.append(x if with_x else None)
    down = [g.normal((k, n)) / np.float32(math.sqrt(k)) for _ in range(nbuf)]
    v = [g.normal((k,)) for _ in range(nbuf)]
    return Inputs(zs, down, v, xs if with_x else None, w)


def hot_inputs32(xp, m, k, n, s, nbuf, seed):
    """float32 inputs with Zipf-like per-column firing probabilities p_j: the bias-column
    trick with a bias per column, W[j, 0] = -Phi^-1(1 - p_j), so that the fused GEMM and the
    gated FFN run on the hot activations too. The hottest column's p_j = 1 is capped at
    1 - 1e-7 (a finite bias: it fires in all but ~1e-7 of the rows)."""
    from scipy.special import ndtri

    p, a = zipf_probabilities(k, 1.0 - s, seed)
    thresholds = ndtri(1.0 - np.clip(p, 1e-12, 1.0 - 1e-7))
    inp = ffn_inputs32(xp, m, k, n, s, nbuf, seed + 1, thresholds=thresholds)
    return inp, {"zipf_exponent": a, "p_max": float(p.max()), "p_min": float(p.min())}


def tile_counts(xp, nonzero, tile_width=FFN_TILE_WIDTH):
    """Non-zeros per (row, tile) from a boolean mask, int32: computed without twell."""
    m, k = nonzero.shape
    nt = -(-k // tile_width)
    if nt * tile_width != k:
        pad = xp.zeros((m, nt * tile_width - k), dtype=bool)
        nonzero = xp.concatenate([nonzero, pad], axis=1)
    return nonzero.reshape(m, nt, tile_width).sum(axis=2, dtype=np.int32)


def poisson2d(xp, sp, g, dtype):
    """5-point Laplacian on a g x g grid (4 on the diagonal, -1 to each neighbour), CSR."""
    n = g * g
    idx = xp.arange(n, dtype=np.int64)
    i, j = idx // g, idx % g
    rows, cols = [idx], [idx]
    for keep, shift in ((i > 0, -g), (i < g - 1, g), (j > 0, -1), (j < g - 1, 1)):
        r = idx[keep]
        rows.append(r)
        cols.append(r + shift)
    rows, cols = xp.concatenate(rows), xp.concatenate(cols)
    vals = xp.full(rows.size, -1.0, dtype=dtype)
    vals[:n] = 4.0
    a = sp.coo_matrix((vals, (rows.astype(np.int32), cols.astype(np.int32))), shape=(n, n))
    a = a.tocsr()
    a.sum_duplicates()
    return a, {"grid": g, "n": n}


def powerlaw_graph(xp, sp, n, mean_degree, alpha, seed, dtype):
    """Random graph: Pareto(alpha) out-degrees with mean ~mean_degree, uniform columns, CSR."""
    host = np.random.default_rng(seed)
    xmin = mean_degree * (alpha - 1) / alpha + 0.5  # + 0.5: the floor below loses ~0.5
    deg = np.floor(xmin * (1.0 - host.random(n)) ** (-1.0 / alpha)).astype(np.int64)
    deg = np.clip(deg, 1, max(1, n // 4))
    indptr = xp.asarray(np.concatenate([[0], np.cumsum(deg)]))
    nnz = int(deg.sum())
    g = RNG(xp, seed + 1)
    rows = rows_of(xp, indptr, nnz).astype(np.int32)
    cols = g.integers(n, nnz).astype(np.int32)
    # Values in [0.25, 1.25): float32 normals include exact zeros (~1 in 3 M), and summed
    # duplicates could cancel; the exact round-trip checks need a canonical CSR without
    # explicit zeros.
    vals = (g.uniform((nnz,)) + 0.25).astype(dtype)
    a = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
    a.sum_duplicates()
    return a, {"n": n, "mean_degree": float(deg.mean()), "max_degree": int(deg.max()),
               "alpha": alpha}
