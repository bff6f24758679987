"""Prometheus exposition of the aggregator: one custom collector that reads ``Aggregator`` at scrape time.

Per the house style, ``collect()`` builds fresh families from the catalog on every scrape, under
the aggregator's lock; there are no module-global gauges and the registry is passed in.

Per-rank series (``chopper_job_rank_*``) are bounded by ``rank_series_top_k``: for a job with
more ranks than k, only the k ranks with the largest decayed compute excess over their steps'
median (``RankState.excess_at``) are exported; the others are counted in
``chopper_aggregator_rank_series_omitted``. 0 exports every rank.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import __version__
from aggregator.catalog import BY_NAME
from aggregator.jobs import CAUSES, WINDOWS_S, JobState, RankState
from aggregator.service import Aggregator
from chopper.daemon.auth import Reloaded

WINDOW_NAMES = {60: "1m", 300: "5m"}


class Families:
    """The families of one scrape, created from the catalog on first use."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Add one series; NaN values (unknown) are left out."""
        if isinstance(value, float) and math.isnan(value):
            return
        family = self._families.get(name)
        if family is None:
            spec = BY_NAME[name]
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = self._families[name] = kind(name, spec.help, labels=spec.labels)
        family.add_metric(list(labels), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def worst_ranks(job: JobState, k: int, now_ns: int) -> list[tuple[int, RankState]]:
    """The ranks of ``job`` to export: all when ``k`` is 0 or the job is small, else the k worst."""
    ranks = sorted(job.ranks.items())
    if k <= 0 or len(ranks) <= k:
        return ranks
    ranks.sort(key=lambda item: (-item[1].excess_at(now_ns), item[0]))
    return sorted(ranks[:k])


class AggregatorCollector(Collector):
    """Exports job, rank and self metrics of one ``Aggregator``.

    Args:
        core: The aggregator.
        rank_series_top_k: Per-rank series for the k worst ranks of larger jobs; 0: all.
        tls: The TLS files the running gRPC server re-reads (``ServerTLS.files``); None: plaintext.
    """

    def __init__(self, core: Aggregator, rank_series_top_k: int = 0, tls: Reloaded | None = None) -> None:
        self.core = core
        self.top_k = rank_series_top_k
        self.tls = tls

    def collect(self) -> Iterator[Metric]:
        fam = Families()
        with self.core.lock:
            now = self.core.clock()
            omitted = 0
            for job in self.core.jobs.jobs.values():
                self._job(fam, job, now)
                shown = worst_ranks(job, self.top_k, now)
                omitted += len(job.ranks) - len(shown)
                self._ranks(fam, job, shown, now)
            self._self(fam, omitted)
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
            rank, node, gpu, cause = job.last_slowest
            fam.add("chopper_job_slowest_rank_info", (job.job, str(rank), node, str(gpu), cause), 1.0)
        for seconds in WINDOWS_S:
            w = (job.job, WINDOW_NAMES[seconds])
            fam.add("chopper_job_mfu_ratio", w, job.mfu(now, seconds))
            fam.add("chopper_job_energy_per_token_joules", w, job.energy_per_token(now, seconds))
            for cause, share in job.shares(now, seconds).items():
                fam.add("chopper_job_step_time_share_ratio", (*w, cause), share)
        for i, cause in enumerate(CAUSES):
            fam.add("chopper_job_step_seconds_total", (job.job, cause), float(job.seconds[i]))

    def _ranks(self, fam: Families, job: JobState, ranks: list[tuple[int, RankState]], now: int) -> None:
        for rank, st in ranks:
            rl = (job.job, str(rank), st.node, str(st.gpu))
            for i, cause in enumerate(CAUSES):
                fam.add("chopper_job_rank_step_seconds_total", (*rl, cause), float(st.seconds[i]))
            fam.add("chopper_job_rank_step_time_seconds", rl, st.last_step_time_s)
            fam.add("chopper_job_rank_compute_excess_seconds", rl, st.excess_at(now))
            fam.add("chopper_job_rank_missing_steps_total", rl, float(st.missing_steps))

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
        store, aside = core.store, core.aside
        fam.add("chopper_aggregator_store_rows_written_total", (), float(store.rows_written_total if store else 0))
        fam.add("chopper_aggregator_store_aside_rows_written_total", (),
                float(aside.rows_written_total if aside else 0))
        both = [s for s in (store, aside) if s is not None]  # the copies set aside fail and wait alike
        fam.add("chopper_aggregator_store_flush_errors_total", (), float(sum(s.flush_errors_total for s in both)))
        fam.add("chopper_aggregator_store_rows_dropped_total", (), float(sum(s.rows_dropped_total for s in both)))
        fam.add("chopper_aggregator_store_buffered_rows", (), float(sum(s.buffered_rows for s in both)))
        if core.wal is not None:
            wal = core.wal.stats()
            fam.add("chopper_aggregator_wal_up", (), 1.0 - wal["failed"])
            for key in ("bytes", "segments", "records_total", "torn_records_total", "corrupt_records_total",
                        "corrupt_bytes_total", "replayed_records_total", "fsyncs_total", "fsync_seconds_total",
                        "write_errors_total"):
                fam.add(f"chopper_aggregator_wal_{key}", (), wal[key])
            for reason, count in core.wal.set_aside.items():
                fam.add("chopper_aggregator_wal_set_aside_total", (reason,), float(count))
        for method in ("Deliver", "QuerySteps"):
            fam.add("chopper_aggregator_messages_undecodable_total", (method,),
                    float(core.undecodable.get(method, 0)))
        fam.add("chopper_aggregator_batches_invalid_total", (), float(core.invalid_batches_total))
        fam.add("chopper_aggregator_delivery_streams", (), float(core.delivery_streams))
        for (rpc, reason), count in sorted(core.refusals.snapshot().items()):
            fam.add("chopper_aggregator_rpc_refused_total", (rpc, reason), float(count))
        if self.tls is not None:
            fam.add("chopper_aggregator_tls_reloads_total", (), float(self.tls.reloads))
            for reason, count in sorted(self.tls.refused.items()):
                fam.add("chopper_aggregator_tls_reloads_refused_total", (reason,), float(count))
