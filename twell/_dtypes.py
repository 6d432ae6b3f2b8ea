"""The value dtypes twell holds, and the rules of arithmetic on them.

twell holds float64, float32, float16 and bfloat16 values (:data:`SUPPORTED_DTYPES`).
Products accumulate in float32 for 16-bit values (:func:`accumulator_dtype`); results take
NumPy's promotion (:func:`result_dtype`). scipy.sparse and cupyx.scipy.sparse hold neither
16-bit type, so an operation that goes through their CSR type computes 16-bit values in
float32 (exact: every float16 and bfloat16 value is a float32 value) and returns float32.
"""

import numbers

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: Value dtypes a TwELL/ELL matrix can hold.
SUPPORTED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), bfloat16)


def value_dtype(dtype, name="dtype"):
    """The storage dtype for input of ``dtype``.

    float64/float32/float16/bfloat16 are kept, in native byte order (a big-endian
    ``>f8`` is float64, converted where it comes in, as NumPy and scipy do); bool and
    integer input becomes float64; anything else (complex, objects, strings) is a
    TypeError.
    """
    dtype = native_dtype(np.dtype(dtype))
    if dtype in SUPPORTED_DTYPES:
        return dtype
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    supported = ", ".join(str(d) for d in SUPPORTED_DTYPES)
    raise TypeError(
        f"{name} must be one of {supported} (bool and integers become float64); got {name}={dtype}"
    )


def native_dtype(dtype):
    """``dtype`` in the machine's byte order."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def native(a):
    """A NumPy array in the machine's byte order: ``a`` itself, or a converted copy (CuPy
    arrays are always native)."""
    return a if a.dtype.isnative else a.astype(native_dtype(a.dtype))


def accumulator_dtype(dtype):
    """Accumulation dtype: float64 for float64, float32 for everything narrower."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def result_dtype(a, b):
    """NumPy promotion of two value dtypes, with bfloat16 x float16 -> float32.

    NumPy has no common type for ml_dtypes' bfloat16 and float16; both fit
    in float32 exactly, so that is the answer.
    """
    a, b = value_dtype(a), value_dtype(b)
    try:
        return value_dtype(np.result_type(a, b))
    except TypeError:
        return np.dtype(np.float32)


#: The 16-bit value dtypes, which scipy and cupyx cannot hold.
SIXTEEN_BIT = (np.dtype(np.float16), bfloat16)

_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)


def astype_dtype(dtype, name="dtype"):
    """The dtype ``astype`` casts to: one of the supported value dtypes, else TypeError.

    Unlike the constructor, which stores bool and integer input as float64, ``astype`` is a
    request for a dtype: one that twell cannot hold is an error, not a silent float64.
    """
    try:
        dt = np.dtype(dtype).newbyteorder("=")  # the other byte order: the same values
    except TypeError:
        dt = None
    if dt is not None and dt in SUPPORTED_DTYPES:
        return dt
    supported = ", ".join(str(d) for d in SUPPORTED_DTYPES)
    raise TypeError(
        f"{name} must be one of {supported}: twell holds floating-point values only; got "
        f"{name}={dt if dt is not None else repr(dtype)} (for another dtype convert first, "
        "e.g. A.tocsr().astype(...))"
    )


def scipy_dtype(dtype):
    """The dtype an operation through scipy's or cupyx's CSR computes in: float32 for the
    16-bit dtypes, the dtype itself otherwise."""
    dtype = np.dtype(dtype)
    return _FLOAT32 if dtype in SIXTEEN_BIT else dtype


def is_real_scalar(x):
    """A real number twell takes: a Python bool, int or float, or a NumPy (or CuPy) bool,
    integer or supported-float scalar or 0-d array. Fractions, Decimals, complex numbers
    and long doubles are not."""
    if isinstance(x, (bool, int, float)):  # their subclasses too (IntEnum, np.float64)
        return True
    dtype = getattr(x, "dtype", None)
    if getattr(x, "ndim", None) != 0 or dtype is None:
        return False
    dtype = np.dtype(dtype).newbyteorder("=")
    return dtype.kind in "biu" or dtype in SUPPORTED_DTYPES


def is_number(x):
    """A number of any kind, Python's or NumPy's (bool, complex, Fraction, Decimal, long
    double, 0-d arrays): an operand that ``*`` and ``/`` treat as a scalar."""
    return isinstance(x, (numbers.Number, np.generic))


def check_scalar(x, symbol):
    """``x`` as a scalar operand of ``A <symbol> x``, or the TypeError that names its type
    and what is supported (a ValueError for a Python int past the float64 range)."""
    if not is_real_scalar(x):
        raise TypeError(
            f"TwELLMatrix {symbol} x supports real scalars: bool, int, float, or a NumPy "
            "bool, integer or float64, float32, float16 or bfloat16 scalar or 0-d array; use "
            f"@ for matrix products; got x of type {_type_name(x)}"
        )
    if type(x) is int and not -2**1024 < x < 2**1024:  # past float64: no rounding holds it
        raise ValueError(f"TwELLMatrix {symbol} x: x={_int_text(x)} is past the float64 range "
                         "(about 1.8e308)")
    return x


def _type_name(x):
    """``x``'s type as a user names it: ``Fraction``, ``numpy.longdouble``, ``numpy.ndarray
    of dtype complex128``."""
    if getattr(x, "ndim", None) == 0 and hasattr(x, "dtype") and not isinstance(x, np.generic):
        return f"{type(x).__module__.split('.')[0]}.ndarray of dtype {x.dtype}"
    name = type(x).__name__
    return f"numpy.{name}" if isinstance(x, np.generic) else name


def _int_text(x):
    """A huge int briefly: ``10**400`` where it is a power of ten, else its digits' count."""
    digits = str(abs(x))
    if digits.strip("0") == "1":
        return f"{'-' if x < 0 else ''}10**{len(digits) - 1}"
    return f"an int of {len(digits)} digits"


def scalar_result_dtype(dtype, scalar):
    """NumPy's result dtype of ``values <op> scalar`` for values of ``dtype`` (NEP 50).

    Python's bool, int and float are weak: they take the values' dtype. NumPy scalars and
    0-d arrays promote like arrays; bfloat16 with float16 gives float32
    (:func:`twell._dtypes.result_dtype`).
    """
    if type(scalar) in (bool, int, float):
        return np.dtype(dtype)
    return result_dtype(dtype, np.dtype(scalar.dtype))


#: Operations whose float32 result is their float64 result rounded once to float32: the
#: product of two float32 values is exact in float64, and a quotient rounded to float64 and
#: then to float32 rounds as once (53 >= 2 * 24 + 2 bits).
_EXACT_THROUGH_FLOAT64 = (np.multiply, np.true_divide)


def scalar_map(op, scalar, dtype, cast):
    """``values -> op(values, scalar)`` rounded as NumPy rounds it for the result dtype.

    The scalar rounds to the result dtype first (NEP 50). float64, float32 and float16 values
    then combine with it in the array library's own loops for that dtype (NumPy's and CuPy's
    float16 loops compute in float32 and round once); bfloat16 values combine in float32 and
    round once, as ml_dtypes' loops do. ``cast`` is the backend's cast
    (:func:`twell._numpy_backend.cast`), which keeps subnormals.

    On the GPU, CuPy's float32 loops flush subnormal operands and results to zero (CuPy
    compiles them with ``-ftz=true``); there a float32 or bfloat16 product or quotient is
    computed in float64 and rounded to float32 by ``cast``, which gives NumPy's bits.

    Returns ``(function of the values, result dtype)``.
    """
    if getattr(scalar, "ndim", None) == 0 and hasattr(scalar, "get"):
        scalar = scalar.get()  # a 0-d CuPy array: to the host (a sync), as CuPy would
    out = scalar_result_dtype(dtype, scalar)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.asarray(scalar).astype(out)[()]  # the weak scalar rounded as NumPy rounds it
    through_float64 = out in (_FLOAT32, bfloat16) and op in _EXACT_THROUGH_FLOAT64
    if out == bfloat16:
        s32 = np.float32(s)

        def host(values):
            return cast(op(cast(values, _FLOAT32), s32), out)
    else:

        def host(values):
            return op(values if values.dtype == out else cast(values, out), s)

    def fn(values):
        if isinstance(values, np.ndarray) or not through_float64:
            return host(values)
        return through_float64_map(op, values, s, cast, out)

    return fn, out


def through_float64_map(op, values, s, cast, out=None):
    """``op(values, s)`` in the result dtype ``out`` (float32 or bfloat16; default the
    values' dtype) for values that convert to it exactly and a scalar ``s`` of that dtype,
    computed in float64 and rounded by ``cast`` (float64 -> float32 -> bfloat16, as NumPy's
    and ml_dtypes' loops round), for an op of :data:`_EXACT_THROUGH_FLOAT64`."""
    out = values.dtype if out is None else np.dtype(out)
    narrow = cast(op(cast(values, _FLOAT64), np.float64(s)), _FLOAT32)
    return narrow if out == _FLOAT32 else cast(narrow, out)
