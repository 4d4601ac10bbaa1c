"""``python -m relax`` is the ``relax`` command."""

import sys

from relax.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
