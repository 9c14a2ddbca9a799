"""``python -m torchair ...``: the ``torchair`` command (see :mod:`torchair.cli`)."""
import sys

from torchair.cli import main

if __name__ == "__main__":
    sys.exit(main())
