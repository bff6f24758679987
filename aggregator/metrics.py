"""Prometheus exposition of the aggregator: one custom collector that reads ``Aggregator`` at scrape time.

Per the house style, ``collect()`` builds fresh families from the catalog on every scrape, under
the aggregator's lock; there are no module-global gauges and the registry is passed in. Each
section of a scrape (``catalog.SECTIONS``; a job's series once per job) is built on its own: one
that raises loses its own series only, counted in
``chopper_aggregator_metrics_section_errors_total{section}`` and logged.

Per-rank series (``chopper_job_rank_*``) are bounded by ``rank_series_top_k``: for a job with
more ranks than k, only the k ranks with the largest decayed compute excess over their steps'
median (``RankState.excess_at``) are exported, and the last step's slowest rank beside them (its
``chopper_job_rank_slowest`` is what joins the slowest rank to its GPU); the others are counted in
``chopper_aggregator_rank_series_omitted``. 0 exports every rank.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import partial

from aggregator.catalog import BY_NAME, SECTIONS, SLOWEST_CAUSES
from aggregator.jobs import CAUSES, WINDOWS_S, JobState, RankState
from aggregator.service import Aggregator
from chopper import __version__
from chopper.daemon.auth import Reloaded
from chopper.daemon.exposition import Families, Sections
from chopper.daemon.labels import JOB_LABEL
from chopper.daemon.text_format import Family

WINDOW_NAMES = {60: "1m", 300: "5m"}

logger = logging.getLogger("aggregator.metrics")


def worst_ranks(job: JobState, k: int, now_ns: int) -> list[tuple[int, RankState]]:
    """The ranks of ``job`` to export: all when ``k`` is 0 or the job is small, else the k worst
    and the last step's slowest rank (k + 1 when it is not among them)."""
    ranks = sorted(job.ranks.items())
    if k <= 0 or len(ranks) <= k:
        return ranks
    ranks.sort(key=lambda item: (-item[1].excess_at(now_ns), item[0]))
    slowest = _slowest_rank(job)
    return sorted(ranks[:k] + [item for item in ranks[k:] if item[0] == slowest])


def _slowest_rank(job: JobState) -> int | None:
    return None if job.last_slowest is None else job.last_slowest[0]


class AggregatorCollector:
    """Exports job, rank and self metrics of one ``Aggregator``.

    Args:
        core: The aggregator.
        rank_series_top_k: Per-rank series for the k worst ranks of larger jobs; 0: all.
        tls: The TLS files the running gRPC server re-reads (``ServerTLS.files``); None: plaintext.
        clock: Monotonic seconds of the failure log's rate limit (injected in tests).
        job_label: The label the training job is exported under (the ``job_label`` setting).
    """

    def __init__(self, core: Aggregator, rank_series_top_k: int = 0, tls: Reloaded | None = None,
                 clock: Callable[[], float] = time.monotonic, job_label: str = JOB_LABEL) -> None:
        self.core = core
        self.job_label = job_label
        self.top_k = rank_series_top_k
        self.tls = tls
        self.sections = Sections(SECTIONS, logger, clock)

    def collect(self) -> Iterator[Family]:
        """The sections of ``catalog.SECTIONS``, each on its own (one that raises is counted and left out)."""
        fam = Families(BY_NAME, self.job_label)
        run = self.sections.run
        with self.core.lock:
            now = self.core.clock()
            omitted = 0
            for job in self.core.jobs.jobs.values():
                run(fam, "job", partial(self._job, job=job, now=now))
                omitted += run(fam, "ranks", partial(self._ranks, job=job, now=now)) or 0
            run(fam, "self", partial(self._self, omitted=omitted))
            run(fam, "store", self._store)
            run(fam, "wal", self._wal)
            run(fam, "tls", self._tls)
        self.sections.export(fam, "chopper_aggregator_metrics_section_errors_total")
        return iter(fam)

    def _job(self, fam: Families, job: JobState, now: int) -> None:
        j = (job.job,)
        for name, value in (
            ("chopper_job_steps_finalized_total", job.steps_finalized_total),
            ("chopper_job_steps_incomplete_total", job.incomplete_total),
            ("chopper_job_late_summaries_total", job.late_total),
            ("chopper_job_missing_rank_steps_total", job.missing_rank_steps_total),
            ("chopper_job_rank_set_changes_total", job.rank_set_changes_total),
            ("chopper_job_ranks", len(job.expected)),
            ("chopper_job_open_steps", len(job.open)),
        ):
            fam.add(name, j, float(value))
        if job.last_step >= 0:
            fam.add("chopper_job_last_step", j, float(job.last_step))
            fam.add("chopper_job_step_time_seconds", j, job.last_step_time_s)
            fam.add("chopper_job_straggler_score_ratio", j, job.last_straggler_score)
        if job.last_slowest is not None:
            rank, _, _, slow_cause = job.last_slowest
            fam.add("chopper_job_slowest_rank", j, float(rank))
            for cause in SLOWEST_CAUSES:
                fam.add("chopper_job_slowest_rank_cause", (job.job, cause), float(cause == slow_cause))
        for seconds in WINDOWS_S:
            w = (job.job, WINDOW_NAMES[seconds])
            fam.add("chopper_job_mfu_ratio", w, job.mfu(now, seconds))
            fam.add("chopper_job_energy_per_token_joules", w, job.energy_per_token(now, seconds))
        for i, cause in enumerate(CAUSES):
            fam.add("chopper_job_step_seconds_total", (job.job, cause), float(job.seconds[i]))
        fam.add("chopper_job_flops_step_seconds_total", j, job.flops_step_seconds)
        fam.add("chopper_job_energy_joules_total", j, job.energy_joules)
        fam.add("chopper_job_tokens_total", j, job.tokens)

    def _ranks(self, fam: Families, job: JobState, now: int) -> int:
        """The per-rank series of ``job``'s shown ranks (``worst_ranks``); how many ranks were left out."""
        ranks = worst_ranks(job, self.top_k, now)
        slowest = _slowest_rank(job)
        for rank, st in ranks:
            rl = (job.job, str(rank), st.node, str(st.gpu))
            for i, cause in enumerate(CAUSES):
                fam.add("chopper_job_rank_step_seconds_total", (*rl, cause), float(st.seconds[i]))
            fam.add("chopper_job_rank_step_time_seconds", rl, st.last_step_time_s)
            fam.add("chopper_job_rank_compute_excess_seconds", rl, st.excess_at(now))
            fam.add("chopper_job_rank_missing_steps_total", rl, float(st.missing_steps))
            if slowest is not None:
                fam.add("chopper_job_rank_slowest", rl, float(rank == slowest))
        return len(job.ranks) - len(ranks)

    def _self(self, fam: Families, omitted: int) -> None:
        core = self.core
        fam.add("chopper_aggregator_info", (__version__,), 1.0)
        stats = core.ledger.stats()
        for name, key in (
            ("chopper_aggregator_summaries_received_total", "received_total"),
            ("chopper_aggregator_summaries_duplicate_total", "duplicate_total"),
            ("chopper_aggregator_summaries_lost_total", "lost_total"),
            ("chopper_aggregator_incarnations", "incarnations"),
        ):
            fam.add(name, (), float(stats.get(key, 0)))
        for reason, count in core.jobs.rejected.items():
            fam.add("chopper_aggregator_summaries_rejected_total", (reason,), float(count))
        index = core.jobs.index
        fam.add("chopper_aggregator_step_index_keys", (), float(index.keys))
        fam.add("chopper_aggregator_step_index_steps", (), float(len(index)))
        fam.add("chopper_aggregator_step_index_evicted_steps_total", (), float(index.evicted_steps_total))
        fam.add("chopper_aggregator_step_index_unreadable_files_total", (), float(core.index_unreadable_files_total))
        fam.add("chopper_aggregator_jobs", (), float(len(core.jobs.jobs)))
        fam.add("chopper_aggregator_jobs_expired_total", (), float(core.jobs.jobs_expired_total))
        fam.add("chopper_aggregator_ranks", (), float(sum(len(j.ranks) for j in core.jobs.jobs.values())))
        for reason, count in core.jobs.ranks_retired.items():
            fam.add("chopper_aggregator_ranks_retired_total", (reason,), float(count))
        fam.add("chopper_aggregator_rank_series_omitted", (), float(omitted))
        positions = core.positions
        fam.add("chopper_aggregator_rank_positions", (), float(len(positions)))
        for reason, count in (("rejected", positions.rejected_total), ("evicted", positions.evicted_total),
                              ("expired", positions.expired_total)):
            fam.add("chopper_aggregator_rank_positions_dropped_total", (reason,), float(count))
        for method in ("Deliver", "QuerySteps"):
            fam.add("chopper_aggregator_messages_undecodable_total", (method,),
                    float(core.undecodable.get(method, 0)))
        fam.add("chopper_aggregator_batches_invalid_total", (), float(core.invalid_batches_total))
        fam.add("chopper_aggregator_delivery_streams", (), float(core.delivery_streams))
        for (rpc, reason), count in sorted(core.refusals.snapshot().items()):
            fam.add("chopper_aggregator_rpc_refused_total", (rpc, reason), float(count))

    def _store(self, fam: Families) -> None:
        store, aside = self.core.store, self.core.aside
        fam.add("chopper_aggregator_store_rows_written_total", (), float(store.rows_written_total if store else 0))
        fam.add("chopper_aggregator_store_aside_rows_written_total", (),
                float(aside.rows_written_total if aside else 0))
        both = [s for s in (store, aside) if s is not None]  # the copies set aside fail and wait alike
        fam.add("chopper_aggregator_store_flush_errors_total", (), float(sum(s.flush_errors_total for s in both)))
        fam.add("chopper_aggregator_store_rows_dropped_total", (), float(sum(s.rows_dropped_total for s in both)))
        fam.add("chopper_aggregator_store_buffered_rows", (), float(sum(s.buffered_rows for s in both)))

    def _wal(self, fam: Families) -> None:
        log = self.core.wal
        if log is None:
            return
        wal = log.stats()
        fam.add("chopper_aggregator_wal_up", (), 1.0 - wal["failed"])
        for key in ("bytes", "segments", "records_total", "torn_records_total", "corrupt_records_total",
                    "corrupt_bytes_total", "replayed_records_total", "fsyncs_total", "fsync_seconds_total",
                    "write_errors_total"):
            fam.add(f"chopper_aggregator_wal_{key}", (), wal[key])
        for reason, count in log.set_aside.items():
            fam.add("chopper_aggregator_wal_set_aside_total", (reason,), float(count))

    def _tls(self, fam: Families) -> None:
        if self.tls is None:
            return
        fam.add("chopper_aggregator_tls_reloads_total", (), float(self.tls.reloads))
        for reason, count in sorted(self.tls.refused.items()):
            fam.add("chopper_aggregator_tls_reloads_refused_total", (reason,), float(count))
