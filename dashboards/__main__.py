"""``python -m dashboards``: see ``dashboards/render.py``."""
from __future__ import annotations

import sys

from dashboards.render import main

if __name__ == "__main__":
    sys.exit(main())
