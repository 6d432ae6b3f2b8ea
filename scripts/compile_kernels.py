"""Compile every CUDA source with nvcc for the given architectures (CI).

The instantiations come from the same table the run-time loader uses
(``twell._cuda._compile.INSTANCES``); taking each kernel's address in a generated
translation unit makes nvcc compile it. Prints ptxas' register, shared
memory and spill report; exits non-zero on any compile error, and on spills
(beyond the few bytes ``ACCEPTED_SPILL_STORES`` grants a kernel measured faster with them)
unless ``--allow-spills``.

With ``--nvrtc``, every module is also compiled by NVRTC as the loader compiles it at run
time (CuPy's options for a RawModule, twell's own for the ARCH_SOURCES, the same name
expressions), no GPU needed: NVRTC refuses some code that nvcc accepts (an unannotated
function is host code in its JIT mode). The library comes from the ``nvidia-cuda-nvrtc``
wheel (or ``--nvrtc PATH``); the CUDA headers from nvcc's include folder.

Usage: python scripts/compile_kernels.py --arch sm_80 --arch sm_90 [--nvrtc [PATH]] [--nvrtc-only]
"""

import argparse
import ctypes
import glob
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from twell._cuda import _compile  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=[], help="e.g. sm_80 (repeatable)")
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--allow-spills", action="store_true")
    parser.add_argument("--nvrtc", nargs="?", const="wheel", default=None, metavar="PATH",
                        help="also compile with NVRTC (libnvrtc.so at PATH, else the wheel's)")
    parser.add_argument("--nvrtc-only", action="store_true", help="NVRTC without nvcc")
    args = parser.parse_args()
    archs = args.arch or ["sm_80", "sm_90"]
    if args.nvrtc_only and not args.nvrtc:
        args.nvrtc = "wheel"
    src = ROOT / "cuda_src"
    missing = sorted(p.name for p in src.glob("*.cu") if p.name not in _compile.INSTANCES)
    if missing:
        sys.exit(f"cuda_src has sources the loader does not know: {missing}")
    failed, spills = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, instances in {} if args.nvrtc_only else _compile.INSTANCES.items():
            # A key names a file, or a file's wide instances ("spmm.cu:wide").
            unit = pathlib.Path(tmp) / (name.replace(":", "-") + ".cu")
            refs = ",\n  ".join(f"(const void*)&{e}" for e in instances)
            unit.write_text(f'#include "{src / _compile.source_file(name)}"\n'
                            f"const void* const twell_ci_instances[] = {{\n  {refs}\n}};\n")
            # An ARCH_SOURCES file is built for its own architecture only (e.g. sm_90a).
            own = _compile.ARCH_SOURCES.get(name)
            for arch in [own[0]] if own else archs:
                print(f"== {name} {arch}", flush=True)
                # The options CuPy builds it with at run time (-ftz=true appended).
                returncode, report = _nvcc(args.nvcc, unit, arch,
                                           unit.with_suffix(f".{arch}.cubin"),
                                           _compile.build_options(name))
                if returncode:
                    print(report)
                    failed.append(f"{name} ({arch})")
                spills += [f"{name} {arch} {entry}: {stores} bytes spill stores"
                           for entry, stores in _spills(report)
                           if stores > _accepted_spill(entry)]
    if args.nvrtc:
        failed += _nvrtc_all(args.nvrtc, args.nvcc, archs)
    if failed:
        sys.exit(f"compile failed: {failed}")
    if spills:
        print("spills:\n  " + "\n  ".join(spills))
        if not args.allow_spills:
            sys.exit("register spills found (pass --allow-spills to accept)")
    print(f"compiled {sum(len(v) for v in _compile.INSTANCES.values())} kernels for {archs} "
          f"with {'NVRTC' if args.nvrtc_only else 'nvcc' + (' and NVRTC' if args.nvrtc else '')} "
          f"(and {sorted(set(a for a, _ in _compile.ARCH_SOURCES.values()))} for "
          f"{sorted(_compile.ARCH_SOURCES)}): OK")


_SHOWN = ("Compiling entry", "Used", "spill", "error")

#: Spill stores (bytes) accepted per kernel, by a part of its (mangled) name: only where the
#: code that spills was measured to pay despite them. twell_spmm_rows carries __maxnreg__(80)
#: (cuda_src/spmm.cu): 25 warps per SM instead of 16 made it 1.21x faster at 99% on an H200
#: with 36 bytes of bf16 spill stores (sm_90; 24-26 on sm_80). A new spill anywhere else, or
#: a larger one here, still fails. twell_gated_dense_sm90_f16 (cuda_src/matmul_pack_sm90.cu):
#: 8 bytes of spill stores and no spill loads since its epilogue stages rows in shared memory,
#: which made the bf16 instance 5% faster (1.101 ms against 1.163 at 99%, H100) and left the
#: float16 module's layer as fast as before or faster (1.15-1.18x of dense against
#: 1.13-1.16x, the full benchmark).
ACCEPTED_SPILL_STORES = {"twell_spmm_rows": 64, "twell_gated_dense_sm90_f16": 8}


def _accepted_spill(entry):
    return max((b for part, b in ACCEPTED_SPILL_STORES.items() if part in entry), default=0)


def _spills(report):
    """(entry function, bytes of spill stores) for every entry that ptxas says spills."""
    entry, out = "?", []
    for line in report.splitlines():
        named = re.search(r"Compiling entry function '([^']+)'", line)
        if named:
            entry = named.group(1)
        stores = re.search(r"(\d+) bytes spill stores", line)
        if stores and int(stores.group(1)) > 0:
            out.append((entry, int(stores.group(1))))
    return out


def _nvcc(nvcc, source, arch, cubin, options):
    """Compile ``source`` to ``cubin`` with ``options`` and -I cuda_src; print the report
    lines that contain one of ``_SHOWN`` (ptxas' registers and spills, errors); return
    (exit status, report).
    """
    res = subprocess.run([nvcc, *options, f"-arch={arch}", "-cubin", "-Xptxas", "-v",
                          f"-I{ROOT / 'cuda_src'}", "-o", str(cubin), str(source)],
                         capture_output=True, text=True)
    report = res.stdout + res.stderr
    for line in report.splitlines():
        if any(w in line for w in _SHOWN):
            print("  " + line.strip().replace("ptxas info    : ", ""))
    return res.returncode, report


def _nvrtc_all(where, nvcc, archs):
    """Compile every module key with NVRTC as the run-time loader does; return the failures
    ("name (arch)") after printing NVRTC's log of each."""
    lib = _load_nvrtc(where)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    includes = _nvcc_includes(nvcc)
    print(f"== NVRTC {major.value}.{minor.value} ({lib._name}), headers {includes}", flush=True)
    failed = []
    for name, instances in _compile.INSTANCES.items():
        own = _compile.ARCH_SOURCES.get(name)
        # A RawModule names its kernels by name expressions; an ARCH_SOURCES file's are
        # extern "C" and come out of the cubin by name.
        expressions = () if own else instances
        for arch in [own[0]] if own else archs:
            log = _nvrtc(lib, _compile.source_text(_compile.source_file(name)), name,
                         [f"-arch={arch}", *_compile.nvrtc_options(name), *includes],
                         expressions)
            print(f"  NVRTC {name} {arch}: {'OK' if log is None else 'FAILED'}", flush=True)
            if log is not None:
                print(log)
                failed.append(f"{name} ({arch}, NVRTC)")
    return failed


def _load_nvrtc(where):
    """libnvrtc from ``where``, or from the nvidia-cuda-nvrtc wheel of this Python."""
    if where == "wheel":
        import nvidia  # the wheels' namespace package

        found = sorted(p for d in nvidia.__path__
                       for p in glob.glob(os.path.join(d, "*", "lib", "libnvrtc.so.*"))
                       if ".alt." not in p)
        if not found:
            sys.exit("--nvrtc: no libnvrtc.so in the nvidia-cuda-nvrtc wheel "
                     f"(looked in {list(nvidia.__path__)})")
        where = found[-1]
    # NVRTC opens its builtins library by name: load it first from the same folder.
    for builtins in glob.glob(os.path.join(os.path.dirname(where), "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(where)


def _nvcc_includes(nvcc):
    """nvcc's own -I options (the toolkit's headers: cuda_bf16.h and the rest)."""
    res = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    found = re.search(r'INCLUDES="([^"]*)"', res.stdout + res.stderr)
    return found.group(1).split() if found else []


def _nvrtc(lib, code, name, options, expressions):
    """NVRTC's log if compiling ``code`` fails, else None."""
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), code.encode(), name.encode(), 0, None,
                              None):
        return f"nvrtcCreateProgram failed on {name}"
    try:
        for expression in expressions:
            lib.nvrtcAddNameExpression(program, expression.encode())
        encoded = [o.encode() for o in options]
        status = lib.nvrtcCompileProgram(program, len(encoded),
                                         (ctypes.c_char_p * len(encoded))(*encoded))
        if status == 0:
            return None
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        return log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


if __name__ == "__main__":
    main()
