"""The marker client as client tests drive it: quick to flush and reconnect, and the invariant of its counters."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from chopper.client import Client

# Shutdown timeout where the test needs every marker delivered: shutdown returns as soon as the flush is
# done, so a generous one costs nothing and lets a starved machine finish it.
FLUSH_S = 30.0


def fast_client(sock: Path, **kw: Any) -> Client:
    """A started ``Client`` of job "j1", rank 3, GPU 1 for the agent on ``sock``: 10 ms flushes, 20–200 ms backoff.

    Keyword arguments replace these defaults or add to them.
    """
    defaults: dict[str, Any] = dict(
        job="j1", rank=3, gpu=1, agent=f"unix://{sock}", flush_interval_s=0.01,
        initial_backoff_s=0.02, max_backoff_s=0.2,
    )
    defaults.update(kw)
    return Client(**defaults)


def invariant_holds(s: dict) -> bool:
    """Whether ``Client.stats()`` ``s`` accounts for every queued marker: sent, or dropped for one reason."""
    return s["queued"] == s["sent"] + s["dropped_invalid"] + s["dropped_in_flight"] + s["dropped_at_shutdown"]
