"""``python -m ultradict_ng``: the command line (see :mod:`ultradict_ng.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
