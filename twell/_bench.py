"""``twell bench``: run the benchmark suite of a source checkout (``benchmarks/bench.py``).

The suite lives beside the package, not inside it (it needs a GPU, CuPy and
optionally PyTorch, and its results are committed under ``benchmarks/results``),
so this module only finds and runs it. The ``twell bench`` subcommand hands
its arguments to :func:`main`.
"""

import importlib.util
import pathlib
import sys

_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"


def main(argv=None):
    """Run ``benchmarks/bench.py`` with ``argv`` and return its exit status.

    Parameters
    ----------
    argv : list of str, optional
        The suite's arguments (see ``python benchmarks/bench.py --help``);
        default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 when the suite ran (missed targets included), 2 on a usage error or
        when no GPU is visible, 130 when interrupted.

    Raises
    ------
    FileNotFoundError
        When twell is installed without its source checkout: the suite is not
        part of the wheel.
    """
    if not _SCRIPT.is_file():
        raise FileNotFoundError(
            f"the benchmark suite is not installed with twell: it lives in benchmarks/bench.py "
            f"of a source checkout (looked for {_SCRIPT})"
        )
    name = "twell_benchmarks_bench"
    spec = importlib.util.spec_from_file_location(name, _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    try:
        return module.main(argv, prog="twell bench")
    except SystemExit as exc:  # argparse: --help and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
