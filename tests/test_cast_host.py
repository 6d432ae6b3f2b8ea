"""twell_cast's conversion functions, compiled for the host with nvcc, against NumPy/ml_dtypes.

CuPy compiles kernels with flush-to-zero, so cast.cu converts in integer and double
arithmetic; this test runs exactly that code on the CPU (no GPU needed) and compares every bit
with NumPy's and ml_dtypes' conversions, subnormals, ties, overflow and NaN included.
"""

import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from helpers import cast

import twell
from twell._cuda import _compile

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")

DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), twell.bfloat16]
CODES = {d: i for i, d in enumerate(DTYPES)}

HARNESS = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "cast.cu"

template <typename S, typename D> void run(FILE* in, FILE* out, long long n) {
  std::vector<S> src(n);
  std::vector<D> dst(n);
  if (fread(src.data(), sizeof(S), n, in) != static_cast<size_t>(n)) return;
  for (long long i = 0; i < n; ++i) dst[i] = twell::narrow<D>(twell::widen(src[i]));
  fwrite(dst.data(), sizeof(D), n, out);
}

template <typename S> void dispatch_dst(int d, FILE* in, FILE* out, long long n) {
  if (d == 0) run<S, double>(in, out, n);
  if (d == 1) run<S, float>(in, out, n);
  if (d == 2) run<S, __half>(in, out, n);
  if (d == 3) run<S, __nv_bfloat16>(in, out, n);
}

int main(int argc, char** argv) {
  const int s = atoi(argv[1]), d = atoi(argv[2]);
  const long long n = atoll(argv[3]);
  FILE* in = fopen(argv[4], "rb");
  FILE* out = fopen(argv[5], "wb");
  if (s == 0) dispatch_dst<double>(d, in, out, n);
  if (s == 1) dispatch_dst<float>(d, in, out, n);
  if (s == 2) dispatch_dst<__half>(d, in, out, n);
  if (s == 3) dispatch_dst<__nv_bfloat16>(d, in, out, n);
  fclose(in);
  fclose(out);
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cast")
    src = folder / "harness.cu"
    src.write_text(HARNESS)
    exe = folder / "harness"
    cmd = [NVCC, "-std=c++17", "-x", "cu", f"-I{_compile.source_dir()}", str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return exe


def _values(rng):
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e-40, 1e-45, 1.4e-45, 7e-46, 3e-39,
               1.1754942e-38, 1.17549435e-38, 9.2e-41, 6e-8, 1e-300, 1 + 2**-8 + 2**-30,
               1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11 + 2**-40, 65520.0, 65504.0, 3.3895e38,
               3.4e38, 3.5e38, -2.0**-126, 2.0**-133, 2.0**-134, 3 * 2.0**-135, 1e39,
               # exact ties of every target: float32, bfloat16, their subnormals, float16
               1 + 2**-24, 1 + 3 * 2**-24, 2.0**-150, 3 * 2.0**-150, 5 * 2.0**-134,
               1 + 2**-11, 1 + 3 * 2**-11, 2.0**-25, 3 * 2.0**-25, 2.0**128 - 2.0**103]
    scale = 10.0 ** rng.integers(-47, 40, 4000)
    return np.concatenate([special, rng.standard_normal(4000) * scale])


@pytest.mark.parametrize("src", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", DTYPES, ids=lambda d: d.name)
def test_cast_functions_match_numpy_bit_for_bit(harness, tmp_path, rng, src, dst):
    with np.errstate(all="ignore"):
        x = _values(rng).astype(src)
        want = cast(x, dst)
    (tmp_path / "in").write_bytes(x.tobytes())
    subprocess.run([str(harness), str(CODES[src]), str(CODES[dst]), str(x.size),
                    str(tmp_path / "in"), str(tmp_path / "out")], check=True)
    got = np.frombuffer((tmp_path / "out").read_bytes(), dtype=dst)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), nan)
    bits = f"u{dst.itemsize}"
    bad = np.nonzero(got[~nan].view(bits) != want[~nan].view(bits))[0]
    assert bad.size == 0, (x[~nan][bad[:5]], got[~nan][bad[:5]], want[~nan][bad[:5]])


def test_harness_sources_are_the_shipped_ones():
    assert (pathlib.Path(_compile.source_dir()) / "cast.cu").is_file()
