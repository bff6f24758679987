"""Lives of an aggregator on one directory, fed by agents that resend after their last ack.

A "crash" drops the ``Aggregator``, its job table, store buffer and ledger without ``close`` (the
state a kill -9 leaves: only what is on disk); the next ``life`` is built on the same directory.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from aggregator.jobs import JobTable
from aggregator.ledger import Ledger
from aggregator.service import Aggregator
from aggregator.store import Store
from aggregator.wal import Wal
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.fake_clock import FakeClock
from tests.support.summaries import NS, summary


class FakeAgent:
    """The agent's side of ``agent/delivery.py``: numbered summaries, resend after the last ack received."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.incarnation = f"inc-{name}"
        self.buffer: list[pb.StepSummary] = []
        self.acked = 0

    def produce(self, summaries: list[pb.StepSummary]) -> None:
        self.buffer += summaries

    def deliver(self, core: Aggregator, batch: int = 3, lose_last_ack: bool = False) -> None:
        """Send everything after the last ack in batches; the last ack may be lost in a crash."""
        seq = self.acked + 1
        while seq <= len(self.buffer):
            seqs = list(range(seq, min(seq + batch, len(self.buffer) + 1)))
            acked = core.deliver(apb.SummaryBatch(agent=self.name, incarnation=self.incarnation, seq=seqs,
                                                  summaries=[self.buffer[s - 1] for s in seqs]))
            seq = seqs[-1] + 1
            if not (lose_last_ack and seq > len(self.buffer)):
                self.acked = acked

    def reconnect(self, core: Aggregator) -> None:
        """A new stream's handshake tells what the (new) aggregator holds."""
        self.acked = max(self.acked, core.deliver(apb.SummaryBatch(agent=self.name, incarnation=self.incarnation)))


def life(root: Path, clock: FakeClock[int], segment_bytes: int = 64 << 20, recover: bool = True) -> Aggregator:
    """An aggregator storing under ``root`` with its write-ahead log in ``root/_wal``, recovered from it.

    On ``clock`` (ns), jobs discover ranks for 1.5 s and give up on a step missing ranks after
    30 s; the store writes every 35 rows (its hourly timer never fires in a test) and the log
    fsyncs as soon as records are pending; a log segment rotates at ``segment_bytes``.
    """
    core = Aggregator(Ledger(), JobTable(step_timeout_s=30.0, join_s=1.5),
                      Store(root, flush_rows=35, flush_interval_s=3600.0), clock=clock,
                      wal=Wal(root / "_wal", commit_interval_s=0.0, segment_bytes=segment_bytes))
    if recover:
        core.recover()
    return core


def run_steps(core: Aggregator, clock: FakeClock[int], agents: list[FakeAgent], steps: range,
              nodes: tuple[int, ...] = (0, 1), lose_ack: int | None = None) -> None:
    """Job "j": ranks 0-3 on agent 0, 4-7 on agent 1; job "k": ranks 0-1 on agent 0; each step delivered.

    The receive clock advances one second per step, so jobs pass their 1.5 s join period.
    """
    for step in steps:
        clock.now += NS
        for n in nodes:
            agents[n].produce([summary("j", r, step) for r in range(4 * n, 4 * n + 4)])
            if n == 0:
                agents[0].produce([summary("k", r, step) for r in range(2)])
            agents[n].deliver(core, lose_last_ack=n == lose_ack)


def stored(root: Path) -> pd.DataFrame:
    """Every row of the step store under ``root``, with ``job`` as a plain string column."""
    frame = pd.read_parquet(root)
    frame["job"] = frame["job"].astype(str)
    return frame
