"""``python -m rmsref``: the ``rmsref`` command, for environments without the console script."""

import sys

from rmsref.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m rmsref"))
