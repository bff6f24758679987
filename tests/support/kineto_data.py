"""Where the real reference traces live: ``shared/data/kineto`` beside the repository (as CI lays it out)."""
from __future__ import annotations

from pathlib import Path

import pytest

# tests/support/kineto_data.py -> the repository -> the folder that holds it and shared/.
KINETO_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "kineto"

# Tests on the real traces skip, with this reason, only where shared/ is not beside the clone.
requires_kineto = pytest.mark.skipif(
    not KINETO_DIR.is_dir(), reason=f"reference traces not found at {KINETO_DIR} (shared/ beside the repository)"
)
