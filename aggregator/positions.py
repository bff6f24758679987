"""Where each rank of every job is, as its agent last reported it: the aggregator's answer to "where does it hang".

Agents send their ranks' positions (``chopper.v1.RankPosition``, docs/HANGS.md) in
``SummaryBatch.positions`` about once a second, summaries or not (a hung job makes none). They
are not sequenced and never written to the log: the newest wins, and one lost costs a second.

Algorithm (``PositionTable.update``, one batch of one agent, received at ``now_ns``):

1. A position naming a job that ``chopper.identity.jobname`` refuses, or a negative rank, is
   rejected (counted in ``rejected_total``), the rest of the batch kept.
2. Each kept position replaces the one held for its ``(job, rank)``, whoever sent that.
3. A batch lists every rank its agent tracks for the jobs routed to this replica, so the ranks
   this agent reported before and not now are forgotten (the agent retired them).

Bounds: at most ``max_positions`` are held; a new ``(job, rank)`` beyond that evicts the one
updated longest ago (``evicted_total``). ``expire`` forgets positions not updated for
``expiry_s`` (the agent died or stopped delivering), as the job table forgets silent jobs.
Pure: no I/O, no threads, no clock of its own; the caller holds the aggregator's lock.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from chopper.identity.jobname import job_name_problem
from chopper.proto.chopper.v1 import agent_pb2 as pb

NS = 1_000_000_000
# Ten 10,000-GPU jobs' worth: one small message per rank.
MAX_POSITIONS = 100_000
Key = tuple[str, int]


@dataclass
class _Held:
    agent: str
    received_ns: int
    position: pb.RankPosition


class PositionTable:
    """The latest position of every ``(job, rank)`` (module docstring).

    Args:
        expiry_s: A position not updated this long is forgotten, s.
        max_positions: Positions held at most.
    """

    def __init__(self, expiry_s: float = 900.0, max_positions: int = MAX_POSITIONS) -> None:
        self.expiry_ns = int(expiry_s * NS)
        self.max_positions = max_positions
        self._held: OrderedDict[Key, _Held] = OrderedDict()  # least recently updated first
        self._by_job: dict[str, set[int]] = {}
        self._by_agent: dict[str, set[Key]] = {}
        self.rejected_total = 0
        self.evicted_total = 0
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._held)

    def update(self, agent: str, positions: Iterable[pb.RankPosition], now_ns: int) -> None:
        """Take in one agent's positions (module docstring, steps 1-3)."""
        reported: set[Key] = set()
        for p in positions:
            if p.rank < 0 or job_name_problem(p.job) is not None:
                self.rejected_total += 1
                continue
            key = (p.job, p.rank)
            reported.add(key)
            held = self._held.get(key)
            if held is not None and held.agent != agent:
                self._forget_sender(held.agent, key)
            self._held[key] = _Held(agent, now_ns, p)
            self._held.move_to_end(key)
            self._by_job.setdefault(p.job, set()).add(p.rank)
        for key in self._by_agent.get(agent, set()) - reported:
            self._drop(key)
        if reported:
            self._by_agent[agent] = reported
        else:
            self._by_agent.pop(agent, None)
        while len(self._held) > self.max_positions:
            self._drop(next(iter(self._held)))
            self.evicted_total += 1

    def expire(self, now_ns: int) -> int:
        """Forget positions not updated for ``expiry_s``; returns how many went."""
        gone = 0
        while self._held:
            key, held = next(iter(self._held.items()))
            if now_ns - held.received_ns < self.expiry_ns:
                break
            self._drop(key)
            gone += 1
        self.expired_total += gone
        return gone

    def query(self, job: str) -> list[pb.RankPosition]:
        """The positions held for ``job``, by rank."""
        return [self._held[(job, rank)].position for rank in sorted(self._by_job.get(job, ()))]

    def _drop(self, key: Key) -> None:
        held = self._held.pop(key)
        ranks = self._by_job[key[0]]
        ranks.discard(key[1])
        if not ranks:
            del self._by_job[key[0]]
        self._forget_sender(held.agent, key)

    def _forget_sender(self, agent: str, key: Key) -> None:
        keys = self._by_agent.get(agent)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_agent[agent]
