"""`python -m toolreg demo`: a short live demonstration of the cancellation contract."""

from __future__ import annotations

import sys

from ._demo import main

if __name__ == "__main__":
    sys.exit(main())
