"""Telemetry health dashboard: is Chopper itself seeing everything?

Agents and aggregators up, GPU backend errors, sampler lag and missed ticks, markers dropped,
rejected or lost between ranks and agents, buffer pressure, and the agent → aggregator path:
delivery backlog (the ingest lag), losses, incomplete and late steps, the Parquet store and WAL.
"""
from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.names import C
from dashboards.panels import RATE, Board, query, stat_panel, timeseries_panel
from dashboards.params import RuleParams

UID = "chopper-health"


def _rate(name: str, by: str) -> str:
    return f"sum by ({by}) (rate({name}[{RATE}]))"


def build(p: RuleParams) -> Dashboard:
    agents, aggregators = f"up{{{p.agent_selector}}}", f"up{{{p.aggregator_selector}}}"
    return (
        Board("Chopper / Telemetry health", UID, "Agents, backends, sampler, markers and the path to the "
              "aggregator.")
        .row("Up")
        .add(stat_panel("Agents up", "Agent scrape targets that answered the last scrape.", "none",
                        query(f"sum({agents})", instant=True)), w=6, h=4)
        .add(stat_panel("Agents down", "Agent scrape targets that did not answer.", "none",
                        query(f"count({agents}) - sum({agents})", instant=True)), w=6, h=4)
        .add(stat_panel("Aggregators up", "Aggregator scrape targets that answered the last scrape.", "none",
                        query(f"sum({aggregators})", instant=True)), w=6, h=4)
        .add(stat_panel("Backends failing", "Agents whose GPU backend's last sample failed.", "none",
                        query(f"sum({C.agent_backend_up} == bool 0)", instant=True)), w=6, h=4)
        .row("Agents")
        .add(timeseries_panel("Scrape targets up", "1 while Prometheus scrapes the target.", "none",
                              query(agents, "agent {{instance}}"), query(aggregators, "aggregator {{instance}}")))
        .add(timeseries_panel("Backend errors", "GPU backend failures per second, by kind; and backend up.",
                              "short", query(_rate(C.agent_backend_errors_total, "node, backend, kind"),
                                             "{{kind}} {{node}}"),
                              query(C.agent_backend_up, "up {{node}}")))
        .add(timeseries_panel("Sampler lag", "How late the last sampling tick started, and the backend's last "
                              "sample call.", "s", query(C.agent_sampler_lag_seconds, "lag {{node}}"),
                              query(C.agent_backend_sample_seconds, "sample call {{node}}")))
        .add(timeseries_panel("Missed ticks", "Sampling ticks skipped per second because the sampler ran late; "
                              "and the sampling rate.", "short",
                              query(_rate(C.agent_sampler_missed_ticks_total, "node"), "missed {{node}}"),
                              query(C.agent_sample_rate_hertz, "rate Hz {{node}}")))
        .add(timeseries_panel("Markers dropped, rejected and lost", "Per second: markers the ranks' clients "
                              "dropped, markers the agent rejected (by reason), marker batches missing from a "
                              "rank's sequence, undecodable messages.", "short",
                              query(_rate(C.rank_client_dropped_markers_total, "node, training_job, rank"),
                                    "dropped {{training_job}}/{{rank}}"),
                              query(_rate(C.agent_markers_rejected_total, "node, reason"), "rejected {{reason}}"),
                              query(_rate(C.rank_batches_lost_total, "node, training_job, rank"),
                                    "lost {{training_job}}/{{rank}}"),
                              query(_rate(C.agent_messages_undecodable_total, "node"), "undecodable {{node}}")))
        .add(timeseries_panel("Buffers", "Fill of the agent's ring buffers; full buffers overwrite the oldest.",
                              "percentunit", query(f"{C.agent_buffer_items}\n/ {C.agent_buffer_capacity_items}",
                                                   "{{buffer}} {{node}}"), max_value=1))
        .row("Delivery and aggregator")
        .add(timeseries_panel("Delivery backlog (ingest lag)", "Step summaries an agent routed to a replica and "
                              "not yet acknowledged, in seconds of acknowledgements at the current rate.", "s",
                              query(f"sum by (node, replica) ({C.agent_delivery_pending_items})\n"
                                    f"/ ({_rate(C.agent_delivery_acked_total, 'node, replica')} > 0)",
                                    "{{node}} → {{replica}}")))
        .add(timeseries_panel("Summaries delivered and lost", "Per second: summaries acknowledged and lost "
                              "(agents), received and lost (aggregator ledger).", "short",
                              query(_rate(C.agent_delivery_acked_total, "node"), "acked {{node}}"),
                              query(_rate(C.agent_delivery_lost_total, "node"), "lost (agent) {{node}}"),
                              query(_rate(C.aggregator_summaries_received_total, "instance"), "received"),
                              query(_rate(C.aggregator_summaries_lost_total, "instance"), "lost (ledger)")))
        .add(timeseries_panel("Steps incomplete, late and rejected", "Per second: steps finalized with ranks "
                              "missing, summaries after their step was finalized, summaries rejected by reason; "
                              "and steps waiting for ranks.", "short",
                              query(_rate(C.job_steps_incomplete_total, "training_job"), "incomplete {{training_job}}"),
                              query(_rate(C.job_late_summaries_total, "training_job"), "late {{training_job}}"),
                              query(_rate(C.aggregator_summaries_rejected_total, "reason"), "rejected {{reason}}"),
                              query(f"sum by (training_job) ({C.job_open_steps})", "open {{training_job}}")))
        .add(timeseries_panel("Store and WAL", "Parquet rows written and dropped per second, rows waiting, "
                              "write-ahead log up.", "short",
                              query(_rate(C.aggregator_store_rows_written_total, "instance"), "rows written/s"),
                              query(_rate(C.aggregator_store_rows_dropped_total, "instance"), "rows dropped/s"),
                              query(f"sum by (instance) ({C.aggregator_store_buffered_rows})", "rows buffered"),
                              query(C.aggregator_wal_up, "WAL up")))
        .build()
    )
