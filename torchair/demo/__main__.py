"""``python -m torchair.demo ...``: the same as ``torchair demo ...``."""
import sys

from torchair.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
