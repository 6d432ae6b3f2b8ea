"""scipy.sparse's own common test-suite, run against twell's matrices.

The tests come from the installed scipy (``scipy/sparse/tests/test_base.py``), not from a copy:
its ``sparse_test_class(...)`` factory builds each class from the same mixins and flags that
scipy uses for its own formats. Two builds:

* every feature but item assignment required (``getset``, ``slicing_assign``, ``fancy_assign``
  and ``fancy_multidim_assign`` off);
* scipy's flags for its BSR format (every indexing and assignment feature optional: scipy's
  wrapper skips a test of an optional feature as "feature not implemented" when it raises);

each for TwELLMatrix in the default layout, TwELLMatrix with most entries in the overflow part
(one slot per (row, tile), tiles 16 columns wide) and ELLMatrix.

The dtypes are float32 and float64 (``math_dtypes`` and ``checked_dtypes``). Out of scope, each
skipped with its reason: tests about complex, integer or bool dtypes (those that build a
matrix of such a dtype in the tested format and check its values or dtype: twell holds real
floating-point values), tests that read scipy's private internals, and tests of item
assignment (twell's structure is immutable). A test that scipy's wrapper skips as "feature not
implemented" counts as failed here. Every remaining failure is listed with its reason as a
strict xfail (it must fail, so the list cannot go stale), and :func:`test_pass_rate` requires
at least 90% of the in-scope tests of every class to pass; the ids of its cases record the
counts.

scipy's suite gates a few tests on the format's name, for which it knows the capabilities
(``self.datsp.format in ["bsr", "csc", "csr"]`` for comparisons, ``["coo", "csr", "csc",
"lil"]`` for ``count_nonzero(axis=...)``). twell offers CSR's capabilities there, so those
tests see the matrix under the name ``"csr"`` in their checks; their bodies run against the
twell matrix.

The six classes run in a few seconds, all in the default run.
"""

import copy
import functools

import numpy as np
import pytest

import twell

scipy_tests = pytest.importorskip("scipy.sparse.tests.test_base")

DTYPES = [np.float32, np.float64]

#: scipy's flags for its BSR format: indexing and assignment optional.
BSR_FLAGS = {"getset": False, "slicing": False, "slicing_assign": False,
             "fancy_indexing": False, "fancy_assign": False, "nnz_axis": False}

#: Every feature but item assignment required.
REQUIRED_FLAGS = {"getset": False, "slicing_assign": False, "fancy_assign": False,
                  "fancy_multidim_assign": False}

#: The overflow layout: one slot per (row, tile) and tiles as wide as most test matrices, so
#: that a row's entries past its first in a tile go to the overflow part
#: (:func:`test_overflow_layout_holds_most_entries`).
OVERFLOW_LAYOUT = {"tile_width": 16, "slots": 1}

#: Minimum share of the in-scope tests of every class that must pass.
MIN_PASS_RATE = 0.9

_COMPLEX = "complex dtypes: twell holds real floating-point values"
_INTEGER = "integer dtypes: twell holds floating-point values (integer input becomes float64)"
_ASSIGN = "item assignment: twell's structure is immutable (A.tocsr() is the mutable hand-off)"

#: Tests outside the scope, by name, with the reason.
OUT_OF_SCOPE = {
    # item assignment
    **dict.fromkeys([
        "test_setelement", "test_negative_index_assignment", "test_scalar_assign_2",
        "test_index_scalar_assign", "test_setdiag", "test_setdiag_comprehensive",
        "test_slice_scalar_assign", "test_slice_assign_2", "test_self_self_assignment",
        "test_slice_assignment", "test_sparsity_modifying_assignment", "test_set_slice",
        "test_assign_empty", "test_assign_1d_slice", "test_bad_index_assign",
        "test_fancy_indexing_set", "test_fancy_assignment_dtypes", "test_sequence_assignment",
        "test_fancy_assign_empty", "test_fancy_assign_ndarray", "test_fancy_indexing_multidim_set",
        "test_fancy_assign_list", "test_fancy_assign_slice", "test_fancy_indexing_seq_assign",
        "test_fancy_indexing_2d_assign",
    ], _ASSIGN),
    # complex values
    **dict.fromkeys(["test_real", "test_imag", "test_solve", "test_elementwise_multiply"],
                    _COMPLEX),
    "test_astype": f"{_COMPLEX}; casts to every integer and complex dtype",
    "test_astype_immutable": f"{_COMPLEX}; casts to every integer and complex dtype",
    "test_from_array": f"{_COMPLEX}; int16 results",
    "test_from_matrix": f"{_COMPLEX}; int16 results",
    "test_from_list": f"{_COMPLEX}; int16 results",
    "test_from_sparse": f"{_COMPLEX}; int16 results",
    "test_pow": f"{_COMPLEX} (exponent 1+3j); integer powers (ValueError for -1 on integers)",
    "test_empty_arithmetic": f"{_COMPLEX}; int32 results",
    "test_add_sub": f"{_COMPLEX}; every integer dtype",
    "test_mu": f"{_COMPLEX}; every integer dtype",
    "test_maximum_minimum": f"{_COMPLEX} (complex128 operands, sparse and dense); int8",
    "test_elementwise_divide": f"{_COMPLEX}; integer matrices",
    "test_sparse_format_conversions": f"{_COMPLEX} (a matrix of D + 3j)",
    **dict.fromkeys(["test_lt", "test_gt", "test_le", "test_ge"],
                    f"{_COMPLEX} (compares a complex matrix built in the format)"),
    "test_getelement": f"{_COMPLEX}; every integer dtype (the type of A[i, j])",
    "test_minmax": f"{_COMPLEX}; int32/int64 matrices (the dtype of min/max)",
    "test_neg": "bool dtype: negating a bool matrix must raise; twell stores bool as float64",
    "test_numpy_sum": f"{_INTEGER}: the int64 dtype of numpy.sum of an integer matrix",
    # integer values
    **dict.fromkeys(["test_dtype_preservation", "test_dtype_preservation_empty_slice",
                     "test_dtype_preservation_empty_index"], f"{_INTEGER}; int16/int32 results"),
    "test_bool_rollover": "bool dtype: twell stores bool input as float64, which does not wrap",
    "test_dtype_check": "float16: twell holds float16, which this test requires to be refused",
    # scipy's private internals
    "test_repr": "reads scipy's private format table (scipy.sparse._base._formats)",
    "test_str": "reads scipy's private format table (scipy.sparse._base._formats)",
    "test_numpy_minmax": "asserts only for subclasses of scipy's private _data._minmax_mixin",
    # skipped by scipy itself, for every format
    "test_unary_ufunc_overrides": "scipy skips it for every format when it reaches numpy.sign "
                                  "(its later ufuncs never run); tests/test_sparse_api.py runs "
                                  "all of them",
}

#: The tests that scipy's suite gates on the format's name (see the module docstring).
FORMAT_GATED = ("test_eq", "test_ne", "test_lt", "test_gt", "test_le", "test_ge",
                "test_eq_ne_different_shapes", "test_empty", "test_count_nonzero")

_ISSPARSE = ("a TwELLMatrix or ELLMatrix is not a scipy sparse array (scipy.sparse.issparse "
              "is False; the guide says why): ")

#: In-scope tests that fail in every class, with the reason. None finds a wrong result.
FAILING = {
    "test_expm": _ISSPARSE + "scipy.sparse.linalg.expm takes scipy sparse arrays or ndarrays; "
                             "expm(A.tocsc()) works",
    "test_inv": _ISSPARSE + "scipy.sparse.linalg.inv takes scipy sparse arrays only; "
                            "inv(A.tocsc()) works",
    "test_small_multiplication": _ISSPARSE + "asserts issparse(A * array(1)), a TwELLMatrix "
                                             "(the values are right)",
    "test_minmax_axis": "reads A.data as scipy's array of stored values to choose its expected "
                        "explicit minimum; twell's data holds zero padding, so it expects the "
                        "answer for explicit zeros (the results equal csr_array's)",
    "test_str_maxprint": "counts the lines of str(A) after scipy's two-line repr; twell's repr "
                         "is one line (the listing itself is scipy's)",
}

#: TwELLMatrix keeps its arrays in tuples (the storage's Parts, the host's compressed rows).
_TWELL_DICT = {
    "test_constructor1_base": "looks for memory shared between A and TwELLMatrix(A) among the "
                              "ndarray attributes of the instances' __dict__; a TwELLMatrix "
                              "keeps its arrays in tuples (the storage, the host's compressed "
                              "rows), which that search does not open",
    "test_pickle": "compares each __dict__ entry of A and its unpickled copy, a tuple of arrays "
                   "with assert_array_equal, which cannot take the ragged tuples a TwELLMatrix "
                   "keeps (the values, shape and format it also compares round-trip)",
}

#: In-scope tests that fail, by class, with the reason.
KNOWN_FAILURES = {
    "TestTwELLRequired": {**FAILING, **_TWELL_DICT},
    "TestTwELLRequiredOverflow": {**FAILING, **_TWELL_DICT},
    "TestELLRequired": FAILING,
    "TestTwELLBSRFlags": {**FAILING, **_TWELL_DICT},
    "TestTwELLBSRFlagsOverflow": {**FAILING, **_TWELL_DICT},
    "TestELLBSRFlags": FAILING,
}


def _overflow_twell(arg, shape=None, dtype=None, copy=False, **kwargs):
    return twell.TwELLMatrix(arg, shape, dtype, copy, **OVERFLOW_LAYOUT, **kwargs)


class _SeenAs:
    """A matrix that scipy's capability checks see under another format's name."""

    def __init__(self, matrix, format):
        self.__dict__.update(_matrix=matrix, format=format)

    def __getattr__(self, name):
        return getattr(self._matrix, name)

    def __eq__(self, other):
        return self._matrix == other

    def __ne__(self, other):
        return self._matrix != other


def _seen_as_csr(test):
    @functools.wraps(test)
    def run(self):
        view = copy.copy(self)
        view.datsp = _SeenAs(self.datsp, "csr")
        return test(view)

    return run


def _not_implemented_fails(test):
    """scipy's wrapper turns errors of optional features into a skip; count it as failed."""

    @functools.wraps(test)
    def run(self):
        try:
            return test(self)
        except pytest.skip.Exception as skip:
            if "feature not implemented" not in str(skip):
                raise
            cause = skip.__context__
            pytest.fail(f"scipy's wrapper skipped this as 'feature not implemented', counted "
                        f"as failed here; the error: {type(cause).__name__}: {cause}")

    return run


def _init_class(cls):
    """scipy's ``init_class`` with the dtypes restricted to float32 and float64."""
    cls.dat = np.array([[1, 0, 0, 2], [3, 0, 1, 0], [0, 2, 0, 0]], "d")
    cls.datsp = cls.spcreator(cls.dat)
    cls.checked_dtypes = list(DTYPES)
    cls.dat_dtypes = {dtype: cls.dat.astype(dtype) for dtype in DTYPES}
    cls.datsp_dtypes = {dtype: cls.spcreator(cls.dat.astype(dtype)) for dtype in DTYPES}
    # twell follows scipy's sparse-array semantics (``*`` element-wise, 1-D reductions).
    cls.is_array_test = True


def _suite(name, flags, creator):
    """A test class built by scipy's factory, with twell's creator and the marks above."""
    base = scipy_tests.sparse_test_class(**flags)
    namespace = {"spcreator": staticmethod(creator), "math_dtypes": list(DTYPES),
                 "init_class": classmethod(_init_class)}
    known = KNOWN_FAILURES.get(name, {})
    for test_name in sorted(n for n in dir(base) if n.startswith("test_")):
        test = getattr(base, test_name)
        if test_name in OUT_OF_SCOPE:
            test = pytest.mark.skip(reason=f"out of scope: {OUT_OF_SCOPE[test_name]}")(test)
        else:
            test = _not_implemented_fails(test)
            if test_name in FORMAT_GATED:
                test = _seen_as_csr(test)
            if test_name in known:
                test = pytest.mark.xfail(strict=True, reason=known[test_name])(test)
        namespace[test_name] = test
    cls = type(name, (base,), namespace)
    cls.init_class()
    return cls


#: (class name, flags, creator)
BUILDS = [
    ("TestTwELLRequired", REQUIRED_FLAGS, twell.TwELLMatrix),
    ("TestTwELLRequiredOverflow", REQUIRED_FLAGS, _overflow_twell),
    ("TestELLRequired", REQUIRED_FLAGS, twell.ELLMatrix),
    ("TestTwELLBSRFlags", BSR_FLAGS, twell.TwELLMatrix),
    ("TestTwELLBSRFlagsOverflow", BSR_FLAGS, _overflow_twell),
    ("TestELLBSRFlags", BSR_FLAGS, twell.ELLMatrix),
]

for _name, _flags, _creator in BUILDS:
    globals()[_name] = _suite(_name, _flags, _creator)
del _name, _flags, _creator


def _counts(name):
    cls = globals()[name]
    tests = [n for n in dir(cls) if n.startswith("test_")]
    in_scope = [n for n in tests if n not in OUT_OF_SCOPE]
    failing = [n for n in in_scope if n in KNOWN_FAILURES.get(name, {})]
    return len(tests), len(in_scope), len(in_scope) - len(failing)


@pytest.mark.parametrize("name", [
    pytest.param(name, id="{}-{}-of-{}-in-scope-pass-{}-tests".format(
        name, *_counts(name)[::-1]))
    for name, *_ in BUILDS
])
def test_pass_rate(name):
    """At least 90% of the in-scope tests of every class pass (the others are strict xfails,
    so that these counts are the outcomes)."""
    total, in_scope, passing = _counts(name)
    assert passing >= MIN_PASS_RATE * in_scope, (
        f"{name}: {passing} of {in_scope} in-scope tests pass ({passing / in_scope:.0%}), "
        f"below {MIN_PASS_RATE:.0%}"
    )


def test_overflow_layout_holds_most_entries():
    """The overflow classes' layout puts most entries of scipy's test matrices in the overflow
    part (84% over every matrix the two classes build in a run, measured)."""
    matrices = [np.array([[1, 0, 0, 2], [3, 0, 1, 0], [0, 2, 0, 0]]),  # init_class's dat
                np.arange(50).reshape(5, 10), np.arange(20).reshape(5, 4),
                np.arange(1, 10).reshape(3, 3), np.eye(3)]
    built = [_overflow_twell(x) for x in matrices]
    assert sum(b.overflow_nnz for b in built) > 0.7 * sum(b.nnz for b in built)
