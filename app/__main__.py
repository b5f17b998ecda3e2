"""`python -m app ...`: the command-line interface (see app/cli.py)."""

from __future__ import annotations

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
