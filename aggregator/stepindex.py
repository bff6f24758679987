"""Which ``(job, rank, step)`` keys the aggregator has taken in, with a digest of each one's content.

A step of a rank is stored once, whoever delivers it: the delivery ledger (``aggregator/ledger.py``)
recognises resends of one agent incarnation, and this index recognises every other copy (a new
incarnation re-summarizing the same markers, a forgotten incarnation, a second agent name, a
replayed log). ``JobTable`` asks it about every summary whose step is not open.

Algorithm.

1. A finalized step is added whole: its ranks (sorted) and their digests
   (``digest``: 64-bit BLAKE2b of the summary's serialization) as two numpy arrays,
   12 bytes a key. A late rank of a step already held is merged into it.
2. ``lookup(job, step, rank)`` answers with the held digest, or ``NEW_RANK`` (the step is held
   without that rank: a late summary), ``NEW_STEP`` (never finalized), or ``BEYOND`` (the step is
   at or below the job's *horizon*, the highest step of that job evicted, and not held: it may
   have been stored, and nothing can tell).
3. Memory is bounded: beyond ``max_keys`` keys or ``max_steps`` steps, the steps finalized
   longest ago go first, each raising its job's horizon; horizons are kept for the
   ``max_jobs`` jobs that were evicted from most recently (a job whose horizon is forgotten has
   had nothing held for longer than anything held now).
4. The index survives a restart: ``Aggregator.recover`` loads the keys of the newest store files
   (``Store.stored_keys``) and raises the horizons to the highest step of the files past the
   budget, before the write-ahead log is replayed.

Pure: no I/O, not thread-safe (the aggregator's lock serializes it).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from enum import Enum

import numpy as np
import numpy.typing as npt

from chopper.proto.chopper.v1 import agent_pb2 as pb

MAX_KEYS = 4_000_000
MAX_STEPS = 200_000
MAX_JOBS = 100_000
# The digest of rows stored before the store had a digest column: any copy matches it.
UNKNOWN_DIGEST = 0

Ints = npt.NDArray[np.int64]


class Seen(Enum):
    """What ``StepIndex.lookup`` says about a key it holds no digest for."""

    NEW_STEP = "new_step"
    NEW_RANK = "new_rank"
    BEYOND = "beyond"


def digest(s: pb.StepSummary) -> int:
    """The content digest of a summary: a signed 64-bit BLAKE2b of its serialization.

    The contract has no map fields, so equal summaries serialize to equal bytes without the
    (twice as slow) deterministic mode. Never ``UNKNOWN_DIGEST`` (0), which stands for rows stored
    without one.
    """
    d = int.from_bytes(hashlib.blake2b(s.SerializeToString(), digest_size=8).digest(), "little", signed=True)
    return d or 1


class StepIndex:
    """Bounded index of the keys taken in (module docstring).

    Args:
        max_keys: Keys (rank-steps) held at most.
        max_steps: Steps held at most (each costs about 300 bytes beyond its keys).
        max_jobs: Jobs whose horizon is remembered at most.
    """

    def __init__(self, max_keys: int = MAX_KEYS, max_steps: int = MAX_STEPS, max_jobs: int = MAX_JOBS) -> None:
        if min(max_keys, max_steps, max_jobs) < 1:
            raise ValueError("a step index must hold at least one key, step and job")
        self.max_keys = max_keys
        self.max_steps = max_steps
        self.max_jobs = max_jobs
        # (job, step) -> (sorted ranks, their digests), oldest finalized first.
        self._steps: OrderedDict[tuple[str, int], tuple[Ints, Ints]] = OrderedDict()
        self._horizon: OrderedDict[str, int] = OrderedDict()
        self.keys = 0
        self.evicted_steps_total = 0

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, job: str, step: int, ranks: Ints, digests: Ints) -> None:
        """Hold ``ranks`` of ``(job, step)`` with their digests (merged into what is held of it)."""
        key = (job, step)
        held = self._steps.get(key)
        if held is not None:
            keep = ~np.isin(held[0], ranks)
            ranks = np.concatenate([held[0][keep], ranks])
            digests = np.concatenate([held[1][keep], digests])
            self.keys -= len(held[0])
        order = np.argsort(ranks, kind="stable")
        self._steps[key] = (np.asarray(ranks, dtype=np.int64)[order], np.asarray(digests, dtype=np.int64)[order])
        self.keys += len(ranks)
        self._evict()

    def lookup(self, job: str, step: int, rank: int) -> int | Seen:
        """The digest held for the key, or what is known of it (module step 2)."""
        held = self._steps.get((job, step))
        if held is None:
            return Seen.BEYOND if step <= self._horizon.get(job, -1) else Seen.NEW_STEP
        ranks, digests = held
        i = int(np.searchsorted(ranks, rank))
        if i < len(ranks) and ranks[i] == rank:
            return int(digests[i])
        return Seen.NEW_RANK

    def forget_below(self, job: str, step: int) -> None:
        """Raise ``job``'s horizon to ``step``: its steps up to there may be stored but are not held."""
        if step > self._horizon.get(job, -1):
            self._horizon[job] = step
        self._horizon.move_to_end(job)
        while len(self._horizon) > self.max_jobs:
            self._horizon.popitem(last=False)

    def _evict(self) -> None:
        while self._steps and (self.keys > self.max_keys or len(self._steps) > self.max_steps):
            (job, step), (ranks, _) = self._steps.popitem(last=False)
            self.keys -= len(ranks)
            self.evicted_steps_total += 1
            self.forget_below(job, step)
