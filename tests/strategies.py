"""Hypothesis strategies for twell's tests.

The shape of a test matrix (rows, columns, tile width, slot count) and the
*number* of non-zeros of every (row, tile) are chosen deliberately: columns
around the tile width (``K == T``, ``K == T + 1``, partial last tiles, no
columns at all), per-tile counts biased toward 0, 1, ``slots - 1``,
``slots``, ``slots + 1`` and full tiles (overflow), whole heavy rows. Where
the non-zeros sit inside a tile and their values come from a NumPy
generator seeded by hypothesis: that keeps generation fast for matrices of
thousands of entries and still reproducible (hypothesis shrinks the seed
and the shape).

Matrices are float64 NumPy arrays; tests cast them to the dtype under test.
Known edge cases are in :data:`EDGE_CASES` and go on tests as ``@example``
through :func:`edge_examples`.
"""

from typing import NamedTuple

import numpy as np
from hypothesis import example
from hypothesis import strategies as st

#: 65537 is the narrowest tile whose columns are int32 (twell._layout.index_dtype).
TILE_WIDTHS = (1, 2, 3, 8, 16, 256, 65537)
MAX_ROWS = 40
MAX_COLS = 600

#: Values that test what counts as a non-zero and what a cast keeps.
SPECIAL_VALUES = np.array([
    np.nan, np.inf, -np.inf,  # non-zeros like any other
    5e-324, -1e-310,  # float64 subnormals (zero in every narrower type)
    1e-300, 1e300, -1e39,  # zero / Inf in float32, float16, bfloat16
    1e-46,  # rounds to zero in float32 and bfloat16
    -1e-40,  # subnormal in float32 and bfloat16
    1e-8, -2e-8,  # round to zero in float16
    1e-6,  # float16 subnormal
    65520.0,  # rounds to Inf in float16
])

# Weights over the per-(row, tile) count choices
# (0, 1, slots - 1, slots, slots + 1, full tile, uniform in [0, extent]).
COUNT_PROFILES = {
    "empty": (1, 0, 0, 0, 0, 0, 0),
    "sparse": (6, 3, 0, 0, 0, 0, 1),
    "capacity": (2, 1, 2, 3, 3, 0, 0),
    "overflow": (1, 1, 0, 1, 3, 2, 1),
    "full": (0, 0, 0, 0, 0, 1, 0),
    "mixed": (1, 1, 1, 1, 1, 1, 1),
}


class Case(NamedTuple):
    """A dense float64 test matrix with the tile width and slot count to pack it with."""

    dense: np.ndarray
    tile_width: int
    slots: int
    label: str = ""

    def __repr__(self):
        m, k = self.dense.shape
        r, c = np.nonzero(self.dense)
        entries = ", ".join(f"({i}, {j}): {self.dense[i, j]!r}"
                            for i, j in zip(r[:60].tolist(), c[:60].tolist(), strict=True))
        more = f", ... {r.size - 60} more" if r.size > 60 else ""
        return (f"Case({self.label or 'drawn'}: shape=({m}, {k}), tile_width={self.tile_width}, "
                f"slots={self.slots}, nnz={r.size}, entries={{{entries}{more}}})")


def _values(rng, n, kind, special_rate):
    """``n`` non-zero float64 values of one ``kind``: "finite", "dyadic" or "any"."""
    if kind == "dyadic":  # sums of these are exact in every order
        return rng.integers(1, 9, n) * rng.choice([-1.0, 1.0], n) / 4
    mag = np.where(rng.random(n) < 0.3, rng.integers(1, 4, n), rng.uniform(0.25, 4.0, n))
    out = mag * rng.choice([-1.0, 1.0], n)
    if kind == "any" and special_rate:
        special = rng.random(n) < special_rate
        out[special] = rng.choice(SPECIAL_VALUES, int(special.sum()))
    return out


def dense_from_counts(rng, counts, shape, tile_width, values="finite", special_rate=0.0):
    """A dense matrix whose (row, tile) pairs hold exactly ``counts`` non-zeros."""
    m, k = shape
    t = tile_width
    nt = -(-k // t)
    keys = rng.random((m, nt, t))
    pad = nt * t - k
    if pad:
        keys[:, -1, t - pad:] = 2.0  # columns past K rank last and are never chosen
    ranks = keys.argsort(axis=2).argsort(axis=2)
    mask = (ranks < counts[..., None]).reshape(m, nt * t)[:, :k]
    dense = np.zeros((m, k))
    dense[mask] = _values(rng, int(mask.sum()), values, special_rate)
    return dense


def _tile_extents(k, t):
    nt = -(-k // t)
    return np.minimum(t, k - np.arange(nt) * t)


# Overflowing profiles drawn more often than the others.
PROFILE_DRAWS = ("mixed", "overflow", "capacity", "sparse", "empty", "full", "overflow",
                 "capacity", "mixed")


def _rarely_zero(strategy, allow_zero):
    """``strategy``, or 0 one time in ten (degenerate shapes are edge cases, not the norm)."""
    if not allow_zero:
        return strategy
    return st.sampled_from(range(10)).flatmap(lambda r: st.just(0) if r == 0 else strategy)


def row_counts(max_rows=MAX_ROWS, min_rows=0):
    """Row counts: 0 about one time in ten, small ones often."""
    lo = max(min_rows, 1)
    return _rarely_zero(st.one_of(st.integers(lo, max(lo, 3)), st.integers(lo, max_rows)),
                        min_rows == 0)


def column_counts(tile_width, max_cols=MAX_COLS, min_cols=0):
    """Column counts around multiples of the tile width (K == T, T + 1, ...) or any in range;
    0 about one time in ten."""
    t = tile_width
    lo = max(min_cols, 1)
    near = [k for k in (1, t - 1, t, t + 1, 2 * t, 2 * t + 1, 3 * t - 1) if lo <= k <= max_cols]
    return _rarely_zero(st.one_of(st.sampled_from(near), st.integers(lo, max_cols)),
                        min_cols == 0)


def slot_counts(tile_width):
    """Slot counts in [1, tile_width], biased toward 1, 2, T/2, T - 1 and T (small ones most:
    they overflow)."""
    t = tile_width
    return st.one_of(st.sampled_from([1, 1, min(2, t), max(t // 2, 1), max(t - 1, 1), t]),
                     st.integers(1, t))


@st.composite
def cases(draw, tile_widths=TILE_WIDTHS, values="any", max_rows=MAX_ROWS, max_cols=MAX_COLS,
          min_rows=0, min_cols=0):
    """A :class:`Case`: shape, tile width, slots and per-tile counts chosen to hit the edges.

    ``values``: "finite" (moderate magnitudes, both signs), "dyadic" (k/4) or
    "any" (finite plus, in some examples, NaN, Inf, subnormals and values
    that a narrow cast turns into zero or Inf).
    """
    t = draw(st.sampled_from(tile_widths))
    k = draw(column_counts(t, max_cols, min_cols))
    m = draw(row_counts(max_rows, min_rows))
    # A tile wider than any drawn matrix takes slots up to the widest row, not the tile width
    # (the storage grows with the slots: 65537 of them would be megabytes a row).
    slots = draw(slot_counts(t if t <= 256 else max_cols))
    profile = draw(st.sampled_from(PROFILE_DRAWS))
    heavy = draw(st.integers(0, min(2, m)))
    special_rate = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])) if values == "any" else 0.0
    seed = draw(st.integers(0, 2**32 - 1))

    rng = np.random.default_rng(seed)
    extent = _tile_extents(k, t)
    nt = extent.size
    choices = np.stack(np.broadcast_arrays(
        0, 1, slots - 1, slots, slots + 1, extent, rng.integers(0, extent + 1, (m, nt))), -1)
    weights = np.asarray(COUNT_PROFILES[profile], dtype=float)
    pick = rng.choice(choices.shape[-1], size=(m, nt), p=weights / weights.sum())
    counts = np.take_along_axis(choices, pick[..., None], -1)[..., 0]
    counts = np.clip(counts, 0, extent)
    if heavy:
        counts[rng.choice(m, heavy, replace=False)] = extent
    dense = dense_from_counts(rng, counts, (m, k), t, values, special_rate)
    return Case(dense, t, slots, f"{profile}, {heavy} heavy rows")


def dense_matrices(**kwargs):
    """Just the dense float64 matrix of :func:`cases`."""
    return cases(**kwargs).map(lambda c: c.dense)


class RHS(NamedTuple):
    """A right-hand side: ``n`` columns (``None`` for a vector) from a seed."""

    n: object
    seed: int

    def make(self, k, dtype=np.float64, low=-4.0, high=4.0):
        rng = np.random.default_rng(self.seed)
        shape = (k,) if self.n is None else (k, self.n)
        return rng.uniform(low, high, shape).astype(dtype)


def rhs():
    """Right-hand-side widths around the 16-byte vector widths of the kernels."""
    return st.builds(RHS, st.sampled_from([None, 1, 2, 3, 4, 7, 8, 16, 33, 64]),
                     st.integers(0, 2**32 - 1))


class COOCase(NamedTuple):
    """COO triplets with duplicates and explicit zeros, and the dense matrix they sum to."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple
    tile_width: int
    slots: int

    def dense(self):
        out = np.zeros(self.shape)
        np.add.at(out, (self.rows, self.cols), self.vals)
        return out


@st.composite
def coo_cases(draw, tile_widths=TILE_WIDTHS, max_rows=20, max_cols=300, specials=True):
    """COO input as users build it: repeats (summed), explicit zeros, cancelling pairs.

    Values are multiples of 1/4 (plus NaN/Inf when ``specials``): their sums
    are exact in any order, so any canonical form is exactly comparable.
    """
    t = draw(st.sampled_from(tile_widths))
    k = draw(column_counts(t, max_cols))
    m = draw(row_counts(max_rows))
    slots = draw(slot_counts(t if t <= 256 else max_cols))  # as in cases()
    n = draw(st.sampled_from([0, 1, 5, 50, 400])) if m * k else 0
    dup_rate = draw(st.sampled_from([0.0, 0.3, 0.9]))
    zero_rate = draw(st.sampled_from([0.0, 0.2, 1.0]))
    special_rate = draw(st.sampled_from([0.0, 0.05])) if specials else 0.0
    seed = draw(st.integers(0, 2**32 - 1))

    rng = np.random.default_rng(seed)
    rows = rng.integers(0, max(m, 1), n)
    cols = rng.integers(0, max(k, 1), n)
    dup = rng.random(n) < dup_rate
    if n:
        src = rng.integers(0, n, n)
        rows[dup], cols[dup] = rows[src[dup]], cols[src[dup]]
    vals = _values(rng, n, "dyadic", 0.0)
    vals[rng.random(n) < zero_rate] = 0.0
    if special_rate:
        sp_mask = rng.random(n) < special_rate
        vals[sp_mask] = rng.choice([np.nan, np.inf, -np.inf], int(sp_mask.sum()))
    if n >= 2 and draw(st.booleans()):  # a pair that cancels to an explicit zero
        rows = np.append(rows, [rows[0], rows[0]])
        cols = np.append(cols, [cols[0], cols[0]])
        vals = np.append(vals, [1.25, -1.25])
        vals[0] = 0.0 if np.isnan(vals[0]) or np.isinf(vals[0]) else vals[0]
    order = rng.permutation(rows.size)
    return COOCase(rows[order], cols[order], vals[order], (m, k), t, slots)


@st.composite
def csr_cases(draw, **kwargs):
    """A non-canonical scipy ``csr_array`` (explicit zeros, duplicates, unsorted indices),
    its tile width and slots."""
    c = draw(coo_cases(**kwargs))
    m, k = c.shape
    order = np.argsort(c.rows, kind="stable")  # grouped by row, columns left unsorted
    rows, cols, vals = c.rows[order], c.cols[order], c.vals[order]
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    import scipy.sparse as sp

    csr = sp.csr_array((vals, cols.astype(np.int32), indptr), shape=(m, k))
    return csr, c.tile_width, c.slots


def histograms():
    """Histograms of per-tile counts (``hist[c]`` pairs hold ``c`` non-zeros) for auto_slots."""
    return st.lists(st.one_of(st.just(0), st.integers(0, 5), st.integers(0, 10_000)),
                    min_size=1, max_size=40)


# -- known edge cases ---------------------------------------------------------

def _row(k, cols, value=1.5):
    x = np.zeros((1, k))
    x[0, list(cols)] = value
    return x


def _edge_cases():
    two_rows_k_eq_t = np.zeros((2, 256))
    # A full row of 256 non-zeros: 255 of them overflow with slots=1.
    two_rows_k_eq_t[0] = np.linspace(0.25, 4, 256) * np.resize([1.0, -1.0], 256)
    two_rows_k_eq_t[1, 255] = -2.0
    k_t_plus_one = np.zeros((3, 257))
    k_t_plus_one[0, [0, 255, 256]] = [1.0, 2.0, 3.0]  # column 256 is alone in a 1-wide tile
    k_t_plus_one[2, 256] = -4.0
    specials = np.array([[np.nan, 0.0, np.inf, -np.inf],
                         [0.0, 1e-8, 1e-46, 65520.0],
                         [-0.0, 0.0, 5e-324, 1e300]])
    cases_ = [
        Case(np.zeros((0, 0)), 256, 1, "empty 0x0"),
        Case(np.zeros((0, 5)), 2, 1, "no rows"),
        Case(np.zeros((3, 0)), 8, 2, "no columns"),
        Case(np.array([[2.5]]), 1, 1, "1x1"),
        Case(np.zeros((4, 10)), 3, 2, "all zero"),
        Case(_row(8, [0, 4, 7]), 8, 3, "tile exactly at capacity, K == T"),
        Case(_row(9, [0, 2, 4, 7, 8]), 8, 3, "capacity + 1, K == T + 1"),
        Case(two_rows_k_eq_t, 256, 1, "K == T == 256, a full row"),
        Case(k_t_plus_one, 256, 2, "K == T + 1 == 257"),
        Case(np.ones((3, 7)), 3, 3, "all full, partial last tile"),
        Case(specials, 2, 1, "NaN, Inf, subnormal, cast-to-zero values"),
    ]
    return {c.label: c for c in cases_}


EDGE_CASES = _edge_cases()


def _finite(c):
    return bool(np.isfinite(c.dense).all()) and not (
        (np.abs(c.dense) > 0) & (np.abs(c.dense) < 1e-5)).any()


def edge_examples(argname="case", finite=False, min_rows=0, max_cols=MAX_COLS, dyadic=False,
                  **other_args):
    """Add every applicable :data:`EDGE_CASES` entry as an ``@example``.

    ``finite``: only cases without NaN/Inf or tiny values; ``dyadic``: only
    cases whose values are multiples of 1/4 (exact sums). ``other_args``:
    fixed values for the test's other ``@given`` arguments.
    """
    def applicable(c):
        if finite and not _finite(c):
            return False
        if dyadic and not np.array_equal(c.dense * 4, np.round(c.dense * 4)):
            return False
        return c.dense.shape[0] >= min_rows and c.dense.shape[1] <= max_cols

    def decorate(test):
        for c in EDGE_CASES.values():
            if applicable(c):
                test = example(**{argname: c}, **other_args)(test)
        return test

    return decorate


# -- Matrix Market text, well formed and broken ---------------------------------

#: Numbers as Matrix Market writers spell them (real field).
MTX_REALS = ("1.5", "-2", "0.25", "3e-2", "-1E+3", "1.", ".5", "-.5", "nan", "-inf", "Infinity",
             "1e400", "5e-324", "0")

#: What a broken file may hold where a number belongs, or between lines.
MTX_JUNK = (b"\x00", b"\xff", b"\x01", b"abc", b"0x10", b"1e", b"1.5.3", b"--1", b"+", b".",
            b"1e5e", b"%", b"%%MatrixMarket matrix coordinate real general", b"\r", b"\t\t",
            b"\n", b"\n\n", b"1 1 1", b"99999999999999999999", b"-1", b"nan5", b"infinit",
            b"e5", b"1_000", b"\xef\xbb\xbf", b" " * 3, b"+4")

#: Size lines of a broken header: declared sizes past every limit, missing or extra numbers.
MTX_SIZE_LINES = (b"0 0 0", b"2147483648 2 1", b"2 2147483648 1", b"3 3 1000000000000",
                  b"3 3 -1", b"3 3", b"3 3 1 1", b"3.0 3 1", b"99999999999999999999 1 1",
                  b"0 5", b"5 0", b"", b"x y z", b"2 2 0")


class MtxCase(NamedTuple):
    """A Matrix Market file's bytes and how it was made (``broken``: bytes changed after
    a well-formed file was written)."""

    text: bytes
    broken: bool
    label: str


@st.composite
def matrix_market_files(draw, max_size=6):
    """Matrix Market files: well formed (coordinate or array; real, integer or pattern;
    general, symmetric or skew-symmetric; comments, blank lines, tabs, CRLF line ends, a
    last line without its line end, duplicates), then, in most examples, broken a few
    times: a byte replaced, a span deleted, junk inserted, the file cut short, the size line
    or the banner replaced.
    """
    fmt = draw(st.sampled_from(["coordinate", "array"]))
    field = draw(st.sampled_from(["real", "integer", "pattern"] if fmt == "coordinate"
                                 else ["real", "integer"]))
    symmetry = draw(st.sampled_from(["general", "symmetric"] if field == "pattern"
                                    else ["general", "symmetric", "skew-symmetric"]))
    m = draw(st.integers(0, max_size))
    k = m if symmetry != "general" else draw(st.integers(0, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def number():
        if field == "integer":
            return str(int(rng.integers(-9, 10)))
        return str(rng.choice(MTX_REALS))

    if fmt == "coordinate":
        if symmetry == "general":
            pairs = [(i, j) for i in range(m) for j in range(k)]
        else:
            pairs = [(i, j) for i in range(m) for j in range(i + (symmetry != "symmetric"))]
        n = int(rng.integers(0, len(pairs) + 1)) if pairs else 0
        chosen = [pairs[p] for p in rng.choice(len(pairs), n)] if n else []  # repeats: summed
        lines = [f"{i + 1} {j + 1}" + ("" if field == "pattern" else f" {number()}")
                 for i, j in chosen]
        size = f"{m} {k} {len(lines)}"
    else:
        if symmetry == "general":
            count = m * k
        else:
            count = m * (m + 1) // 2 if symmetry == "symmetric" else m * (m - 1) // 2
        lines = [number() for _ in range(count)]
        size = f"{m} {k}"
    sep = str(rng.choice([" ", "  ", "\t"]))
    lines = [line.replace(" ", sep) for line in lines]
    head = [f"%%MatrixMarket matrix {fmt} {field} {symmetry}"]
    head += ["% a comment: é, %, 1 2 3"] * int(rng.integers(0, 3))
    body = [size] + lines + [""] * int(rng.integers(0, 2))
    end = str(rng.choice(["\n", "\r\n"]))
    text = (end.join(head + body) + (end if rng.random() < 0.8 else "")).encode()

    labels = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        how = draw(st.sampled_from(["byte", "delete", "insert", "cut", "size", "banner"]))
        at = draw(st.integers(0, max(len(text) - 1, 0)))
        if how == "byte" and text:
            value = draw(st.sampled_from([0, 1, 0xFF, ord("x"), ord("."), ord("e"), ord("-"),
                                          ord(" "), ord("\n"), ord("9"), ord("%")]))
            text = text[:at] + bytes([value]) + text[at + 1:]
        elif how == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif how == "insert":
            text = text[:at] + draw(st.sampled_from(MTX_JUNK)) + text[at:]
        elif how == "cut":
            text = text[:at]
        elif how == "size":
            lines_ = text.split(b"\n")
            where = next((i for i, s in enumerate(lines_) if i and not s.startswith(b"%")), 1)
            lines_[min(where, len(lines_) - 1)] = draw(st.sampled_from(MTX_SIZE_LINES))
            text = b"\n".join(lines_)
        else:
            words = draw(st.sampled_from([b"vector coordinate real general",
                                          b"matrix coordinate complex general",
                                          b"matrix coordinate real hermitian",
                                          b"matrix array pattern general", b"matrix coordinate",
                                          b"matrix sparse real general", b"MATRIX ARRAY REAL "
                                          b"GENERAL extra"]))
            text = b"%%MatrixMarket " + words + text[text.find(b"\n"):] if b"\n" in text \
                else text
        labels.append(how)
    return MtxCase(text, bool(labels), f"{fmt} {field} {symmetry}, {m}x{k}"
                   + (f", broken: {', '.join(labels)}" if labels else ""))


# -- twell files whose members claim other sizes ---------------------------------

#: The storage arrays of a twell file, by class.
TWELL_MEMBERS = ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                 "overflow_data")
ELL_MEMBERS = ("data", "indices")


class MemberClaim(NamedTuple):
    """A rewrite of one member of a twell file: its .npy header claims ``shape`` (computed
    from the true one by ``how``), followed by ``payload`` bytes of zeros (None: exactly
    what the header describes)."""

    member: str
    how: str
    factor: int
    payload: object


#: How a member's claimed shape is made from its true shape.
CLAIMS = ("first dimension times factor", "last dimension times factor", "an extra dimension",
          "no dimensions", "a zero dimension", "the true shape")


def member_claims(members=TWELL_MEMBERS):
    """What one member of a twell file claims: another shape (up to 2**40 times the true
    size), then as many bytes as it describes (a small claim), a few, or none."""
    return st.builds(MemberClaim, st.sampled_from(members), st.sampled_from(CLAIMS),
                     st.sampled_from([2, 3, 1000, 2**20, 2**40]),
                     st.sampled_from([None, 0, 7, 4096]))


def claimed_shape(shape, claim):
    """The shape a :class:`MemberClaim` makes of a member's ``shape``."""
    shape = tuple(shape)
    if claim.how == "first dimension times factor" and shape:
        return (max(shape[0], 1) * claim.factor,) + shape[1:]
    if claim.how == "last dimension times factor" and shape:
        return shape[:-1] + (max(shape[-1], 1) * claim.factor,)
    if claim.how == "an extra dimension":
        return shape + (claim.factor,)
    if claim.how == "no dimensions":
        return ()
    if claim.how == "a zero dimension" and shape:
        return (0,) + shape[1:]
    return shape


# -- matrices of huge dimensions and few entries -------------------------------

class WideCase(NamedTuple):
    """A matrix of few entries and up to 2**31 - 1 columns, with a tile width that keeps its
    storage small: COO triplets, shape and tile width."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    shape: tuple
    tile_width: int


@st.composite
def wide_cases(draw, max_rows=3):
    """Few entries in a matrix of 2**20 to 2**31 - 1 columns (tile widths 16384 and 65536,
    so that a row stores 32768 counts at most); columns near 0, near K - 1 or anywhere."""
    k = draw(st.sampled_from([2**20, 2**20 + 1, 2**31 - 1, 2**31 - 2]) | st.integers(2**20,
                                                                                      2**31 - 1))
    m = draw(st.integers(0, max_rows))
    t = draw(st.sampled_from([16384, 65536]))
    n = draw(st.integers(0, 6)) if m else 0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cols = np.concatenate([[0, 1, k - 2, k - 1], rng.integers(0, k, 4)])[rng.integers(0, 8, n)]
    rows = rng.integers(0, max(m, 1), n)
    return WideCase(rows, cols, _values(rng, n, "finite", 0.0), (m, k), t)


# -- byte orders -------------------------------------------------------------------

def byte_orders():
    """A byte order for ``dtype.newbyteorder``: native, little- or big-endian (one of the
    last two is not native, whatever the machine)."""
    return st.sampled_from(["=", "<", ">"])


def in_byte_order(a, order):
    """``a`` (NumPy) with the same values in byte order ``order`` (a 1-byte dtype is
    unchanged: it has no order)."""
    return a.astype(a.dtype.newbyteorder(order))
