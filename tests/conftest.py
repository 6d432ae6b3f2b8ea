"""Fixtures, markers and hypothesis profiles shared by the whole suite.

* Hypothesis profiles: ``ci`` (deterministic, loaded whenever ``CI`` is set),
  ``dev`` (the default), ``thorough`` and ``sanitize`` (few examples, for
  ``scripts/sanitize.sh``); ``HYPOTHESIS_PROFILE`` chooses one and wins over ``CI``.
* ``TWELL_NO_MEMORY_POOL=1``: CuPy allocates every array with its own cudaMalloc, so
  that compute-sanitizer sees accesses past an array's end.
* ``backend``: every test that takes it runs once on NumPy and once on CuPy;
  the CuPy run is skipped, with a reason, where there is no CUDA GPU.
* ``rng``: a NumPy Generator seeded from the test's id (no global seeds).
* ``TWELL_SHARD=j/n``: run only every n-th collected test, starting at the j-th (0-based), so
  that n processes share one GPU run (``scripts/gpu_check.sh``, ``scripts/sanitize.sh``).
  Dealing single tests rather than files keeps the shards even: a few files hold most of the
  heavy tests.
* ``TWELL_SANITIZER=tool``: set by ``scripts/sanitize.sh`` to the compute-sanitizer tool the
  process runs under. Under ``initcheck``, ``cupy.matmul`` of two 2-D arrays writes into an
  output zeroed first. initcheck does not see the stores of
  cuBLAS's Hopper GEMM kernels, so without this every kernel that reads a product of
  ``cupy.matmul`` is reported as reading uninitialised memory; with it the tool still checks
  every read of twell's kernels. Under ``racecheck``, ``cupy.matmul`` of 16-bit operands
  runs in float32: cuBLAS's 16-bit Hopper GEMMs make racecheck with ``--kernel-name`` fail
  ("failed to handle a hardware exception"), which breaks the CUDA context for every later
  test.
* The summary: tests skipped for want of a GPU are counted on one line; every other skip is
  listed with its reason (pytest's ``-rs``).
* ``TWELL_TEST_LOG=path``: append each test's outcome and duration to that file as it ends, so
  that a run cut short by a time limit still tells which tests took the time.
"""

import os
import zlib

import numpy as np
import pytest
from helpers import GPU_SKIP_REASON, Backend
from hypothesis import settings

import twell

# deadline=None everywhere: the first CuPy call of a test compiles kernels
# (seconds), which a per-example deadline would report as a failure.
settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None,
                          print_blob=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
# Under compute-sanitizer every launch costs milliseconds: few examples, still derandomised.
settings.register_profile("sanitize", derandomize=True, max_examples=4, deadline=None,
                          print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)

# Under compute-sanitizer (scripts/sanitize.sh), CuPy's memory pool would hide out-of-bounds
# accesses that land inside a pooled block: give every array its own cudaMalloc instead.
if os.environ.get("TWELL_NO_MEMORY_POOL") and twell.cuda_available():
    import cupy

    cupy.cuda.set_allocator(None)

SANITIZER = os.environ.get("TWELL_SANITIZER", "")

if SANITIZER in ("initcheck", "racecheck") and twell.cuda_available():
    import cupy

    _cublas_matmul = cupy.matmul

    def _matmul_for_the_sanitizer(a, b, *args, **kwargs):
        if (args or kwargs or not isinstance(a, cupy.ndarray) or not isinstance(b, cupy.ndarray)
                or a.ndim != 2 or b.ndim != 2):
            return _cublas_matmul(a, b, *args, **kwargs)
        dtype = cupy.result_type(a, b)
        if SANITIZER == "racecheck":
            if dtype.itemsize == 2:
                # cuBLAS's 16-bit Hopper GEMMs crash racecheck run with --kernel-name; float32
                # operands (exact casts) take other kernels, and the product rounds once.
                from twell._cuda._cast import cast  # CuPy's casts flush subnormals

                wide = _cublas_matmul(cast(a, np.float32), cast(b, np.float32))
                return cast(wide, dtype)
            return _cublas_matmul(a, b)
        # The zeros are a memset, which initcheck tracks; cuBLAS then overwrites them.
        out = cupy.zeros((a.shape[0], b.shape[1]), dtype=dtype)
        return _cublas_matmul(a, b, out=out)

    cupy.matmul = _matmul_for_the_sanitizer


def pytest_configure(config):
    # Marks of scipy's own test-suite, which tests/test_scipy_suite.py imports.
    config.addinivalue_line("markers", "thread_unsafe: scipy's mark (tests/test_scipy_suite.py)")
    config.addinivalue_line("markers", "fail_slow: scipy's mark (tests/test_scipy_suite.py)")
    # NaN, Inf and overflowing casts are inputs on purpose here: NumPy's warnings about them
    # from the oracles are noise, not findings. From twell's own lines they are findings: a
    # user's IEEE special values are entries like any other, and twell computes with them
    # without a word (the last matching filter wins).
    for message in ("overflow encountered", "invalid value encountered",
                    "divide by zero encountered"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:RuntimeWarning")
    config.addinivalue_line("filterwarnings", "error::RuntimeWarning:twell")


def _shard():
    """``(j, n)`` from ``TWELL_SHARD``, or None."""
    spec = os.environ.get("TWELL_SHARD")
    if not spec:
        return None
    j, _, n = spec.partition("/")
    try:
        j, n = int(j), int(n)
    except ValueError:
        raise pytest.UsageError(f"TWELL_SHARD={spec!r}: expected 'j/n', e.g. '0/4'") from None
    if not 0 <= j < n:
        raise pytest.UsageError(f"TWELL_SHARD={spec!r}: need 0 <= j < n")
    return j, n


def pytest_collection_modifyitems(config, items):
    shard = _shard()
    if shard is not None:
        j, n = shard
        keep, drop = [], []
        for i, item in enumerate(items):
            (keep if i % n == j else drop).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # Every test that runs on the GPU carries the "gpu" marker, so that "-m gpu" / "-m 'not gpu'"
    # select them: the cupy runs of backend tests and the tests that take the gpu fixture.
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cupy = callspec is not None and callspec.params.get("backend") == "cupy"
        if on_cupy or "gpu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


def pytest_runtest_logreport(report):
    path = os.environ.get("TWELL_TEST_LOG")
    if path and (report.when == "call" or report.outcome != "passed"):
        with open(path, "a") as log:
            log.write(f"{report.duration:9.2f} s  {report.when:8s} {report.outcome:8s} "
                      f"{report.nodeid}\n")


def _gpu_skip(report):
    """Whether ``report`` is a test skipped for want of a GPU."""
    return (report.skipped and isinstance(report.longrepr, tuple)
            and report.longrepr[2].removeprefix("Skipped: ") == GPU_SKIP_REASON)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    # pytest's "-rs" lists every skip location, a line each: on a machine without a GPU that
    # is one line per GPU test. Those are held back from the listing and counted on one line;
    # the totals on the last line still count them.
    skipped = terminalreporter.stats.get("skipped", [])
    gpu = [r for r in skipped if _gpu_skip(r)]
    if gpu:
        terminalreporter.stats["skipped"] = [r for r in skipped if not _gpu_skip(r)]
    yield
    if gpu:
        terminalreporter.stats["skipped"] = skipped
        terminalreporter.write_line(f"{len(gpu)} tests skipped: {GPU_SKIP_REASON}")


def pytest_report_header(config):
    gpu = "yes" if twell.cuda_available() else f"no ({GPU_SKIP_REASON})"
    return [f"hypothesis profile: {PROFILE}", f"twell GPU tests: {gpu}"]


# Session scope: the helper object is stateless, and hypothesis refuses
# function-scoped fixtures in @given tests.
@pytest.fixture(
    scope="session",
    params=[
        pytest.param("numpy", id="numpy"),
        pytest.param("cupy", id="cupy", marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not twell.cuda_available(), reason=GPU_SKIP_REASON),
        ]),
    ],
)
def backend(request):
    """The array library a test runs on: ``xp``, ``asarray(x)``, ``to_host(x)``, ..."""
    return Backend(request.param)


@pytest.fixture(scope="session")
def gpu():
    """The CuPy backend alone, for tests that only make sense on a GPU."""
    if not twell.cuda_available():
        pytest.skip(GPU_SKIP_REASON)
    return Backend("cupy")


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's node id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
