"""``python -m benchmarks.gpu``: see ``benchmarks.gpu.check``."""
from __future__ import annotations

import sys

from benchmarks.gpu.check import main

sys.exit(main())
