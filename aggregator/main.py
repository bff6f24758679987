"""``chopper-aggregator``: the cluster service. Runs until SIGTERM, SIGINT, SIGQUIT or SIGXCPU, then stops cleanly.

SIGHUP makes the running server take its TLS files now, as the next connection would, and reports
a refused set at once (the certificates in use stay; ``chopper.daemon.auth.recheck``); other signals are
logged and ignored, and faults dump every thread's traceback (``chopper/daemon/stopsignals.py``).
Other settings take a restart.

With ``store_dir``, acknowledgements are durable: accepted summaries go to a write-ahead log in
``store_dir/_wal`` and are acknowledged once fsynced; at start the log is replayed (ledger and open
steps rebuilt, rows already stored skipped), so a kill -9 loses and doubles nothing
(``aggregator/service.py``). Without ``store_dir`` there is no log: acknowledgements mean "in
memory", and a crash loses open steps.

Shutdown order: stop accepting (gRPC server stops, in-flight batches get a short grace), stop the
ticker, finalize every open step (complete ones as complete, the rest as incomplete, so nothing
the ledger acknowledged is lost), write the store, trim the log to the ledger, stop serving
/metrics; exit 0.
"""
from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from aggregator.config import AggregatorSettings, check_access, load_settings
from aggregator.jobs import JobTable
from aggregator.metrics import AggregatorCollector
from aggregator.server import build_server
from aggregator.service import Aggregator
from aggregator.store import Store
from aggregator.wal import Wal
from chopper.daemon import sdnotify
from chopper.daemon.auth import Reloaded, recheck
from chopper.daemon.entrypoint import run_daemon
from chopper.daemon.metrics_http import serve_metrics
from chopper.daemon.stopsignals import StopSignals
from chopper.daemon.text_format import Registry

log = logging.getLogger("aggregator")
TICK_S = 1.0
# Many agents' small batches: attribute the steps they complete together, ten times a second.
FINALIZE_EVERY_S = 0.1
# The tick loop counts as hung (systemd's watchdog then restarts the aggregator) after this long
# without an iteration: it runs every TICK_S, so only a deadlock or a stuck flush gets here.
TICK_STALE_S = 30 * TICK_S


def main(argv: Sequence[str] | None = None) -> int:
    """Start the aggregator; returns 0 after a clean stop, 2 on a configuration or startup error."""
    return run_daemon("chopper-aggregator", argv, load_settings, _recheck_files, _serve)


def _recheck_files(settings: AggregatorSettings) -> str:
    """SIGHUP before the aggregator serves: check the TLS files it will take up; raises ConfigError naming a bad one."""
    if not settings.tls_cert:
        return "no TLS files configured; other settings take a restart"
    check_access(settings)
    return ("tls_cert, tls_key and tls_client_ca load; they are taken at the next connection; other settings take a "
            "restart")


def _serve(settings: AggregatorSettings, stop: StopSignals) -> int:
    """Start serving with ``settings``; returns 0 after a clean stop, 2 on a startup error."""
    from aggregator.ledger import Ledger  # the delivery side's module; imported once settings are good

    store = wal = None
    if settings.store_dir:
        store = Store(settings.store_dir, settings.flush_rows, settings.flush_interval_s)
        wal = Wal(Path(settings.store_dir) / "_wal", settings.wal_commit_interval_s,
                  segment_bytes=settings.wal_segment_bytes)
    else:
        log.warning("event=no_store reason='store_dir is empty: finalized rows are not kept, and acknowledgements "
                    "are not durable (no write-ahead log): a crash loses open steps'")
    jobs = JobTable(settings.step_timeout_s, max_jobs=settings.max_jobs, job_expiry_s=settings.job_expiry_s,
                    finalize_every_s=FINALIZE_EVERY_S, rank_expiry_s=settings.rank_expiry_s,
                    max_ranks_per_job=settings.max_ranks_per_job)
    core = Aggregator(Ledger(), jobs, store, settings.recent_steps_per_job, wal=wal)
    try:
        core.recover()
    except OSError as exc:
        print(f"chopper-aggregator: store_dir: cannot recover the write-ahead log: {exc}", file=sys.stderr)
        return 2
    try:
        server, port = build_server(core, settings.listen, settings.max_message_bytes, settings)
    except OSError as exc:
        print(f"chopper-aggregator: {exc}", file=sys.stderr)
        return 2
    registry = Registry()
    tls = server.tls
    files: dict[str, Reloaded] = {"tls": tls.files} if tls is not None else {}
    registry.register(AggregatorCollector(core, settings.rank_series_top_k, tls=files.get("tls"),
                                            job_label=settings.job_label))
    try:
        httpd, metrics_thread, metrics_addr = serve_metrics(settings.metrics_listen, registry)
    except OSError as exc:
        print(f"chopper-aggregator: {exc}", file=sys.stderr)
        server.stop(0)
        return 2
    ticks = [0]
    ticker = threading.Thread(target=_tick, args=(core, stop.event, ticks), name="tick", daemon=True)
    ticker.start()
    log.info("event=started grpc=%s port=%d metrics=http://%s/metrics store=%s step_timeout_s=%g",
             settings.listen, port, metrics_addr, settings.store_dir or "-", settings.step_timeout_s)
    supervision = sdnotify.Supervision(
        [sdnotify.ProgressCheck("tick loop", lambda: ticks[0], TICK_STALE_S),
         sdnotify.thread_check("metrics", metrics_thread)],
        f"serving grpc={settings.listen} port={port} store={settings.store_dir or '-'}",
    )
    supervision.start()
    stop.reload = lambda: supervision.reload(lambda: f"{recheck(files)}; other settings take a restart")
    stop.wait()
    log.info("event=stopping signal=%s", stop.received or "-")
    supervision.stop()
    server.stop(grace=2.0).wait(5.0)
    ticker.join(5.0)
    core.close()
    httpd.shutdown()
    written = store.rows_written_total if store else 0
    log.info("event=stopped rows_written=%d store_errors=%d", written, store.flush_errors_total if store else 0)
    return 0


def _tick(core: Aggregator, stop: threading.Event, ticks: list[int]) -> None:
    """Finalize timed-out steps and flush the store on time, until ``stop``; counts in ``ticks[0]``."""
    while not stop.wait(TICK_S):
        ticks[0] += 1
        try:
            core.tick()
        except Exception:  # a bug here must not stop ingest; it is logged with its traceback
            log.exception("event=tick_failed")


if __name__ == "__main__":
    sys.exit(main())
