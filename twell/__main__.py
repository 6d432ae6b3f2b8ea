"""``python -m twell`` and the ``twell`` console command (see :mod:`twell._cli`)."""

import sys

from . import _cli


def main(argv=None):
    """Run the command line and return its exit status.

    The console entry point (``twell = "twell.__main__:main"``) hands the
    return value to ``sys.exit``.
    """
    return _cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
