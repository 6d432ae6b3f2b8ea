"""How soon each global load's register is read, in the SASS of one kernel instance (no GPU).

A kernel bound by the latency of its loads gains only if a load's result is read late: a
reader a few instructions after the load stalls the warp there. This compiles one instance
with nvcc (twell's options, ``-I cuda_src``), disassembles it with cuobjdump, and prints every
global load (LDG) with the first later instruction, in program order, that reads its
destination register, and the branches in between (a branch may leave before the reader:
look at the listing around it, ``--context``).

Usage:
    python benchmarks/sass_loads.py "twell_spmm_rows<float, 4, 16, 1, 4>" \\
        [--src cuda_src] [--file spmm.cu] [--arch sm_90] [-D NAME=VALUE] [--match U16]

cuobjdump comes with a CUDA toolkit, or from PyPI: ``pip install nvidia-cuda-cuobjdump``
(its binary lands in ``site-packages/nvidia/cu*/bin``, which is searched too). Program
order is not execution order: it is a first look, made to compare two versions of a loop.
"""

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from twell import _kernels  # noqa: E402

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LOAD = re.compile(r"^(@!?U?P\w+\s+)?(LDG\S*)\s+(R\d+)")


def cuobjdump():
    """The cuobjdump on PATH, else the one of the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    site = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    wheels = sorted(site.glob("cu*/bin/cuobjdump"))
    if not wheels:
        sys.exit("cuobjdump not found: install a CUDA toolkit or "
                 "'pip install nvidia-cuda-cuobjdump'")
    return str(wheels[-1])


def sass(instance, src, file, arch, defines):
    """[(address, instruction text)] of ``instance`` compiled from ``src / file``."""
    with tempfile.TemporaryDirectory() as tmp:
        unit = pathlib.Path(tmp) / "unit.cu"
        unit.write_text(f'#include "{(src / file).resolve()}"\n'
                        f"const void* const twell_sass_instance = (const void*)&{instance};\n")
        cubin = pathlib.Path(tmp) / "unit.cubin"
        subprocess.run(["nvcc", *_kernels.OPTIONS, f"-arch={arch}", "-cubin",
                        *[f"-D{d}" for d in defines], f"-I{src.resolve()}", "-o", str(cubin),
                        str(unit)], check=True, capture_output=True, text=True)
        text = subprocess.run([cuobjdump(), "-sass", str(cubin)], check=True,
                              capture_output=True, text=True).stdout
    return [(m.group(1), m.group(2)) for m in _INSN.finditer(text)]


def _width(opcode):
    """Registers a load or store moves: 4 for .128, 2 for .64, else 1."""
    return 4 if ".128" in opcode else 2 if ".64" in opcode else 1


def registers_read(insn):
    """The general registers ``insn`` reads: its sources (every operand of a store, the
    operands after the destination otherwise), pairs ``Rn.64`` as two, a store's value as
    wide as the store."""
    insn = re.sub(r"^@!?U?P\w+\s+", "", insn)
    opcode, _, rest = insn.partition(" ")
    operands = [o.strip() for o in rest.split(",")] if rest else []
    store = opcode.startswith(("ST", "RED", "ATOM"))
    out = set()
    for o in operands if store else operands[1:]:
        for m in re.finditer(r"\bR(\d+)(\.64)?", o):
            n = int(m.group(1))
            width = 2 if m.group(2) else (_width(opcode) if store and "[" not in o else 1)
            out.update(f"R{n + k}" for k in range(width))
    return out


def report(code, match, context):
    for i, (addr, insn) in enumerate(code):
        load = _LOAD.match(insn)
        if not load or (match and match not in insn):
            continue
        first = int(load.group(3)[1:])
        written = {f"R{first + k}" for k in range(_width(load.group(2)))}
        branches, reader = [], None
        for addr2, insn2 in code[i + 1:]:
            if written & registers_read(insn2):
                reader = (addr2, insn2)
                break
            if re.search(r"\bBRA\b|\bEXIT\b|\bRET\b", insn2):
                branches.append(addr2)
        gap = f"{int(reader[0], 16) - int(addr, 16)} bytes later: {reader[1]}" if reader \
            else "never read after it"
        print(f"{addr}  {insn}\n      first reader {gap}"
              + (f"\n      branches between: {', '.join(branches)}" if branches else ""))
        for a, t in code[i + 1:i + 1 + context]:
            print(f"        {a}  {t}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", help='e.g. "twell_spmm_rows<float, 4, 16, 1, 4>"')
    parser.add_argument("--src", type=pathlib.Path, default=ROOT / "cuda_src")
    parser.add_argument("--file", default="spmm.cu")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("-D", dest="defines", action="append", default=[])
    parser.add_argument("--match", default="", help="only loads whose text contains this")
    parser.add_argument("--context", type=int, default=0,
                        help="instructions shown after each load")
    args = parser.parse_args()
    code = sass(args.instance, args.src, args.file, args.arch, args.defines)
    print(f"{args.instance} ({args.arch}): {len(code)} instructions")
    report(code, args.match, args.context)


if __name__ == "__main__":
    main()
