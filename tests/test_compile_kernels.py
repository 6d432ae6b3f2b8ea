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
