"""The backends: the choice by array type, the contract both implement, import without CuPy,
and the CUDA sources the loader compiles."""

import ast
import inspect
import pathlib
import re
import types

import numpy as np
import pytest
from helpers import BF16, F16, GPU_SKIP_REASON, gpu_test, run_python

import twell
from twell import _arrays, _contract, _numpy_backend
from twell._cuda import _compile, _policy, _tma


def test_cuda_available_is_a_bool():
    assert isinstance(twell.cuda_available(), bool)


def test_import_without_cupy():
    """``import twell`` and the NumPy path work when CuPy cannot be imported."""
    code = (
        "import sys; sys.modules['cupy'] = None; sys.modules['cupyx'] = None\n"
        "import numpy as np, twell\n"
        "assert twell.cuda_available() is False\n"
        "a = twell.TwELLMatrix(np.eye(3))\n"
        "assert (a @ np.ones(3)).tolist() == [1.0, 1.0, 1.0]\n"
        "print('ok')\n"
    )
    assert run_python(code) == "ok"


def test_numpy_arrays_choose_numpy():
    assert _arrays.array_module(np.ones(2), None, np.zeros(1)) is np
    x = np.ones(3)
    assert _arrays.to_numpy(x) is x


def test_mixing_host_and_device_arrays_is_a_type_error(gpu):
    with pytest.raises(TypeError, match="cannot mix NumPy"):
        _arrays.array_module(np.ones(2), gpu.asarray(np.ones(2)))
    assert _arrays.array_module(gpu.asarray(np.ones(2))) is gpu.xp


# -- the backend contract ----------------------------------------------------------------

CUDA_PACKAGE = pathlib.Path(_compile.__file__).parent


def _signature_text(fn):
    return str(inspect.signature(fn))


def _cuda_signatures():
    """Each name the CuPy backend module exports, with its signature as the source states it:
    read from the sources, so that the check runs without CuPy too."""
    exported = {}
    for node in ast.parse((CUDA_PACKAGE / "_backend.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                exported[alias.name] = node.module
    found = {}
    for name, module in exported.items():
        tree = ast.parse((CUDA_PACKAGE / f"{module}.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                code = f"def f{ast.unparse(node.args).join('()')}: pass"
                namespace = {}
                exec(compile(code, "<signature>", "exec"), namespace)  # noqa: S102 - our source
                found[name] = _signature_text(namespace["f"])
    return found


def _contract_signature(name):
    fn = getattr(_contract.Backend, name)
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    return str(inspect.Signature(params))


def test_the_contract_lists_the_functions_both_backends_use():
    assert set(_contract.FUNCTIONS) >= {"spmm", "pack_dense", "pack_csr", "to_dense", "to_csr",
                                        "canonical_csr", "cast", "gated_up", "matmul_pack"}


@pytest.mark.parametrize("name", _contract.FUNCTIONS)
def test_the_numpy_backend_implements_the_contract(name):
    assert callable(getattr(_numpy_backend, name, None)), name
    assert _signature_text(getattr(_numpy_backend, name)) == _contract_signature(name)


@pytest.mark.parametrize("name", _contract.FUNCTIONS)
def test_the_cupy_backend_implements_the_contract(name):
    signatures = _cuda_signatures()
    assert name in signatures, f"twell/_cuda/_backend.py does not export {name}"
    assert signatures[name] == _contract_signature(name)


def test_the_cupy_backend_exports_nothing_beyond_the_contract():
    assert set(_cuda_signatures()) == set(_contract.FUNCTIONS)


@gpu_test
def test_the_cupy_backend_module_is_what_the_sources_say():
    from twell import _backend
    from twell._cuda import _backend as cuda_backend

    assert _backend.backend(__import__("cupy")) is cuda_backend
    for name in _contract.FUNCTIONS:
        assert _signature_text(getattr(cuda_backend, name)) == _contract_signature(name)


def test_gpu_skip_reason_is_the_documented_one():
    assert GPU_SKIP_REASON == "CuPy with a CUDA GPU is not available"


# -- CUDA sources ------------------------------------------------------------------------

def test_every_kernel_source_is_found():
    folder = _compile.source_dir()
    assert (folder / _compile.HEADER).is_file()
    for name in _compile.INSTANCES:
        assert (folder / _compile.source_file(name)).is_file(), name


def test_wide_instances_are_the_narrow_ones_with_int_columns():
    """Every narrow instance that reads or writes ``indices`` has its int twin, but the staged
    dense pack's and the tile index's; the twin differs only by the trailing ``int``."""
    for name in ("pack.cu", "unpack.cu", "spmm.cu"):
        wide = _compile.INSTANCES[name + _compile.WIDE]
        assert wide and all(e.endswith(", int>") for e in wide)
        assert len(set(wide)) == len(wide)
        kernels = {e.partition("<")[0] for e in wide}
        assert kernels == {e.partition("<")[0] for e in _compile.INSTANCES[name]
                           if re.search(r"\bindices\b",
                                        _kernel_parameters(name, e.partition("<")[0]))}
    assert _compile.wide("twell_spmv_thread_rows<float>") == \
        "twell_spmv_thread_rows<float, false, int>"
    assert (_compile.wide("twell_pack_dense<__half, 8, 1>")
            == "twell_pack_dense<__half, 8, 1, 1, int>")
    assert _compile.wide("twell_spmm_rows<double, 2, 8, 2, 2>") == \
        "twell_spmm_rows<double, 2, 8, 2, 2, false, int>"


def _kernel_parameters(name, kernel):
    """The parameter list of ``kernel``'s definition in ``name``'s source."""
    text = _compile.source_text(name)
    match = re.search(rf"__global__[^;{{}}]*\b{kernel}\s*\(([^{{]*)\)\s*{{", text)
    return match[1] if match else ""


@pytest.mark.parametrize("name", sorted(_compile.INSTANCES))
def test_kernel_sources_inline_the_header(name):
    text = _compile.source_text(_compile.source_file(name))
    assert f'#include "{_compile.HEADER}"' not in text
    assert f'#line 1 "{_compile.HEADER}"' in text
    assert re.search(rf'#line \d+ "{re.escape(_compile.source_file(name))}"', text)
    assert "namespace twell" in text
    # Every cuda_src header the file includes, directly or through another header, is pasted
    # in exactly once (CuPy's cache keys on the text; #pragma once would not reach NVRTC).
    for header in _compile.source_dir().glob("*.cuh"):
        assert f'#include "{header.name}"' not in text, header.name
        assert text.count(f'#line 1 "{header.name}"') <= 1, header.name


@pytest.mark.parametrize("name", sorted(_compile.INSTANCES))
def test_every_instantiated_kernel_exists_and_is_named_twell(name):
    text = _compile.source_text(_compile.source_file(name))
    for expression in _compile.INSTANCES[name]:
        kernel = expression.split("<")[0]
        assert kernel.startswith("twell_"), expression
        # Defined as such, or by a kernel-defining macro of the file (one per dtype where
        # NVRTC builds the file without name expressions).
        macro = re.search(rf"^(TWELL_\w+)\({kernel}\b", text, re.M)
        assert (re.search(rf"__global__[^;{{}}]*\b{kernel}\s*\(", text)
                or macro and re.search(rf"#define {macro[1]}\([^)]*\)[^\n]*\\\n[^\n]*__global__",
                                       text)), expression


@gpu_test
@pytest.mark.parametrize("name", sorted(_compile.INSTANCES))
def test_every_kernel_compiles(name):
    if name in _compile.ARCH_SOURCES and not _compile.arch_supported(name):
        with pytest.raises(RuntimeError, match="compute capability"):
            _compile.function(name, _compile.INSTANCES[name][0])
        return
    for expression in _compile.INSTANCES[name]:
        assert _compile.function(name, expression) is not None


@pytest.mark.skipif(twell.cuda_available(), reason="checks the message shown without a GPU")
def test_skip_reason_without_gpu():
    assert not twell.cuda_available()
    assert GPU_SKIP_REASON


def _fake(ptr, shape, dtype=BF16):
    """What tensor_map_2d reads of an array: its address, shape, dtype and item size."""
    return type("FakeArray", (), {"shape": shape, "dtype": np.dtype(dtype), "itemsize": 2,
                                  "data": type("Pointer", (), {"ptr": ptr})})()


def test_tensor_map_encodes_the_array_once_per_address_and_shape(monkeypatch):
    # The driver's encoder replaced by a recorder, so this runs without a GPU. A map must
    # describe the array: element type (cuda.h: 9 bfloat16, 6 float16), address,
    # (columns, rows), the row pitch, the box. A cached encoder once passed its own buffer's
    # address instead, and every Hopper launch faulted.
    seen = []

    def encode(out, dtype, rank, address, dims, strides, box, element_strides, *modes):
        seen.append((dtype, address.value, list(dims), list(strides), list(box)))
        return 0

    monkeypatch.setattr(_tma, "_encode_tiled", lambda: encode)
    _tma._tensor_map.cache_clear()
    try:
        a = _tma.tensor_map_2d(_fake(0x7F00_0000_1000, (300, 64)), 64, 128)
        again = _tma.tensor_map_2d(_fake(0x7F00_0000_1000, (300, 64)), 64, 128)
        other = _tma.tensor_map_2d(_fake(0x7F00_0000_9000, (300, 64)), 64, 128)
        wider = _tma.tensor_map_2d(_fake(0x7F00_0000_1000, (300, 64)), 64, 256)
        half = _tma.tensor_map_2d(_fake(0x7F00_0000_1000, (300, 64), F16), 64, 128)
    finally:
        _tma._tensor_map.cache_clear()  # no recorded map outlives the test
    assert seen == [(9, 0x7F00_0000_1000, [64, 300], [128], [64, 128]),
                    (9, 0x7F00_0000_9000, [64, 300], [128], [64, 128]),
                    (9, 0x7F00_0000_1000, [64, 300], [128], [64, 256]),
                    (6, 0x7F00_0000_1000, [64, 300], [128], [64, 128])]
    assert again is a and other is not a and wider is not a and half is not a
    assert a.nbytes == _tma.TENSOR_MAP_BYTES and not a.flags.writeable


def test_tensor_map_names_the_shape_on_a_driver_error(monkeypatch):
    monkeypatch.setattr(_tma, "_encode_tiled", lambda: lambda *args: 1)
    _tma._tensor_map.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"CUresult 1 .*shape \(5, 8\)"):
            _tma.tensor_map_2d(_fake(0x1000, (5, 8)), 64, 128)
    finally:
        _tma._tensor_map.cache_clear()


@pytest.mark.parametrize("density, want", [(0.001, False), (0.005, False), (0.0084, False),
                                           (0.0086, True), (0.01, True), (0.05, True)])
def test_fused_up_projection_follows_the_density(density, want):
    # The gated Hopper kernel computes the up projection whole: it pays from 0.85% of the
    # gate non-zero (H100, the paper's shape, the replayed module with each way forced: at
    # 0.5% the fused layer took 1.387 ms against the dot products' 1.134, at 0.7% 1.498
    # against 1.377, at 0.9% 1.577 against 1.638, at 1% 1.623 against 1.719).
    m, h = 16384, 5632
    assert _policy.fused_up_pays(m, h, round(density * m * h)) is want


@pytest.mark.parametrize("dtype, slots, overflow, want", [
    (np.float32, 5, 0, "thread"),   # the stencil: a thread per row
    (np.float64, 5, 0, "thread"),
    (np.float32, 11, 0, "warp"),    # the graph: a warp streams 32 rows
    (BF16, 11, 0, "warp"),
    (np.float64, 11, 0, "warp"),
    (np.float64, 4, 100, "warp"),   # room 4 + 100 / 10 rows: the overflow counts
    (np.float32, 4, 40, "thread"),  # room 8: still a thread per row
    (np.float32, 16, 180, "warp"),  # room 34 (the graph's Laplacian)
    (np.float32, (1 << 20) + 1, 0, "thread"),  # slot places past the warp's 32-bit count
], ids=str)
def test_one_tile_spmv_way_follows_the_room(dtype, slots, overflow, want):
    # The one-tile SpMV's kernel from the arrays' shapes alone (no GPU needed).
    parts = types.SimpleNamespace(data=types.SimpleNamespace(shape=(10, 1, slots), dtype=dtype),
                                  overflow_indices=np.empty(overflow, dtype=np.int32))
    assert _policy.one_tile_way(parts, 10) == want

