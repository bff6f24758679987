"""The aggregator's metric catalog: every name it exports, with type, help and labels.

The single source of the aggregator's metric names: the collector builds families from it (with
``chopper.daemon.exposition``, shared with the agent) and ``docs/AGGREGATOR_METRICS.md`` is
generated from it (a test keeps them equal). Names follow
``chopper_<subsystem>_<name>_<unit>`` with base units; counters end in ``_total``; step numbers
are never labels. Cardinality is bounded and series are stable: per job a fixed set of series (the
slowest rank is a value, its throttle cause one 0/1 series per ``SLOWEST_CAUSES``), per rank a
fixed set per rank, and with ``rank_series_top_k`` only the k worst ranks of a larger job (and the
slowest rank of its last step) have per-rank series.
"""
from __future__ import annotations

from aggregator.jobs import CAUSES, REJECTION_REASONS
from aggregator.positions import MAX_POSITIONS
from aggregator.wal import SET_ASIDE
from chopper.daemon.exposition import MetricSpec, catalog_doc, reason_table
from chopper.schema import THROTTLE_CAUSES

JOB = ("training_job",)
RANK = ("training_job", "rank", "node", "gpu")
WINDOW = "window"
# The values of chopper_job_slowest_rank_cause{cause}: the throttle cause with the most DVFS loss on the
# slowest rank, unattributed (its clock was low with no residency), or none (its clock was not low).
SLOWEST_CAUSES: tuple[str, ...] = (*THROTTLE_CAUSES, "unattributed", "none")

# The sections of ``AggregatorCollector.collect()``, each built on its own (``Sections``; ``job`` and
# ``ranks`` once per job, so a job that cannot be exported costs its own series), and the series each
# one holds: the values of the ``section`` label of ``chopper_aggregator_metrics_section_errors_total``.
SECTIONS: dict[str, str] = {
    "job": "one job's `chopper_job_*` but `chopper_job_rank_*`",
    "ranks": "one job's `chopper_job_rank_*`",
    "self": "the other `chopper_aggregator_*`: identity, ledger, joins, step index, jobs and ranks, access checks",
    "store": "`chopper_aggregator_store_*`",
    "wal": "`chopper_aggregator_wal_*`",
    "tls": "`chopper_aggregator_tls_reloads*`",
}

METRICS: tuple[MetricSpec, ...] = (
    # Per job.
    MetricSpec("chopper_job_steps_finalized_total", "counter", "Steps finalized (complete or timed out).", JOB),
    MetricSpec("chopper_job_steps_incomplete_total", "counter",
               "Steps finalized with ranks missing, after step_timeout_s.", JOB),
    MetricSpec("chopper_job_late_summaries_total", "counter",
               "Summaries that arrived after their step was finalized (stored flagged late).", JOB),
    MetricSpec("chopper_job_missing_rank_steps_total", "counter", "Ranks missing from incomplete steps, summed.", JOB),
    MetricSpec("chopper_job_rank_set_changes_total", "counter",
               "Ranks that joined after the join period or vanished (missed steps in a row).", JOB),
    MetricSpec("chopper_job_ranks", "gauge", "Ranks expected at each step (distinct ranks seen, less vanished).", JOB),
    MetricSpec("chopper_job_open_steps", "gauge", "Steps waiting for ranks.", JOB),
    MetricSpec("chopper_job_last_step", "gauge", "Number of the last finalized step.", JOB),
    MetricSpec("chopper_job_step_time_seconds", "gauge", "Step time of the last finalized step (slowest rank), s.",
               JOB),
    MetricSpec("chopper_job_straggler_score_ratio", "gauge",
               "Last step's slowest-rank compute excess over the median compute, over the median step time.", JOB),
    MetricSpec("chopper_job_slowest_rank", "gauge",
               "Rank number of the slowest rank of the last finalized multi-rank step.", JOB),
    MetricSpec("chopper_job_slowest_rank_cause", "gauge",
               "1 for the slowest rank's throttle cause (see below), 0 for every other cause: one series per cause.",
               (*JOB, "cause")),
    MetricSpec("chopper_job_mfu_ratio", "gauge",
               "Deprecated, goes in the next release: use the recording rule training_job:chopper_job_mfu:ratio "
               "(the rate of chopper_job_step_seconds_total{cause=\"ideal\"} over that of "
               "chopper_job_flops_step_seconds_total). Model FLOPs utilisation over the window (sum ideal / sum "
               "step time of all ranks), 0-1.",
               (*JOB, WINDOW)),
    MetricSpec("chopper_job_energy_per_token_joules", "gauge",
               "Deprecated, goes in the next release: use the recording rule "
               "training_job:chopper_job_energy_per_token_joules:ratio (the rate of chopper_job_energy_joules_total "
               "over that of chopper_job_tokens_total). Energy per token over the window, J.",
               (*JOB, WINDOW)),
    MetricSpec("chopper_job_step_seconds_total", "counter",
               "Step time of all ranks by cause, s; cause=\"ideal\" is the MFU numerator.", (*JOB, "cause")),
    MetricSpec("chopper_job_flops_step_seconds_total", "counter",
               "Step time of all ranks' steps with known FLOPs (known ideal time), s: the MFU denominator, so "
               "steps without FLOPs do not dilute MFU.", JOB),
    MetricSpec("chopper_job_energy_joules_total", "counter",
               "GPU energy of all ranks' steps whose energy and tokens are both known, J: the numerator of energy "
               "per token.", JOB),
    MetricSpec("chopper_job_tokens_total", "counter",
               "Tokens of all ranks' steps whose energy and tokens are both known: the denominator of energy per "
               "token.", JOB),
    # Per rank (the k worst of larger jobs with rank_series_top_k).
    MetricSpec("chopper_job_rank_step_seconds_total", "counter",
               "A rank's step time by cause (straggler_wait is its straggler wait), s.", (*RANK, "cause")),
    MetricSpec("chopper_job_rank_step_time_seconds", "gauge", "A rank's last finalized step time, s.", RANK),
    MetricSpec("chopper_job_rank_compute_excess_seconds", "gauge",
               "A rank's compute excess over its steps' median compute, decayed with a 60 s time constant, s.", RANK),
    MetricSpec("chopper_job_rank_missing_steps_total", "counter", "Steps finalized without this rank.", RANK),
    MetricSpec("chopper_job_rank_slowest", "gauge",
               "1 for the slowest rank of the job's last finalized multi-rank step, 0 for the others: it carries "
               "that rank's node and gpu, to join GPU series onto.", RANK),
    # The aggregator itself.
    MetricSpec("chopper_aggregator_info", "info", "Aggregator identity; value is always 1.", ("version",)),
    MetricSpec("chopper_aggregator_summaries_received_total", "counter",
               "Step summaries received from agents (ledger).", ()),
    MetricSpec("chopper_aggregator_summaries_duplicate_total", "counter",
               "Step summaries received again and ignored (ledger).", ()),
    MetricSpec("chopper_aggregator_summaries_lost_total", "counter",
               "Step summaries agents could not deliver: overwritten in their buffers (ledger).", ()),
    MetricSpec("chopper_aggregator_incarnations", "gauge", "Agent incarnations the ledger tracks.", ()),
    MetricSpec("chopper_aggregator_summaries_rejected_total", "counter",
               "Summaries not joined, by reason (see below): copies of a step already taken in are counted here.",
               ("reason",)),
    MetricSpec("chopper_aggregator_step_index_keys", "gauge",
               "(job, rank, step) keys the step index holds, to recognise copies from any agent or incarnation.", ()),
    MetricSpec("chopper_aggregator_step_index_steps", "gauge", "Finalized steps the step index holds.", ()),
    MetricSpec("chopper_aggregator_step_index_evicted_steps_total", "counter",
               "Steps the step index forgot to stay within its bounds (older copies are then set aside as "
               "unverifiable).", ()),
    MetricSpec("chopper_aggregator_step_index_unreadable_files_total", "counter",
               "Store files the step index could not read back at start (skipped; logged).", ()),
    MetricSpec("chopper_aggregator_jobs", "gauge", "Live jobs.", ()),
    MetricSpec("chopper_aggregator_jobs_expired_total", "counter", "Jobs forgotten after job_expiry_s of silence.", ()),
    MetricSpec("chopper_aggregator_ranks", "gauge", "Ranks held over all live jobs (before rank_series_top_k).", ()),
    MetricSpec("chopper_aggregator_rank_positions", "gauge",
               "Rank positions held (where each rank is, as its agent last sent it; docs/HANGS.md).", ()),
    MetricSpec("chopper_aggregator_rank_positions_dropped_total", "counter",
               "Rank positions dropped, by reason: rejected (a bad job name or negative rank), evicted (more than "
               f"{MAX_POSITIONS:,} held: the one updated longest ago went) or expired (not updated for job_expiry_s).",
               ("reason",)),
    MetricSpec("chopper_aggregator_ranks_retired_total", "counter",
               "Ranks forgotten with their series, by reason: job_expired (their job went after job_expiry_s) or "
               "idle (out of the job's rank set and silent for rank_expiry_s).", ("reason",)),
    MetricSpec("chopper_aggregator_rank_series_omitted", "gauge",
               "Ranks whose per-rank series are left out by rank_series_top_k.", ()),
    MetricSpec("chopper_aggregator_store_rows_written_total", "counter", "Rows written to the Parquet store.", ()),
    MetricSpec("chopper_aggregator_store_flush_errors_total", "counter", "Failed Parquet store writes.", ()),
    MetricSpec("chopper_aggregator_store_rows_dropped_total", "counter",
               "Rows dropped because store writes kept failing and the buffer was full.", ()),
    MetricSpec("chopper_aggregator_store_buffered_rows", "gauge", "Rows waiting to be written to the store.", ()),
    MetricSpec("chopper_aggregator_store_aside_rows_written_total", "counter",
               "Copies set aside (conflict, unverifiable) written to store_dir/_conflicts.", ()),
    # The write-ahead log (only with store_dir; see docs/ARCHITECTURE.md, delivery and durability).
    MetricSpec("chopper_aggregator_wal_up", "gauge",
               "1 while the write-ahead log commits; 0 while its writes or fsyncs fail (deliveries are refused "
               "until a retry succeeds).", ()),
    MetricSpec("chopper_aggregator_wal_write_errors_total", "counter",
               "Failed write-ahead log commits (disk full, I/O error), each retried with backoff.", ()),
    MetricSpec("chopper_aggregator_wal_bytes", "gauge", "Size of the write-ahead log's segments, bytes.", ()),
    MetricSpec("chopper_aggregator_wal_segments", "gauge", "Write-ahead log segment files.", ()),
    MetricSpec("chopper_aggregator_wal_records_total", "counter", "Records appended to the write-ahead log.", ()),
    MetricSpec("chopper_aggregator_wal_torn_records_total", "counter",
               "Torn tails found at recovery: bad bytes ending the log with no record missing after them, a write "
               "cut by a crash that was never acknowledged (the agents resend it).", ()),
    MetricSpec("chopper_aggregator_wal_corrupt_records_total", "counter",
               "Acknowledged records lost to damage found at recovery (missing from the record sequence where bad "
               "bytes are followed by intact records); replay goes on after them.", ()),
    MetricSpec("chopper_aggregator_wal_corrupt_bytes_total", "counter",
               "Bytes of damage found inside the write-ahead log at recovery and skipped.", ()),
    MetricSpec("chopper_aggregator_wal_set_aside_total", "counter",
               "Entries of the write-ahead log directory moved to its quarantine/ at recovery, by reason (see "
               "below).", ("reason",)),
    MetricSpec("chopper_aggregator_wal_replayed_records_total", "counter",
               "Records replayed from the write-ahead log at start.", ()),
    MetricSpec("chopper_aggregator_wal_fsyncs_total", "counter",
               "Group commits of the write-ahead log (one fsync each).", ()),
    MetricSpec("chopper_aggregator_wal_fsync_seconds_total", "counter",
               "Time spent in write-ahead log fsyncs, s.", ()),
    MetricSpec("chopper_aggregator_messages_undecodable_total", "counter",
               "gRPC messages that were not valid protobuf.", ("method",)),
    MetricSpec("chopper_aggregator_batches_invalid_total", "counter",
               "Summary batches refused: no agent or incarnation, or seq and summaries of different length.", ()),
    MetricSpec("chopper_aggregator_delivery_streams", "gauge", "Open Deliver streams from agents.", ()),
    MetricSpec("chopper_aggregator_metrics_section_errors_total", "counter",
               "Scrapes that left out a section of the aggregator's series because building it failed, by section "
               "(see below).", ("section",)),
    MetricSpec("chopper_aggregator_rpc_refused_total", "counter",
               "RPCs refused by the access checks, by RPC and reason (see below, docs/SECURITY.md).",
               ("rpc", "reason")),
    MetricSpec("chopper_aggregator_tls_reloads_total", "counter",
               "Changed TLS file sets (tls_cert, tls_key, tls_client_ca) taken up while running; with tls_cert set.",
               ()),
    MetricSpec("chopper_aggregator_tls_reloads_refused_total", "counter",
               "Changed TLS file sets refused, by reason (see below): the previous certificates stay in use.",
               ("reason",)),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def markdown() -> str:
    """``docs/AGGREGATOR_METRICS.md``: the catalog as tables (``python -m aggregator.catalog``)."""
    own = ["", "## Causes (`cause` label of the step-time metrics)", "",
           "They add up to the step time: `ideal`, `matrix_util_loss`, `dvfs_<cause>` (DVFS loss by throttle",
           "cause), `exposed_comm` (after the straggler split), `straggler_wait`, `idle`, and `compute_unknown`",
           "(compute time at the observed clock of steps without FLOPs). See docs/ATTRIBUTION.md.", "",
           " ".join(f"`{c}`" for c in CAUSES)]
    own += reason_table("Rejection reasons (`chopper_aggregator_summaries_rejected_total{reason}`)", REJECTION_REASONS)
    own += reason_table("Set-aside reasons (`chopper_aggregator_wal_set_aside_total{reason}`)", SET_ASIDE, intro=(
        "What recovery moved to `store_dir/_wal/quarantine/` instead of replaying; the aggregator starts",
        "whatever the log directory holds. See docs/ARCHITECTURE.md (delivery and durability)."))
    own += ["", "## The slowest rank (`chopper_job_slowest_rank`, `..._cause{cause}`, `chopper_job_rank_slowest`)",
            "", "Which rank was slowest moves from step to step. An info series with the rank, node, gpu and cause as",
            "labels would start a new series at every move and churn the TSDB's index; these series never change",
            "their labels, only their values. `chopper_job_slowest_rank` holds the rank number;",
            "`chopper_job_slowest_rank_cause` is one series per cause, 1 for the slowest rank's and 0 for the",
            "others (`max by (training_job, cause) (...) == 1` picks it); `chopper_job_rank_slowest` is 1 on the",
            "slowest rank's own per-rank series, whose `node` and `gpu` labels join it to its GPU's series",
            "(`... * on (node, gpu) group_left () (chopper_job_rank_slowest == 1)`). With `rank_series_top_k` the",
            "slowest rank is always among the exported ranks.", "", " ".join(f"`{c}`" for c in SLOWEST_CAUSES)]
    notes = ("`window` is `1m` or `5m` of finalized steps by the aggregator's receive time; the two gauges that "
             "carry it are deprecated and go in the next release. Counters are the window-free form, and PromQL "
             "divides their rates over any window: the share of step time by cause is the `rate()` of "
             "`chopper_job_step_seconds_total` by cause over its sum (recording rule "
             "`training_job_cause:chopper_job_step_seconds:rate`), MFU that of its `cause=\"ideal\"` over "
             "`chopper_job_flops_step_seconds_total` (`training_job:chopper_job_mfu:ratio`), energy per token "
             "that of `chopper_job_energy_joules_total` over `chopper_job_tokens_total` "
             "(`training_job:chopper_job_energy_per_token_joules:ratio`; docs/ALERTS.md). With "
             "`rank_series_top_k` = k > 0, jobs of more than k ranks export `chopper_job_rank_*` only for the k "
             "ranks with the largest decayed compute excess and the last step's slowest rank. A value that is not "
             "known (no step in the window, no FLOPs) is left out of the scrape rather than exported as NaN.")
    return catalog_doc("Aggregator metric catalog", "aggregator.catalog", notes, METRICS, own, SECTIONS,
                       token_file=False)


if __name__ == "__main__":
    print(markdown(), end="")
