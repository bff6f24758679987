"""The agent's reader of NCCL/RCCL Inspector dump directories (``watch``); the format is ``chopper.inspector``."""
from __future__ import annotations

from agent.inspector.watch import DumpDirWatcher, WatcherHealth

__all__ = ["DumpDirWatcher", "WatcherHealth"]
