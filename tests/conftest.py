"""Fixtures, markers and hypothesis profiles shared by the whole suite.

* Hypothesis profiles: ``ci`` (deterministic, loaded whenever ``CI`` is set),
  ``dev`` (the default), ``thorough`` and ``sanitize`` (few examples, for
  ``scripts/sanitize.sh``); ``HYPOTHESIS_PROFILE`` chooses one and wins over ``CI``.
* ``TWELL_NO_MEMORY_POOL=1``: CuPy allocates every array with its own cudaMalloc, so
  that compute-sanitizer sees accesses past an array's end.
* ``backend``: every test that takes it runs once on NumPy and once on CuPy;
  the CuPy run is skipped, with a reason, where there is no CUDA GPU.
* ``rng``: a NumPy Generator seeded from the test's id (no global seeds).
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


def pytest_configure(config):
    # NaN, Inf and overflowing casts are inputs on purpose here: NumPy's warnings about them
    # (from the oracles and from twell alike) are noise, not findings.
    for message in ("overflow encountered", "invalid value encountered",
                    "divide by zero encountered"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:RuntimeWarning")


def pytest_collection_modifyitems(config, items):
    # Every test that runs on the GPU carries the "gpu" marker, so that "-m gpu" / "-m 'not gpu'"
    # select them: the cupy runs of backend tests and the tests that take the gpu fixture.
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cupy = callspec is not None and callspec.params.get("backend") == "cupy"
        if on_cupy or "gpu" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


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
