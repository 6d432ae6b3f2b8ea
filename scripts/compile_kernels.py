"""Compile every CUDA source with nvcc for the given architectures (CI).

The instantiations come from the same table the run-time loader uses
(``twell._cuda._compile.INSTANCES``); taking each kernel's address in a generated
translation unit makes nvcc compile it. Prints ptxas' register, shared
memory and spill report; exits non-zero on any compile error, and on spills
(beyond the few bytes ``ACCEPTED_SPILL_STORES`` grants a kernel measured faster with them)
unless ``--allow-spills``.

Usage: python scripts/compile_kernels.py --arch sm_80 --arch sm_90
"""

import argparse
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
    args = parser.parse_args()
    archs = args.arch or ["sm_80", "sm_90"]
    src = ROOT / "cuda_src"
    missing = sorted(p.name for p in src.glob("*.cu") if p.name not in _compile.INSTANCES)
    if missing:
        sys.exit(f"cuda_src has sources the loader does not know: {missing}")
    failed, spills = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, instances in _compile.INSTANCES.items():
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
    if failed:
        sys.exit(f"compile failed: {failed}")
    if spills:
        print("spills:\n  " + "\n  ".join(spills))
        if not args.allow_spills:
            sys.exit("register spills found (pass --allow-spills to accept)")
    print(f"compiled {sum(len(v) for v in _compile.INSTANCES.values())} kernels for {archs} "
          f"(and {sorted(set(a for a, _ in _compile.ARCH_SOURCES.values()))} for "
          f"{sorted(_compile.ARCH_SOURCES)}): OK")


_SHOWN = ("Compiling entry", "Used", "spill", "error")

#: Spill stores (bytes) accepted per kernel, by a part of its (mangled) name: only where a
#: register cap was measured to pay despite them. twell_spmm_rows carries __maxnreg__(80)
#: (cuda_src/spmm.cu): 25 warps per SM instead of 16 made it 1.21x faster at 99% on an H200
#: with 36 bytes of bf16 spill stores (sm_90; 24-26 on sm_80). A new spill anywhere else, or
#: a larger one here, still fails.
ACCEPTED_SPILL_STORES = {"twell_spmm_rows": 64}


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


if __name__ == "__main__":
    main()
