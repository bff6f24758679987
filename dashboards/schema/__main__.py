"""``python -m dashboards.schema``: see ``dashboards/schema/tscheck.py``."""
from __future__ import annotations

import sys

from dashboards.schema.tscheck import main

if __name__ == "__main__":
    sys.exit(main())
