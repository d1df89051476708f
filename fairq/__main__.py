"""``python -m fairq`` is the ``fairq`` command."""

import sys

from fairq.cli import main

if __name__ == "__main__":
    sys.exit(main())
