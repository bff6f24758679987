"""The aggregator's state behind its gRPC and Prometheus faces: ledger, job table, store, recent steps.

Servicers and collectors only decode and encode; ``Aggregator`` does the work under one lock,
because ``JobTable`` is single-threaded and every agent's ``Deliver`` stream runs on its own
gRPC worker thread.

Algorithm of ``Aggregator.deliver`` (one ``SummaryBatch``):

1. ``ledger.accept(agent, incarnation, seqs, lost_total)`` says which of the batch's summaries
   are new (a resent or duplicated sequence number is not) and the acknowledged number.
2. The new summaries go to ``JobTable.add`` at the aggregator's receive time. It drops copies of
   a ``(job, rank, step)`` already taken in under another incarnation or agent name (its step
   index), and returns the copies with other content set aside.
3. The rows it finalized go to the store, the copies set aside to a second store in
   ``store_dir/_conflicts`` (same layout, skipped by the store's readers); each finalized step
   becomes a ``chopper.v1.JobStep`` in the job's bounded deque of recent steps (``QuerySteps``).
4. The acknowledged number is returned for the ``DeliveryAck``.

Durability (with a write-ahead log, ``aggregator/wal.py``; the daemon has one whenever it has a
store). Between steps 1 and 2 the new summaries are appended to the log as one record, and each
gets the id ``summary_id(lsn, index)`` that its row carries to the store (``wal_id``). After
step 3, outside the lock, ``deliver`` waits until the log has fsynced everything appended so far
(one group commit serves every stream), so an acknowledgement always means "on disk": a
handshake too waits, because the number it acknowledges may belong to a record still pending.
Without a log, acknowledgements mean "in memory" and a crash loses open steps and unwritten rows.

Each batch's ``positions`` (where its agent's ranks are, not sequenced) replace those held in the
``PositionTable`` (``aggregator/positions.py``), which ``QuerySteps`` answers from and ``tick``
expires; they are never logged.

``tick`` (every second from the daemon) finalizes timed-out steps and flushes the store on time;
then it rotates the log when the active segment is big or old, and deletes the segments whose
every summary is finalized and written to the store (the oldest id still in an open step or the
store's buffer bounds what is kept). ``close`` finalizes every open step, flushes the store, and
leaves only a fresh segment holding the ledger snapshot.

Recovery (``recover``, before serving):

0. The step index is rebuilt from the keys of the newest store files (``store.stored_keys``), so
   a copy of a step stored before the restart is still recognised, whoever sends it.
1. The ``FILES`` records name the store files that flushes wrote (or were about to write) while
   the remaining segments were live; the ``wal_id`` column of those that exist is the set of
   logged summaries already stored.
2. The records are replayed in order: ``LEDGER`` records and the sequence numbers of ``BATCH``
   records rebuild the ledger (so the agents' resends are recognised as duplicates), and each
   ``BATCH`` summary not already stored joins the job table at the replay time, with its id.
3. The log starts a new segment headed by the ledger snapshot; the replayed segments are deleted
   by ``tick`` once their summaries are stored again.

What the log's directory holds never stops the start (``aggregator/wal.py``, steps 5 and 6):
unreadable entries are set aside, damaged records skipped and counted, torn tails told apart
from corruption. A summary in a record lost to corruption was acknowledged and is lost, counted;
should a lost ``FILES`` or ``LEDGER`` record make replay or the agents bring back a summary
already stored, the step index drops it as a copy.

Since a flush writes every row of a finalized step at once, a step is either wholly stored
(skipped) or wholly replayed. What restarts from empty: steps finalized before the crash are not
remembered, so a summary arriving for one opens it again instead of being flagged late.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError

from aggregator.jobs import NS, Finalized, JobTable
from aggregator.positions import PositionTable
from aggregator.stepindex import StepIndex
from aggregator.store import ASIDE_DIR, Store, stored_keys
from aggregator.wal import BATCH, FILES, ID_BITS, LEDGER, Record, Wal, WalError, summary_id
from chopper.daemon.access import Refusals
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb

log = logging.getLogger(__name__)

_RANK_FIELDS = ("step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s",
                "idle_s", "mfu", "mean_gfx_clock_mhz", "max_temp_c")


class LedgerLike(Protocol):
    """The delivery ledger's interface (``aggregator.ledger.Ledger``)."""

    def accept(self, agent: str, incarnation: str, seqs: list[int], lost_total: int) -> tuple[list[int], int]: ...

    def stats(self) -> dict[str, int]: ...

    def restore(self, agent: str, incarnation: str, max_seq: int, lost_total: int) -> None: ...

    def snapshot(self) -> list[tuple[str, str, int, int]]: ...


class Aggregator:
    """Ledger, job table, optional store and recent steps, behind one lock.

    Args:
        ledger: Dedupes deliveries and says what to acknowledge.
        jobs: The job-level view.
        store: Parquet store of finalized rows; None keeps no rows (and copies set aside are only
            counted).
        recent_steps_per_job: Finalized steps kept per job for ``QuerySteps``.
        clock: Receive time, ns since the epoch; injected in tests.
        wal: Write-ahead log (module docstring, durability); None: acknowledgements are not
            durable. With one, call ``recover`` before ``deliver``.
        positions: Where each rank is (``aggregator.positions``); None: a table that forgets a
            position as ``jobs`` forgets a silent job (``job_expiry_s``).
    """

    def __init__(
        self,
        ledger: LedgerLike,
        jobs: JobTable,
        store: Store | None = None,
        recent_steps_per_job: int = 16,
        clock: Callable[[], int] = time.time_ns,
        wal: Wal | None = None,
        positions: PositionTable | None = None,
    ) -> None:
        self.ledger = ledger
        self.positions = positions if positions is not None else PositionTable(jobs.job_expiry_ns / NS)
        self.jobs = jobs
        self.store = store
        self.recent_steps_per_job = recent_steps_per_job
        self.clock = clock
        self.lock = threading.Lock()
        self.recent: dict[str, deque[apb.JobStep]] = {}
        self.undecodable: dict[str, int] = {}
        # Calls and connections refused by the access checks (chopper.daemon.access), for the metrics.
        self.refusals = Refusals()
        self.invalid_batches_total = 0
        self.delivery_streams = 0
        self.wal = wal
        self.aside = None if store is None else Store(
            store.root / ASIDE_DIR, store.flush_rows, store.flush_interval_s, store.clock, store.max_buffered_rows)
        self.index_unreadable_files_total = 0
        if wal is not None and store is not None and self.aside is not None:
            store.durable = self.aside.durable = True
            store.before_write = self._log_files
            self.aside.before_write = lambda paths: self._log_files([f"{ASIDE_DIR}/{p}" for p in paths])

    def deliver(self, batch: apb.SummaryBatch) -> int:
        """Take in one batch (module docstring); returns the sequence number to acknowledge.

        Raises:
            WalError: The write-ahead log cannot make the batch durable (it is failing, and then the
                batch is not taken in at all): do not acknowledge.
        """
        wal = self.wal
        if wal is not None and wal.failing:
            # Taking the batch in would let the ledger run ahead of the log, and the pending records
            # grow with the outage: refuse, and the agent keeps it in its buffer and resends.
            raise WalError("write-ahead log is failing (disk full or I/O error); retrying, resend later")
        with self.lock:
            new, acked = self.ledger.accept(batch.agent, batch.incarnation, list(batch.seq), batch.lost_total)
            summaries = batch.summaries
            ids = None
            if wal is not None:
                if new:
                    record = batch if len(new) == len(batch.seq) else apb.SummaryBatch(
                        agent=batch.agent, incarnation=batch.incarnation, seq=[batch.seq[i] for i in new],
                        summaries=[summaries[i] for i in new], lost_total=batch.lost_total)
                    lsn = wal.append(BATCH, record.SerializeToString())
                    ids = [summary_id(lsn, i) for i in range(len(new))]
                # Everything the ledger knows may rest on records still pending: wait for all of them.
                upto = wal.appended_lsn
            now_ns = self.clock()
            self._take(self.jobs.add([summaries[i] for i in new], now_ns, ids))
            if batch.positions:  # not sequenced, never logged: the newest wins (aggregator/positions.py)
                self.positions.update(batch.agent, batch.positions, now_ns)
        if wal is not None:
            wal.wait(upto)
        return acked

    def recover(self) -> dict[str, int]:
        """Rebuild the ledger and open steps from the write-ahead log and start it (module docstring).

        Returns:
            ``records``, ``summaries`` (replayed into the job table), ``stored`` (skipped: already
            in the store), ``torn`` (torn tails), ``corrupt`` (acknowledged records lost to
            damage), ``set_aside`` (entries of the log directory moved to its quarantine),
            ``unreadable`` (records whose checksum held but whose payload did not decode, or that
            list an unreadable store file: skipped and logged, so that one bad record cannot keep
            the aggregator from starting) and ``index_keys`` (keys the step index loaded).
        """
        if self.store is not None:
            self._rebuild_index(self.store.root)
        wal = self.wal
        if wal is None:
            return {}
        stored: set[int] = set()
        unreadable: set[int] = set()  # lsns of records whose payload did not decode, each logged once
        if self.store is not None:
            root = self.store.root
            for record in wal.replay():
                if record.kind == FILES:
                    stored.update(_stored_ids(root, record, unreadable))
        records = summaries = skipped = 0
        with self.lock:
            # The ledger first, so that the new segment starts with its snapshot before replayed
            # steps can finalize and flush (a flush logs its files in the new segment).
            for record in wal.replay():
                if record.kind in (LEDGER, BATCH):
                    msg = _summary_batch(record, unreadable)
                    if msg is not None and (msg.seq or record.kind == LEDGER):
                        self.ledger.restore(msg.agent, msg.incarnation, max(msg.seq, default=0), msg.lost_total)
            wal.start(self._ledger_head())
            now = self.clock()
            for record in wal.replay():
                records += 1
                if record.kind != BATCH:
                    continue
                msg = _summary_batch(record, unreadable)
                if msg is None:
                    continue
                keep = [i for i in range(len(msg.summaries)) if summary_id(record.lsn, i) not in stored]
                skipped += len(msg.summaries) - len(keep)
                summaries += len(keep)
                if keep:
                    self._take(self.jobs.add([msg.summaries[i] for i in keep], now,
                                             [summary_id(record.lsn, i) for i in keep]))
        stats = wal.stats()
        out = {"records": records, "summaries": summaries, "stored": skipped,
               "torn": int(stats["torn_records_total"]), "corrupt": int(stats["corrupt_records_total"]),
               "set_aside": sum(wal.set_aside.values()), "unreadable": len(unreadable),
               "index_keys": self.jobs.index.keys}
        log.info("event=wal_recovered directory=%s %s", wal.directory, " ".join(f"{k}={v}" for k, v in out.items()))
        return out

    def _rebuild_index(self, root: Path) -> None:
        """Load the newest stored keys into the step index, oldest first (its eviction order)."""
        index: StepIndex = self.jobs.index
        found = stored_keys(root, index.max_keys)
        self.index_unreadable_files_total += found.unreadable
        for job, steps, ranks, digests in reversed(found.loaded):
            order = np.argsort(steps, kind="stable")
            steps, ranks, digests = steps[order], ranks[order], digests[order]
            bounds = np.flatnonzero(np.diff(steps)) + 1
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(steps)], strict=True):
                index.add(job, int(steps[lo]), ranks[lo:hi], digests[lo:hi])
        for job, step in found.beyond.items():
            index.forget_below(job, step)

    def tick(self) -> None:
        """Finalize timed-out steps, forget silent jobs, flush the store when due."""
        with self.lock:
            now_ns = self.clock()
            self._take(self.jobs.expire(now_ns))
            self.positions.expire(now_ns)
            for store in self._stores():
                store.maybe_flush()
            if self.wal is not None:
                # Truncate first: a segment closes only once the flusher has moved past the rotation,
                # so truncating right after rotating raced the flusher. This way a tick deletes what the
                # previous tick's rotation closed (every acknowledgement since waited on records behind it).
                self.wal.truncate(self._oldest_needed_lsn())
                if self.wal.rotate_due():
                    self.wal.rotate(self._ledger_head())

    def close(self) -> None:
        """Finalize every open step and write the store (shutdown); the log keeps only the ledger."""
        with self.lock:
            self._take(self.jobs.close(self.clock()))
            written = all([store.close() for store in self._stores()])  # a list: every store closes
            if self.wal is not None:
                if written:
                    self.wal.rotate(self._ledger_head())
                    # The old segments close once the flusher has moved to the new one.
                    self.wal.sync(self.wal.appended_lsn)
                    self.wal.truncate(self._oldest_needed_lsn())
                self.wal.close()

    def _ledger_head(self) -> list[tuple[int, bytes]]:
        """The ledger snapshot as ``LEDGER`` records (head of every segment)."""
        return [(LEDGER, apb.SummaryBatch(agent=a, incarnation=i, seq=[m], lost_total=lost).SerializeToString())
                for a, i, m, lost in self.ledger.snapshot()]

    def _oldest_needed_lsn(self) -> int:
        """The lowest lsn whose summaries are not yet in the store: open steps and unwritten rows."""
        assert self.wal is not None
        found = [i for i in (self.jobs.oldest_open_id(), *(s.oldest_buffered_id() for s in self._stores()))
                 if i is not None]
        return min(found) >> ID_BITS if found else self.wal.appended_lsn + 1

    def _stores(self) -> list[Store]:
        """The store and the store of copies set aside (none without a store)."""
        return [s for s in (self.store, self.aside) if s is not None]

    def _log_files(self, paths: list[str]) -> None:
        """``Store.before_write``: make the names of the files about to be written durable first."""
        assert self.wal is not None
        self.wal.sync(self.wal.append(FILES, "\n".join(paths).encode()))

    def query(self, job: str, last: int) -> list[apb.JobStep]:
        """The last ``last`` finalized steps of ``job`` (all kept when 0), oldest first."""
        with self.lock:
            kept = list(self.recent.get(job, ()))
        return kept[-last:] if last else kept

    def where(self, job: str) -> list[pb.RankPosition]:
        """Where each rank of ``job`` is, as its agent last reported it, by rank."""
        with self.lock:
            return self.positions.query(job)

    def count(self, table: dict[str, int], key: str, delta: int = 1) -> None:
        """Thread-safe increment of a counter table."""
        with self.lock:
            table[key] = table.get(key, 0) + delta

    def _take(self, done: Finalized) -> None:
        if len(done.rows) and self.store is not None:
            self.store.append(done.rows)
        if done.aside is not None and self.aside is not None:
            self.aside.append(done.aside)
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



def _summary_batch(record: Record, unreadable: set[int]) -> apb.SummaryBatch | None:
    """The record's ``SummaryBatch``, or None (logged once per record) when its payload does not decode."""
    try:
        return apb.SummaryBatch.FromString(record.payload)
    except DecodeError as exc:
        if record.lsn not in unreadable:
            unreadable.add(record.lsn)
            log.warning("event=wal_record_unreadable lsn=%d kind=%d error=%r note='skipped; its summaries are lost'",
                        record.lsn, record.kind, str(exc))
        return None


def _stored_ids(root: Path, record: Record, unreadable: set[int]) -> set[int]:
    """Summary ids held by the store files a FILES record lists; unreadable ones are skipped and logged.

    A listed file that cannot be read contributes no ids, so its summaries are replayed from the
    log and written again rather than lost.
    """
    ids: set[int] = set()
    try:
        listed = record.payload.decode().splitlines()
    except UnicodeDecodeError as exc:
        unreadable.add(record.lsn)
        log.warning("event=wal_record_unreadable lsn=%d kind=files error=%r", record.lsn, str(exc))
        return ids
    for rel in listed:
        path = root / rel
        if not path.exists():
            continue
        try:
            column = pq.read_table(path, columns=["wal_id"]).column("wal_id").to_numpy()
        except (OSError, ValueError, pa.ArrowException) as exc:
            unreadable.add(record.lsn)
            log.warning("event=store_file_unreadable path=%s error=%r note='its summaries are replayed from the log'",
                        path, str(exc))
            continue
        ids.update(int(i) for i in column if i >= 0)
    return ids
