"""The dense pack before and after the lean pack_pairs_staged (twenty-first session), in one
process: the working tree's pack.cu against c22b014's (the tree of ``scratch/old``, whose
pack.cu is v4's; compiled beside it), both called through the working tree's launcher.

Since the twenty-second session this runs ``results/2026-12-04-h200-v/pack_ab.py`` (the same
bits and times, printed as "old" and "new", with the old kernels kept apart from the
launcher's kernel cache) with ``scratch/old/cuda_src`` as the old tree; the copy that ran in
call 4 is in git at 9560815.
Usage (repository root):
    PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-u/pack_ab.py
"""
import runpy
import sys

sys.argv = [sys.argv[0], "scratch/old/cuda_src"]
runpy.run_path("benchmarks/results/2026-12-04-h200-v/pack_ab.py", run_name="__main__")
