"""The aggregator's one typed settings object: code defaults < YAML < ``CHOPPER_AGGREGATOR_*`` env < flags.

Every setting has a flag (``--step-timeout-s``) and an environment variable
(``CHOPPER_AGGREGATOR_STEP_TIMEOUT_S``); the YAML file uses the field names
(``step_timeout_s: 30``). Settings are validated once at start; a bad value raises
``ConfigError`` naming the key, the value, where it came from and what is accepted, and
``chopper-aggregator`` exits with status 2 and that message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chopper.daemon import settings as _settings
from chopper.daemon.serving import access_field, check_server_access
from chopper.daemon.settings import MAX_MESSAGE_BYTES, ConfigError, check_job_label, is_host_port, job_label_field

ENV_PREFIX = "CHOPPER_AGGREGATOR_"
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class AggregatorSettings:
    """Everything ``chopper-aggregator`` can be told. Units are in the names."""

    listen: str = field(
        default="127.0.0.1:9480",
        metadata={"help": "TCP host:port of the gRPC Aggregator service (port 0: a free port, logged)"},
    )
    metrics_listen: str = field(
        default="127.0.0.1:9481", metadata={"help": "host:port of Prometheus /metrics (port 0: a free port, logged)"}
    )
    store_dir: str = field(
        default="", metadata={"help": "Parquet store of per-step rank rows (empty: no store, rows are not kept)"}
    )
    flush_rows: int = field(default=50_000, metadata={"help": "write the store once this many rows are buffered"})
    flush_interval_s: float = field(default=10.0, metadata={"help": "write buffered rows at least this often, s"})
    job_label: str = job_label_field()
    wal_commit_interval_s: float = field(
        default=0.02, metadata={"help": "write-ahead log (in store_dir/_wal): fsync at most this often; acks wait "
                                        "for it, s"}
    )
    wal_segment_bytes: int = field(
        default=64 * 1024 * 1024, metadata={"help": "start a new write-ahead log segment at this size"}
    )
    step_timeout_s: float = field(
        default=30.0, metadata={"help": "finalize a step missing ranks this long after its first summary, s"}
    )
    rank_series_top_k: int = field(
        default=0, metadata={"help": "per-rank series only for the k worst ranks of larger jobs (0: all ranks)"}
    )
    max_jobs: int = field(default=10_000, metadata={"help": "live jobs held at most; further new jobs are rejected"})
    job_expiry_s: float = field(default=900.0, metadata={"help": "forget a job silent this long, s"})
    rank_expiry_s: float = field(
        default=300.0, metadata={"help": "forget a rank that left its job's rank set (missed steps in a row) and "
                                 "has been silent this long, with its series, s"}
    )
    max_ranks_per_job: int = field(
        default=65_536, metadata={"help": "ranks held per job at most; summaries of further new ranks are rejected"}
    )
    recent_steps_per_job: int = field(default=16, metadata={"help": "finalized steps per job kept for QuerySteps"})
    max_message_bytes: int = field(default=64 * 1024 * 1024, metadata={"help": "largest accepted gRPC message"})
    # Access control (docs/SECURITY.md).
    tls_cert: str = access_field("tls_cert", "listen")
    tls_key: str = access_field("tls_key", "listen")
    tls_client_ca: str = access_field("tls_client_ca", "listen")
    rate_limit_calls_per_s: float = access_field("rate_limit_calls_per_s", "listen")
    rate_limit_messages_per_s: float = access_field("rate_limit_messages_per_s", "listen")
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})


def _check(s: AggregatorSettings) -> None:
    """Range and consistency checks that a type alone does not express."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{key}: {getattr(s, key)!r} {why}")

    for key in ("listen", "metrics_listen"):
        if not is_host_port(getattr(s, key)):
            raise bad(key, "is not host:port, e.g. 127.0.0.1:9480")
    if s.listen == s.metrics_listen and not s.listen.endswith(":0"):  # port 0: each takes a free port of its own
        raise bad("metrics_listen", "is the same address as listen; give /metrics its own port")
    if s.store_dir and Path(s.store_dir).exists() and not Path(s.store_dir).is_dir():
        raise bad("store_dir", "exists and is not a directory; point it at a directory")
    if s.flush_rows < 1:
        raise bad("flush_rows", "must be at least 1")
    if (why := check_job_label(s.job_label)) is not None:
        raise bad("job_label", why)
    if not 0 < s.flush_interval_s <= 3600:
        raise bad("flush_interval_s", "is out of range; use more than 0 and at most 3600 seconds")
    if not 0 <= s.wal_commit_interval_s <= 1:
        raise bad("wal_commit_interval_s", "is out of range; use 0 to 1 seconds (acks wait up to this long)")
    if s.wal_segment_bytes < 1024 * 1024:
        raise bad("wal_segment_bytes", f"is too small; use at least {1024 * 1024}")
    if not 0 < s.step_timeout_s <= 3600:
        raise bad("step_timeout_s", "is out of range; use more than 0 and at most 3600 seconds")
    if s.rank_series_top_k < 0:
        raise bad("rank_series_top_k", "is negative; use 0 for every rank or k > 0 for the k worst")
    if s.max_jobs < 1:
        raise bad("max_jobs", "must be at least 1")
    if s.job_expiry_s < s.step_timeout_s:
        raise bad("job_expiry_s", f"is shorter than step_timeout_s ({s.step_timeout_s:g}); use at least that")
    if not 1 <= s.rank_expiry_s <= 7 * 24 * 3600:
        raise bad("rank_expiry_s", "is out of range; use 1 s to a week")
    if s.max_ranks_per_job < 1:
        raise bad("max_ranks_per_job", "must be at least 1")
    if s.recent_steps_per_job < 1:
        raise bad("recent_steps_per_job", "must be at least 1")
    if not 64 * 1024 <= s.max_message_bytes <= MAX_MESSAGE_BYTES:
        raise bad("max_message_bytes", f"is out of range; use {64 * 1024} to {MAX_MESSAGE_BYTES}")
    if s.log_level not in LOG_LEVELS:
        raise bad("log_level", "is not one of " + ", ".join(LOG_LEVELS))
    check_access(s)


def check_access(s: AggregatorSettings) -> None:
    """TLS and rate-limit settings: files readable and loadable, pairs complete.

    Run at start and again on SIGHUP (``aggregator/main.py``), so that replaced files are checked at once.

    Raises:
        ConfigError: A file is unreadable or does not load, or a pair is incomplete.
    """
    check_server_access(s, "listen")


DAEMON = _settings.Daemon(
    AggregatorSettings, _check, prog="chopper-aggregator",
    description="Chopper cluster aggregator: joins agents' step summaries by (job, step), names stragglers, "
    "serves gRPC and /metrics, writes Parquet.",
    env_prefix=ENV_PREFIX, module="aggregator.config", doc="docs/AGGREGATOR_CONFIG.md", title="Aggregator settings",
)
# load_settings(argv=None, env=None) -> AggregatorSettings; markdown() -> docs/AGGREGATOR_CONFIG.md.
load_settings = DAEMON.load
markdown = DAEMON.markdown


__all__ = ["AggregatorSettings", "ConfigError", "check_access", "load_settings", "markdown"]


if __name__ == "__main__":
    print(markdown(), end="")
