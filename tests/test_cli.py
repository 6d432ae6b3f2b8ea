"""The ``twell`` command line, run as ``python -m twell`` in subprocesses.

Each run starts in a temporary folder with ``PYTHONSAFEPATH=1`` (the
folder is not on ``sys.path``) and ``PYTHONPATH`` set to where the twell
under test was imported from: the installed package under
``scripts/test.sh``, the checkout under a plain ``pytest``.

A run costs about a second of imports (numpy, scipy and ml_dtypes, which
alone takes half a second), so the subprocess runs are listed up front in
:data:`RUNS` and the ``runs`` fixture starts them all at once, a few per
core; each test then checks the runs it is about. They cover every command,
every conversion pair and each kind of error (exit status, one line, no
traceback). The details (every error message, every option) are checked
by calling ``twell._cli.main`` in this process, which is what ``python -m
twell`` runs.
"""

import concurrent.futures
import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import twell
from twell import _cli

# -- the matrix and the input files ---------------------------------------------

#: Inputs of the conversions: name -> format.
INPUTS = {"in.mtx": "mtx", "in.npz": "npz", "in.npy": "npy", "in.twell": "twell"}

#: Outputs of the conversions, by format.
OUTPUTS = {"mtx": "mtx", "npz": "npz", "npy": "npy", "twell": "twell"}

#: Tile width and slots of in.twell (the conversions to twell keep them).
IN_TILE_WIDTH, IN_SLOTS = 8, 2


def matrix():
    """12 x 20 float32, values in k/4 (exact in every format), an empty row, a full row,
    overflow at tile width 8 with 2 slots."""
    rng = np.random.default_rng(5)
    x = np.where(rng.random((12, 20)) < 0.3, rng.integers(-8, 9, (12, 20)) / 4, 0.0)
    x[3] = 0.0
    x[5, :8] = np.arange(1, 9) / 4  # a full tile of 8: 6 entries overflow with 2 slots
    x[7] = np.arange(20) % 8 / 4 + 0.25  # 20 non-zeros: the info histogram groups counts
    return x.astype(np.float32)


def make_inputs(folder):
    x = matrix()
    a = twell.TwELLMatrix(x, tile_width=IN_TILE_WIDTH, slots=IN_SLOTS)
    scipy.io.mmwrite(folder / "in.mtx", sp.csr_array(x))
    sp.save_npz(folder / "in.npz", sp.csr_array(x))
    np.save(folder / "in.npy", x)
    twell.save(folder / "in.twell", a)
    # The content, not the name, tells twell's .npz files from scipy's.
    twell.save(folder / "twell-content.npz", a)
    with open(folder / "scipy-content.twell", "wb") as f:  # save_npz would append ".npz"
        sp.save_npz(f, sp.csr_array(x), compressed=False)
    twell.save(folder / "ell.twell", twell.ELLMatrix(x))
    twell.save(folder / "bf16.twell", a.astype(twell.bfloat16))
    np.save(folder / "empty.npy", np.zeros((0, 5), dtype=np.float32))
    np.save(folder / "vector.npy", np.ones(3))
    np.save(folder / "complex.npy", np.ones((2, 2), dtype=complex))
    np.save(folder / "bf16-raw.npy", np.ones((2, 2), dtype=twell.bfloat16))
    (folder / "garbage.mtx").write_text("not a matrix\n")
    (folder / "garbage.twell").write_bytes(b"PK\x03\x04 truncated")
    (folder / "complex.mtx").write_text(
        "%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1.0 2.0\n")
    for name, text in MALFORMED_MTX.items():
        (folder / name).write_bytes(text)
    # Bytes that are no text at all, NUL included, read with --from mtx.
    (folder / "binary.dat").write_bytes(bytes(np.random.default_rng(3).integers(0, 256, 300,
                                                                                 np.uint8)))
    (folder / "no-rows.mtx").write_text("%%MatrixMarket matrix array real general\n0 5\n")
    np.savez(folder / "arrays.npz", x=x)
    sp.save_npz(folder / "complex.npz", sp.csr_array(np.eye(2, dtype=complex)))
    sp.save_npz(folder / "wide.npz", sp.csr_array((2, 2**31)))
    sp.save_npz(folder / "square.npz", sp.csr_array((2**20, 2**20)))
    np.save(folder / "text.npy", np.array([["a", "b"], ["c", "d"]]))
    np.save(folder / "objects.npy", np.array([[{"a": 1}, None]], dtype=object),
            allow_pickle=True)
    full = (folder / "in.npy").read_bytes()
    (folder / "truncated.npy").write_bytes(full[:-7])
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (2**20, 2**20)})
    (folder / "claims.npy").write_bytes(header.getvalue() + bytes(64))  # 8 TiB, it says
    f = folder / "tampered.twell"
    twell.save(f, a)
    with np.load(f) as z:
        fields = dict(z)
    fields["counts"] = fields["counts"] + 5
    with open(f, "wb") as out:
        np.savez(out, **fields)
    (folder / "in.txt").write_bytes((folder / "in.mtx").read_bytes())
    (folder / "folder.twell").mkdir()


#: Matrix Market files that scipy.io.mmread (scipy 1.17) aborted, crashed or misread on, or
#: that describe more than twell holds: name -> content.
MALFORMED_MTX = {
    # Handed to scipy as an open file object, this ended the process (C++ terminate, exit 134).
    "bad.mtx": b"x\nyy\nzz\n",
    # A NUL byte after a value: scipy's parser crashes (SIGSEGV) whatever it is handed.
    "nul.mtx": b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1.5\x00\n",
    # A dense array of zero rows with a value: scipy divides by zero (SIGFPE).
    "zero-rows-array.mtx": b"%%MatrixMarket matrix array real general\n0 5\n1\n",
    "hermitian.mtx": b"%%MatrixMarket matrix coordinate complex hermitian\n2 2 1\n2 1 1.0 2.0\n",
    "wide.mtx": b"%%MatrixMarket matrix coordinate real general\n2 2147483648 1\n1 1 1.5\n",
    # scipy allocates what the size line declares before reading a line (3.6 TiB here).
    "many-entries.mtx": b"%%MatrixMarket matrix coordinate real general\n3 3 1000000000000\n"
                        b"1 1 1.5\n",
    # scipy reads these as 1.5 and 0.0 without a word.
    "junk-value.mtx": b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1.5abc\n",
    "hex-value.mtx": b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 0x10\n",
}


# -- the runs -------------------------------------------------------------------


class Run(NamedTuple):
    args: tuple
    rc: int
    out: str
    err: str
    how: str  # "subprocess" or "in-process"


def _conversions():
    runs = {}
    for src, fmt_in in INPUTS.items():
        for fmt_out, ext in OUTPUTS.items():
            runs[f"convert {fmt_in} {fmt_out}"] = ("convert", src, f"{fmt_in}-to-{fmt_out}.{ext}")
    return runs


#: id -> (arguments, exit status, regular expression the one stderr line must match).
ERRORS = {
    "missing file": (("info", "nope.mtx"), 1, r"twell info: error: nope.mtx: no such file"),
    "missing input": (("convert", "nope.npz", "x.twell"), 1, "nope.npz: no such file"),
    "unknown input format": (("info", "in.txt"), 1,
                             "in.txt: cannot tell the file format .* --from mtx|npz"),
    "unknown output format": (("convert", "in.mtx", "out.csv"), 1,
                              "out.csv: cannot tell the file format .* --to mtx|npz"),
    "unknown --from": (("info", "in.mtx", "--from", "csv"), 2,
                       "argument --from: invalid choice: 'csv'"),
    "bad tile width": (("info", "in.mtx", "--tile-width", "0"), 2,
                       "--tile-width: must be between 1 and 2147483647; got 0"),
    "bad slots": (("info", "in.mtx", "--slots", "many"), 2,
                  '--slots: must be an int; got .many. .or "auto"'),
    # A slot count above the tile width is a usage error (exit 2), wherever the width
    # comes from: the option or a twell file's own. (The default, "auto", takes tiles at
    # least as wide as the slots given.)
    "slots above tile width": (("info", "in.mtx", "--tile-width", "4", "--slots", "5"), 2,
                               r"twell info: error: argument --slots: must be at most the tile "
                               r"width 4; got 5 \(see 'twell info --help'\)$"),
    "slots above a twell file's tile width": (
        ("convert", "in.twell", "slots.twell", "--slots", "9"), 2,
        r"argument --slots: must be at most the tile width 8 \(in.twell's\); got 9"),
    "slots past every tile width": (("info", "in.mtx", "--slots", "2147483648"), 2,
                                    "argument --slots: must be between 1 and 2147483647; got "
                                    "2147483648"),
    "output is a folder": (("convert", "in.npy", "folder.twell"), 1,
                           "twell convert: error: folder.twell: cannot write the file: Is a "
                           "directory$"),
    "bad dtype": (("convert", "in.mtx", "x.twell", "--dtype", "int8"), 2,
                  "--dtype: invalid choice: 'int8'"),
    "layout options for a non-twell output": (
        ("convert", "in.mtx", "x.npy", "--slots", "3"), 2,
        "--tile-width and --slots apply to twell output only"),
    "unknown option": (("info", "in.mtx", "--colour"), 2, "unrecognized arguments: --colour"),
    "no command": ((), 2, "the following arguments are required: COMMAND"),
    # The benchmark suite lives in a source checkout (benchmarks/bench.py), not in the package.
    "bench is not a command": (("bench",), 2, "invalid choice: 'bench'"),
    "show without -o": (("show", "in.mtx"), 2, "the following arguments are required: -o"),
    "bad Matrix Market": (("info", "garbage.mtx"), 1,
                          "garbage.mtx: not a valid Matrix Market file"),
    "malformed Matrix Market": (("info", "bad.mtx"), 1,
                                "bad.mtx: not a valid Matrix Market file: line 1 does not start "
                                "with the banner '%%MatrixMarket'"),
    "convert malformed Matrix Market": (("convert", "bad.mtx", "bad.twell"), 1,
                                        "bad.mtx: not a valid Matrix Market file: line 1"),
    "binary file read as Matrix Market": (("info", "binary.dat", "--from", "mtx"), 1,
                                          "binary.dat: not a valid Matrix Market file"),
    "NUL in Matrix Market": (("info", "nul.mtx"), 1,
                             r"nul.mtx: not a valid Matrix Market file: line 3: the byte 0x00 "),
    "values in an array of zero rows": (
        ("info", "zero-rows-array.mtx"), 1,
        "zero-rows-array.mtx: not a valid Matrix Market file: the size line declares 0 values "
        "and line 3 holds one"),
    "complex Matrix Market": (("convert", "complex.mtx", "complex.twell"), 1,
                              "complex.mtx: the values are complex numbers .Matrix Market field "
                              "'complex'.; twell holds real numbers"),
    "Hermitian Matrix Market": (("info", "hermitian.mtx"), 1,
                                "hermitian.mtx: the values are complex numbers"),
    "Matrix Market too wide": (("info", "wide.mtx"), 1,
                               "wide.mtx: the matrix has 2147483648 columns; twell holds at most "
                               "2147483647"),
    "Matrix Market entries missing": (
        ("info", "many-entries.mtx"), 1,
        "many-entries.mtx: not a valid Matrix Market file: the size line declares "
        "1000000000000 entries and the file holds 1"),
    "junk after a Matrix Market value": (
        ("info", "junk-value.mtx"), 1,
        r"junk-value.mtx: not a valid Matrix Market file: line 3: the byte 'b' \(0x62\) "),
    "hexadecimal Matrix Market value": (
        ("info", "hex-value.mtx"), 1,
        r"hex-value.mtx: not a valid Matrix Market file: line 3: the byte 'x' \(0x78\) "),
    "truncated twell file": (("info", "garbage.twell"), 1,
                             r"garbage.twell: not a twell file: not a zip \(.npz\) archive"),
    "tampered twell file": (("convert", "tampered.twell", "x.mtx"), 1,
                            "tampered.twell: invalid twell file: counts must be between 0 and"),
    "npz of other arrays": (("info", "arrays.npz"), 1,
                            "arrays.npz: neither a twell file .* nor a scipy.sparse .npz"),
    "twell file read as scipy": (("info", "in.twell", "--from", "npz"), 1,
                                 "in.twell: is a twell file, not a scipy.sparse .npz file"),
    "scipy file read as twell": (("info", "in.npz", "--from", "twell"), 1,
                                 "in.npz: not a twell file: .* scipy.sparse.load_npz"),
    "1-D npy": (("info", "vector.npy"), 1, r"vector.npy: the array must be 2-D .*shape \(3,\)"),
    "complex npy": (("info", "complex.npy"), 1,
                    r"complex.npy: the values are complex numbers \(dtype complex128\); twell "
                    "holds real numbers: float64, float32, float16 or bfloat16"),
    "bfloat16 npy": (("info", "bf16-raw.npy"), 1,
                     r"bf16-raw.npy: the values are raw 2-byte records \(dtype \|V2\)"),
    "text npy": (("info", "text.npy"), 1, r"text.npy: the values are text \(dtype <U1\)"),
    # numpy's own message suggested loading the file "unsafely using allow_pickle=".
    "text read as npy": (("info", "in.mtx", "--from", "npy"), 1,
                         r"in.mtx: not a .npy file: it does not start with NumPy's magic "
                         r"string \\x93NUMPY$"),
    "objects in npy": (("info", "objects.npy"), 1,
                       r"objects.npy: the values are Python objects \(dtype object\); twell "
                       "holds real numbers"),
    "truncated npy": (("info", "truncated.npy"), 1,
                      r"truncated.npy: the file is truncated: its header describes 960 bytes "
                      "of values and 953 follow it$"),
    "npy claiming a huge array": (("info", "claims.npy"), 1,
                                  r"claims.npy: the file is truncated: its header describes "
                                  "8796093022208 bytes of values and 64 follow it$"),
    "complex npz": (("convert", "complex.npz", "complex-npz.twell"), 1,
                    r"complex.npz: the values are complex numbers \(dtype complex128\)"),
    "npz too wide": (("info", "wide.npz"), 1,
                     "wide.npz: the matrix has 2147483648 columns; twell holds at most "
                     "2147483647"),
    "too many stored slots": (
        ("info", "square.npz", "--tile-width", "1"), 1,
        r"square.npz: a 1048576 x 1048576 matrix at tile width 1 takes 1048576 \* 1048576 "
        r"\* 1 = 1099511627776 stored slots; twell holds at most 17179869176: choose a wider "
        "--tile-width$"),
    "a folder": (("info", "."), 1, r"\.: is a directory"),
    "output folder missing": (("convert", "in.mtx", "nowhere/x.twell"), 1,
                              "nowhere/x.twell: the folder 'nowhere' does not exist"),
    "empty picture": (("show", "empty.npy", "-o", "empty.png"), 1,
                      "empty.npy: the matrix is 0 x 5: nothing to draw"),
    "picture format": (("show", "in.mtx", "-o", "x.xyz"), 1,
                       r"x.xyz: the picture format comes from the extension, one of .*\.png"),
}


#: Every command this module runs: id -> arguments of ``python -m twell``. Those in
#: :data:`SUBPROCESS` run as ``python -m twell``, the others through ``twell._cli.main``.
RUNS = {
    **_conversions(),
    "convert options": ("convert", "in.npy", "options.twell", "--tile-width", "4", "--slots",
                        "1", "--dtype", "float16"),
    "convert to .twell.npz": ("convert", "in.mtx", "out.twell.npz", "--dtype", "float32"),
    "convert twell-content .npz": ("convert", "twell-content.npz", "from-twell-content.npy"),
    "convert scipy-content .twell": ("convert", "scipy-content.twell", "from-scipy-content.npy"),
    "convert --from --to": ("convert", "in.txt", "forced.dat", "--from", "mtx", "--to", "twell"),
    "convert ell": ("convert", "ell.twell", "from-ell.mtx"),
    "convert bf16 to npy": ("convert", "bf16.twell", "bf16.npy"),
    "convert bf16 to mtx": ("convert", "bf16.twell", "bf16.mtx"),
    "convert to bf16": ("convert", "in.npz", "to-bf16.twell", "--dtype", "bfloat16"),
    "convert empty": ("convert", "empty.npy", "empty.mtx"),
    "convert empty back": ("convert", "empty.npy", "empty.twell"),
    "info mtx": ("info", "in.mtx"),
    "info twell": ("info", "in.twell"),
    "info twell auto": ("info", "in.twell", "--slots", "auto"),
    "info options": ("info", "in.npz", "--tile-width", "8", "--slots", "1"),
    "info empty": ("info", "empty.npy"),
    "info no-rows Matrix Market": ("info", "no-rows.mtx"),
    "show": ("show", "in.mtx", "-o", "layout.png", "--tile-width", "8", "--slots", "2"),
    "show rows": ("show", "in.twell", "-o", "layout.svg", "--rows", "3"),
    "help": ("--help",),
    "version": ("--version",),
    **{f"help {c}": (c, "--help") for c in ("info", "convert", "show")},
    **{f"error {k}": args for k, (args, _, _) in ERRORS.items()},
}

#: The runs made in subprocesses: every conversion pair, every command, each kind of error.
SUBPROCESS = {
    *_conversions(), "info mtx", "show", "show rows", "help", "version", "error missing file",
    "error bad tile width", "error tampered twell file",
    # scipy's Matrix Market parser ended the process on these (abort, SIGSEGV, SIGFPE): in a
    # subprocess, a regression fails its test instead of ending the test run.
    "error malformed Matrix Market", "error convert malformed Matrix Market",
    "error binary file read as Matrix Market", "error NUL in Matrix Market",
    "error values in an array of zero rows", "info no-rows Matrix Market",
    "error Hermitian Matrix Market", "error Matrix Market too wide",
    "error Matrix Market entries missing", "error junk after a Matrix Market value",
    "error hexadecimal Matrix Market value",
}


def _run_one(args, cwd, env):
    p = subprocess.run([sys.executable, "-m", "twell", *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    return Run(tuple(args), p.returncode, p.stdout, p.stderr, "subprocess")


def _run_here(args, cwd):
    """``twell._cli.main(args)`` in ``cwd``, its stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = _cli.main(list(args))
    finally:
        os.chdir(here)
    return Run(tuple(args), rc, out.getvalue(), err.getvalue(), "in-process")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    make_inputs(folder)
    return folder


@pytest.fixture(scope="module")
def runs(folder):
    """All of :data:`RUNS` in ``folder``: id -> :class:`Run`.

    The subprocesses run concurrently, and the in-process runs meanwhile.
    """
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.path.dirname(
        os.path.dirname(os.path.abspath(twell.__file__))))
    env.pop("MPLBACKEND", None)  # twell show must choose a file backend itself
    workers = 2 * (os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {k: pool.submit(_run_one, args, folder, env)
                   for k, args in RUNS.items() if k in SUBPROCESS}
        done = {k: _run_here(args, folder) for k, args in RUNS.items() if k not in SUBPROCESS}
        return {**done, **{k: f.result() for k, f in futures.items()}}


def test_every_subprocess_run_is_listed():
    """Guards SUBPROCESS against typos: a misspelt id would silently run in-process."""
    assert SUBPROCESS <= set(RUNS)
    assert {RUNS[k][0] for k in SUBPROCESS} >= {"convert", "info", "show", "--help", "--version"}


def ok(runs, key):
    r = runs[key]
    assert r.rc == 0, f"twell {' '.join(r.args)}: exit {r.rc}\n{r.out}\n{r.err}"
    assert r.err == "", r.err
    return r


# -- convert --------------------------------------------------------------------


def read_back(path):
    """An output file read with the library of its format (not twell's readers, except .twell)."""
    name = str(path)
    if name.endswith(".mtx"):
        with open(path, "rb") as f:
            return scipy.io.mmread(f)
    if name.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if name.endswith((".twell", ".twell.npz", ".dat")):
        return twell.load(path)
    return sp.load_npz(path)


def dense(m):
    return m.toarray() if hasattr(m, "toarray") else np.asarray(m)


@pytest.mark.parametrize("fmt_out", list(OUTPUTS))
@pytest.mark.parametrize("src", list(INPUTS))
def test_convert_every_pair(runs, folder, src, fmt_out):
    fmt_in = INPUTS[src]
    r = ok(runs, f"convert {fmt_in} {fmt_out}")
    out = folder / r.args[2]
    assert r.out.startswith(f"{src} (") and f"-> {out.name} (" in r.out
    assert "12 x 20, float" in r.out and f"nnz {np.count_nonzero(matrix())}" in r.out
    got = read_back(out)
    assert got.shape == (12, 20)
    np.testing.assert_array_equal(dense(got), matrix())  # every value exact
    if fmt_out == "twell":
        # A twell input keeps its layout; the others get tile_width 256 and "auto" slots.
        keep = fmt_in == "twell"
        assert got.tile_width == (IN_TILE_WIDTH if keep else 256)
        assert got.dtype == (np.float64 if fmt_in == "mtx" else np.float32)
        if keep:
            over = twell.TwELLMatrix(matrix(), tile_width=IN_TILE_WIDTH, slots=IN_SLOTS)
            assert got.slots == IN_SLOTS and f"overflow {over.overflow_nnz} entries" in r.out
    else:
        # Matrix Market holds no dtype: it is read as float64; the others keep float32.
        want = np.float64 if "mtx" in (fmt_in, fmt_out) else np.float32
        assert dense(got).dtype == want


def test_convert_options(runs, folder):
    r = ok(runs, "convert options")
    a = twell.load(folder / "options.twell")
    assert (a.tile_width, a.slots, a.dtype) == (4, 1, np.float16)
    np.testing.assert_array_equal(a.toarray(), matrix())
    assert "float16, nnz" in r.out and "tile width 4, slots 1" in r.out


def test_the_content_tells_npz_files_apart(runs, folder):
    r = ok(runs, "convert twell-content .npz")
    assert "(twell file)" in r.out
    r = ok(runs, "convert scipy-content .twell")
    assert "(scipy.sparse .npz)" in r.out
    for name in ("from-twell-content.npy", "from-scipy-content.npy"):
        np.testing.assert_array_equal(np.load(folder / name), matrix())


def test_twell_npz_names_and_format_overrides(runs, folder):
    ok(runs, "convert to .twell.npz")
    assert isinstance(twell.load(folder / "out.twell.npz"), twell.TwELLMatrix)
    r = ok(runs, "convert --from --to")
    assert "in.txt (Matrix Market) -> forced.dat (twell file)" in r.out
    np.testing.assert_array_equal(twell.load(folder / "forced.dat").toarray(), matrix())


def test_convert_from_an_ell_file(runs, folder):
    ok(runs, "convert ell")
    np.testing.assert_array_equal(dense(read_back(folder / "from-ell.mtx")), matrix())


def test_bfloat16_goes_out_as_float32_exactly(runs, folder):
    bf = matrix().astype(twell.bfloat16)
    for key, name in (("convert bf16 to npy", "bf16.npy"), ("convert bf16 to mtx", "bf16.mtx")):
        r = ok(runs, key)
        assert "bfloat16 values written as float32, exactly" in r.out
        got = dense(read_back(folder / name))
        np.testing.assert_array_equal(got, bf.astype(np.float32))
    ok(runs, "convert to bf16")
    a = twell.load(folder / "to-bf16.twell")
    assert a.dtype == twell.bfloat16
    np.testing.assert_array_equal(a.toarray(), bf)


def test_convert_a_matrix_without_rows(runs, folder):
    ok(runs, "convert empty")
    assert read_back(folder / "empty.mtx").shape == (0, 5)
    ok(runs, "convert empty back")
    assert twell.load(folder / "empty.twell").shape == (0, 5)


# -- info -----------------------------------------------------------------------


def fields(text):
    """The ``name  value`` lines at the top of ``twell info``: name -> value."""
    head = text.split("\n\n")[0]
    return dict(line.split("  ", 1) for line in head.splitlines())


def test_info(runs):
    r = ok(runs, "info mtx")
    f = {k: v.strip() for k, v in fields(r.out).items()}
    x = matrix()
    nnz = np.count_nonzero(x)
    assert f["shape"] == "12 x 20" and f["dtype"] == "float64" and f["nnz"] == str(nnz)
    assert f["density"] == f"{nnz / x.size:.3%}"
    assert f["tile width"] == "256 (1 tile per row, the last 20 wide)"
    rows = np.count_nonzero(x, axis=1)
    slots = twell.auto_slots(np.bincount(rows), 256, shape=x.shape, itemsize=8)  # read as f64
    assert f["slots"] == f'{slots} ("auto")' and f["recommended slots"].startswith(str(slots))
    assert f"max {rows.max()}" in r.out and "non-zeros per (row, tile)" in r.out
    # The histogram: counts of non-zeros per (row, tile) up to 20 come in power-of-two groups
    # (split at the slot count), each with its pairs.
    hist = r.out.split("non-zeros per (row, tile)")[1].split("bytes")[0]
    assert re.search(r"^ +0 +1 +8\.3% +#+$", hist, re.M)  # the empty row
    # the full row, in the group past the slots
    assert re.search(rf"^ +{slots + 1}-20 +1 +8\.3% +#+ +overflow$", hist, re.M)
    assert sum(int(line.split()[1]) for line in hist.splitlines()[3:] if line) == 12
    assert re.search(r"^  dense \(float64\) +1\.88 KiB +100\.0% of dense$", r.out, re.M)
    for label in ("CSR (int32", "ELL (width 20", f"TwELL (slots {slots}"):
        assert label in r.out


def test_info_of_a_twell_file_keeps_its_layout(runs):
    f = fields(ok(runs, "info twell").out)
    assert "TwELLMatrix, tile width 8, slots 2" in f["file"]
    assert f["slots"].strip() == "2 (the file's)"
    over = twell.TwELLMatrix(matrix(), tile_width=IN_TILE_WIDTH, slots=IN_SLOTS).overflow_nnz
    assert f["overflow"].strip().startswith(f"{over} entries")
    # --slots auto chooses anew, at the file's tile width.
    f = fields(ok(runs, "info twell auto").out)
    auto = twell.TwELLMatrix(matrix(), tile_width=IN_TILE_WIDTH).slots
    assert auto != IN_SLOTS and f["slots"].strip() == f'{auto} ("auto")'
    assert f["tile width"].strip().startswith(f"{IN_TILE_WIDTH} ")


def test_info_options(runs):
    r = ok(runs, "info options")
    f = fields(r.out)
    assert f["tile width"].strip().startswith("8 (3 tiles per row, the last 4 wide)")
    assert f["slots"].strip() == "1 (given)"
    hist = r.out.split("non-zeros per (row, tile)")[1].split("bytes")[0]
    assert re.search(r"^ +1 +\d+ +[\d.]+% +#+$", hist, re.M)  # one line per count up to 8
    assert re.search(r"^ +8 +\d+ +[\d.]+% +#+ +overflow$", hist, re.M)


def test_info_of_a_matrix_market_array_without_rows(runs):
    # Guards: scipy's reader divides by zero on a dense array of zero rows; twell reads it.
    f = fields(ok(runs, "info no-rows Matrix Market").out)
    assert f["shape"].strip() == "0 x 5" and f["nnz"].strip() == "0"


def test_info_of_an_empty_matrix(runs):
    r = ok(runs, "info empty")
    f = fields(r.out)
    assert "no (row, tile) pairs" in r.out and f["nnz"].strip() == "0"
    assert f["occupancy"].strip() == "no slots (no rows or no columns)"


# -- show -----------------------------------------------------------------------


def _plotting():
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    try:
        __import__("twell.plot")
    except ImportError as exc:
        pytest.skip(f"twell.plot cannot be imported: {exc}")


def test_show_writes_the_picture(runs, folder):
    _plotting()
    r = ok(runs, "show")
    assert (folder / "layout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote layout.png: TwELL layout of in.mtx (12 x 20, tile width 8, slots 2)" in r.out
    r = ok(runs, "show rows")
    assert b"<svg" in (folder / "layout.svg").read_bytes()[:1000]
    assert "the first 3 of 12 rows" in r.out


# -- help and version -----------------------------------------------------------


def test_help_and_version(runs):
    top = ok(runs, "help").out
    for command in ("demo", "info", "convert", "show"):
        assert command in top
    assert "not implemented" not in top
    for command in ("info", "convert", "show"):
        assert f"usage: twell {command}" in ok(runs, f"help {command}").out
    assert ok(runs, "version").out.strip() == f"twell {twell.__version__}"


# -- errors ---------------------------------------------------------------------

@pytest.mark.parametrize("key", list(ERRORS))
def test_errors_are_one_line_and_an_exit_status(runs, key):
    if "picture" in key and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    r = runs[f"error {key}"]
    _, status, pattern = ERRORS[key]
    assert r.rc == status, f"exit {r.rc}, stderr: {r.err}"
    assert r.out == "" and "Traceback" not in r.err
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert re.search(pattern, lines[0]), lines[0]


def test_a_refused_write_names_the_output_not_the_temporary_file(folder, monkeypatch):
    # Regression: a folder without write permission gave "[Errno 13] Permission denied:
    # '.out.twell.<pid>.tmp'". (Tests may run as root, whom permissions do not stop: the
    # refusal is simulated.)
    real_open = open

    def refuse(name, *args, **kwargs):
        if str(name).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)
    r = _run_here(("convert", "in.npy", "refused.twell"), folder)
    assert r.rc == 1
    assert r.err == "twell convert: error: refused.twell: cannot write the file: Permission " \
                    "denied\n", r.err
    assert ".tmp" not in r.err


def test_a_failed_conversion_leaves_no_file(runs, folder):
    """Written under a temporary name and renamed: a failure leaves neither file behind."""
    assert runs["error complex Matrix Market"].rc == 1
    assert runs["error tampered twell file"].rc == 1
    leftovers = [p.name for p in folder.iterdir()
                 if p.name.endswith(".tmp") or p.name in ("complex.twell", "x.mtx")]
    assert leftovers == []
