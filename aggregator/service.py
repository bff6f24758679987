"""The aggregator's state behind its gRPC and Prometheus faces: ledger, job table, store, recent steps.

Servicers and collectors only decode and encode; ``Aggregator`` does the work under one lock,
because ``JobTable`` is single-threaded and every agent's ``Deliver`` stream runs on its own
gRPC worker thread.

Algorithm of ``Aggregator.deliver`` (one ``SummaryBatch``):

1. ``ledger.accept(agent, incarnation, seqs, lost_total)`` says which of the batch's summaries
   are new (a resent or duplicated sequence number is not) and the acknowledged number.
2. The new summaries go to ``JobTable.add`` at the aggregator's receive time.
3. The rows it finalized go to the store; each finalized step becomes a ``chopper.v1.JobStep`` in
   the job's bounded deque of recent steps (``QuerySteps``).
4. The acknowledged number is returned for the ``DeliveryAck``.

``tick`` (every second from the daemon) finalizes timed-out steps and flushes the store on time;
``close`` finalizes every open step and flushes the store (shutdown).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from aggregator.jobs import Finalized, JobTable
from aggregator.store import Store
from chopper.proto.chopper.v1 import aggregator_pb2 as apb

_RANK_FIELDS = ("step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s",
                "idle_s", "mfu", "mean_gfx_clock_mhz", "max_temp_c")


class LedgerLike(Protocol):
    """The delivery ledger's interface (``aggregator.ledger.Ledger``)."""

    def accept(self, agent: str, incarnation: str, seqs: list[int], lost_total: int) -> tuple[list[int], int]: ...

    def stats(self) -> dict[str, int]: ...


class Aggregator:
    """Ledger, job table, optional store and recent steps, behind one lock.

    Args:
        ledger: Dedupes deliveries and says what to acknowledge.
        jobs: The job-level view.
        store: Parquet store of finalized rows; None keeps no rows.
        recent_steps_per_job: Finalized steps kept per job for ``QuerySteps``.
        clock: Receive time, ns since the epoch; injected in tests.
    """

    def __init__(
        self,
        ledger: LedgerLike,
        jobs: JobTable,
        store: Store | None = None,
        recent_steps_per_job: int = 16,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.ledger = ledger
        self.jobs = jobs
        self.store = store
        self.recent_steps_per_job = recent_steps_per_job
        self.clock = clock
        self.lock = threading.Lock()
        self.recent: dict[str, deque[apb.JobStep]] = {}
        self.undecodable: dict[str, int] = {}
        self.invalid_batches_total = 0
        self.delivery_streams = 0

    def deliver(self, batch: apb.SummaryBatch) -> int:
        """Take in one batch (module docstring); returns the sequence number to acknowledge."""
        with self.lock:
            new, acked = self.ledger.accept(batch.agent, batch.incarnation, list(batch.seq), batch.lost_total)
            summaries = batch.summaries
            self._take(self.jobs.add([summaries[i] for i in new], self.clock()))
            return acked

    def tick(self) -> None:
        """Finalize timed-out steps, forget silent jobs, flush the store when due."""
        with self.lock:
            self._take(self.jobs.expire(self.clock()))
            if self.store is not None:
                self.store.maybe_flush()

    def close(self) -> None:
        """Finalize every open step and write the store (shutdown)."""
        with self.lock:
            self._take(self.jobs.close(self.clock()))
            if self.store is not None:
                self.store.close()

    def query(self, job: str, last: int) -> list[apb.JobStep]:
        """The last ``last`` finalized steps of ``job`` (all kept when 0), oldest first."""
        with self.lock:
            kept = list(self.recent.get(job, ()))
        return kept[-last:] if last else kept

    def count(self, table: dict[str, int], key: str, delta: int = 1) -> None:
        """Thread-safe increment of a counter table."""
        with self.lock:
            table[key] = table.get(key, 0) + delta

    def _take(self, done: Finalized) -> None:
        if len(done.rows) and self.store is not None:
            self.store.append(done.rows)
        for step in job_steps(done):
            recent = self.recent.get(step.job)
            if recent is None:
                recent = self.recent[step.job] = deque(maxlen=self.recent_steps_per_job)
            recent.append(step)
        # Recent steps of forgotten jobs go with them.
        if len(self.recent) > len(self.jobs.jobs):
            for name in [n for n in self.recent if n not in self.jobs.jobs]:
                del self.recent[name]


def job_steps(done: Finalized) -> list[apb.JobStep]:
    """``chopper.v1.JobStep`` of every step in ``done``, with its ranks after the split."""
    if not done.steps:
        return []
    rows = done.rows
    columns = {c: rows[c].to_numpy(dtype=np.float64) for c in _RANK_FIELDS}
    ranks = rows["rank"].to_numpy(dtype=np.int64)
    gpus = rows["gpu"].to_numpy(dtype=np.int64)
    nodes = rows["node"].to_numpy()
    flags = rows["flags"].to_numpy()
    out = []
    for s in done.steps:
        msg = apb.JobStep(
            job=s.job, step=s.step, step_time_s=s.job_step_time_s, complete=s.complete,
            ranks_reported=s.ranks_reported, ranks_expected=s.ranks_expected, slowest_rank=s.slowest_rank,
            straggler_score=s.straggler_score, slowest_cause=s.slowest_cause,
        )
        msg.ranks.extend(
            apb.JobStepRank(rank=int(ranks[i]), node=str(nodes[i]), gpu=int(gpus[i]), flags=list(flags[i]),
                            **{c: float(columns[c][i]) for c in _RANK_FIELDS})
            for i in s.index
        )
        out.append(msg)
    return out

