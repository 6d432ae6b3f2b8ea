"""scripts/compile_kernels.py, the CI's kernel build: its reading of ptxas' spill report."""

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "compile_kernels.py"
_spec = importlib.util.spec_from_file_location("compile_kernels", _PATH)
compile_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compile_kernels)

_REPORT = """\
ptxas info    : Compiling entry function '_Z15twell_spmm_rowsI13__nv_bfloat16Li8EEvPKi' for 'sm_90'
ptxas info    : Function properties for _Z15twell_spmm_rowsI13__nv_bfloat16Li8EEvPKi
    24 bytes stack frame, {rows} bytes spill stores, 52 bytes spill loads
ptxas info    : Used 80 registers, used 0 barriers
ptxas info    : Compiling entry function '_Z15twell_spmv_rowsIdLi8EEvPKi' for 'sm_90'
ptxas info    : Function properties for _Z15twell_spmv_rowsIdLi8EEvPKi
    0 bytes stack frame, {spmv} bytes spill stores, 0 bytes spill loads
"""


def _rejected(rows, spmv):
    report = _REPORT.format(rows=rows, spmv=spmv)
    return [(entry, stores) for entry, stores in compile_kernels._spills(report)
            if stores > compile_kernels._accepted_spill(entry)]


def test_spills_are_charged_to_their_kernel():
    # The gather SpMM may spill the few bytes its register cap was measured with; any other
    # kernel may not spill at all, and the gather kernel not more than granted.
    assert _rejected(36, 0) == []
    assert _rejected(36, 4) == [("_Z15twell_spmv_rowsIdLi8EEvPKi", 4)]
    granted = compile_kernels.ACCEPTED_SPILL_STORES["twell_spmm_rows"]
    assert _rejected(granted + 8, 0) == [("_Z15twell_spmm_rowsI13__nv_bfloat16Li8EEvPKi",
                                          granted + 8)]


def test_every_kernel_of_a_source_has_an_instance():
    # A kernel of a name-expression module is reachable only through an instance listed in
    # twell._cuda._compile.INSTANCES: one left out compiles and passes nvcc, and then fails at
    # its first launch on a GPU with a missing name. Every __global__ twell_* of those sources
    # has at least one instance (the ARCH_SOURCES kernels are extern "C", named as written).
    import re

    from twell._cuda import _compile

    root = _PATH.parent.parent / "cuda_src"
    checked = 0
    for key, expressions in _compile.INSTANCES.items():
        source = _compile.source_file(key)
        if key != source or source in _compile.ARCH_SOURCES:
            continue
        text = (root / source).read_text()
        kernels = {m.group(1) for m in re.finditer(r"__global__[^;{]*?\b(twell_\w+)\s*\(", text)}
        assert kernels, source
        listed = {e.partition("<")[0] for e in expressions}
        assert kernels <= listed, (source, sorted(kernels - listed))
        checked += len(kernels)
    assert checked >= 20
