"""The aggregator's one typed settings object: code defaults < YAML < ``CHOPPER_AGGREGATOR_*`` env < flags.

Every setting has a flag (``--step-timeout-s``) and an environment variable
(``CHOPPER_AGGREGATOR_STEP_TIMEOUT_S``); the YAML file uses the field names
(``step_timeout_s: 30``). Settings are validated once at start; a bad value raises
``ConfigError`` naming the key, the value, where it came from and what is accepted, and
``chopper-aggregator`` exits with status 2 and that message.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "CHOPPER_AGGREGATOR_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A setting is invalid; the message names the key, its source and the fix."""


@dataclass(frozen=True)
class AggregatorSettings:
    """Everything ``chopper-aggregator`` can be told. Units are in the names."""

    listen: str = field(default="127.0.0.1:9480", metadata={"help": "TCP host:port of the gRPC Aggregator service"})
    metrics_listen: str = field(default="127.0.0.1:9481", metadata={"help": "host:port of Prometheus /metrics"})
    store_dir: str = field(
        default="", metadata={"help": "Parquet store of per-step rank rows (empty: no store, rows are not kept)"}
    )
    flush_rows: int = field(default=50_000, metadata={"help": "write the store once this many rows are buffered"})
    flush_interval_s: float = field(default=10.0, metadata={"help": "write buffered rows at least this often, s"})
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
    recent_steps_per_job: int = field(default=16, metadata={"help": "finalized steps per job kept for QuerySteps"})
    max_message_bytes: int = field(default=64 * 1024 * 1024, metadata={"help": "largest accepted gRPC message"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})


_FIELDS = {f.name: f for f in dataclasses.fields(AggregatorSettings)}


def _parse(name: str, raw: Any, source: str) -> Any:
    """Convert one raw value (YAML scalar or string) to the field's type."""
    kind = _FIELDS[name].type
    try:
        if kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if kind == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if isinstance(raw, list | dict):
            raise ValueError
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {raw!r} (from {source}) is not a valid {kind}") from None


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def _check(s: AggregatorSettings) -> None:
    """Range and consistency checks that a type alone does not express."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{key}: {getattr(s, key)!r} {why}")

    for key in ("listen", "metrics_listen"):
        if not _is_host_port(getattr(s, key)):
            raise bad(key, "is not host:port, e.g. 127.0.0.1:9480")
    if s.listen == s.metrics_listen:
        raise bad("metrics_listen", "is the same address as listen; give /metrics its own port")
    if s.store_dir and Path(s.store_dir).exists() and not Path(s.store_dir).is_dir():
        raise bad("store_dir", "exists and is not a directory; point it at a directory")
    if s.flush_rows < 1:
        raise bad("flush_rows", "must be at least 1")
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
    if s.recent_steps_per_job < 1:
        raise bad("recent_steps_per_job", "must be at least 1")
    if s.max_message_bytes < 64 * 1024:
        raise bad("max_message_bytes", f"is too small; use at least {64 * 1024}")
    if s.log_level not in LOG_LEVELS:
        raise bad("log_level", "is not one of " + ", ".join(LOG_LEVELS))


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror}); check the --config path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: is not valid YAML ({exc}); fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of setting: value, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; known settings are {', '.join(_FIELDS)}"
        )
    return data


def build_parser() -> argparse.ArgumentParser:
    """The ``chopper-aggregator`` flags: one per setting, plus ``--config``."""
    parser = argparse.ArgumentParser(
        prog="chopper-aggregator",
        description="Chopper cluster aggregator: joins agents' step summaries by (job, step), names stragglers, "
        f"serves gRPC and /metrics, writes Parquet. Every flag also reads {ENV_PREFIX}<NAME> from the environment.",
    )
    parser.add_argument("--config", type=Path, help=f"YAML settings file (env {ENV_PREFIX}CONFIG)")
    for f in dataclasses.fields(AggregatorSettings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar=f.name.upper(),
            help=f"{f.metadata['help']} (env {ENV_PREFIX}{f.name.upper()})",
        )
    return parser


def load_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> AggregatorSettings:
    """Merge defaults, YAML, environment and flags into validated settings.

    Args:
        argv: Command-line arguments (without the program name).
        env: Environment to read ``CHOPPER_AGGREGATOR_*`` from; defaults to ``os.environ``.

    Raises:
        ConfigError: A value is malformed or out of range.
    """
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    config_path = args.config or (Path(env[ENV_PREFIX + "CONFIG"]) if env.get(ENV_PREFIX + "CONFIG") else None)
    if config_path is not None:
        for key, raw in _read_yaml(config_path).items():
            values[key] = _parse(key, raw, f"config file {config_path}")
    for name in _FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _parse(name, raw, f"env {ENV_PREFIX}{name.upper()}")
    for name in _FIELDS:
        raw = getattr(args, name)
        if raw is not None:
            values[name] = _parse(name, raw, "--" + name.replace("_", "-"))
    settings = AggregatorSettings(**values)
    _check(settings)
    return settings


def markdown() -> str:
    """``docs/AGGREGATOR_CONFIG.md``: every setting (``python -m aggregator.config``)."""
    lines = [
        "# Aggregator settings",
        "",
        "Generated from `aggregator/config.py` by `python -m aggregator.config > docs/AGGREGATOR_CONFIG.md`; a test",
        "keeps it current. Precedence: code defaults < YAML file (`--config`, keys as in the first column) <",
        "environment < flags. A bad value exits with status 2 and a message naming the key and the fix.",
        "",
        "| setting | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(AggregatorSettings):
        lines.append(
            f"| `{f.name}` | `--{f.name.replace('_', '-')}` | `{ENV_PREFIX}{f.name.upper()}` | `{f.default!r}` "
            f"| {f.metadata['help']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
