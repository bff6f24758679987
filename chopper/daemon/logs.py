"""Logging for Chopper's programs: stderr only, one ``key=value`` line per event, no log files."""
from __future__ import annotations

import logging
import sys


def configure(level: str = "info") -> None:
    """Send the root logger to stderr as ``ts=... level=... logger=... event=...`` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
