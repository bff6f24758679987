"""The agent's one typed settings object: code defaults < YAML file < ``CHOPPER_AGENT_*`` env < flags.

Every setting has a flag (``--sample-hz``) and an environment variable
(``CHOPPER_AGENT_SAMPLE_HZ``); the YAML file uses the field names (``sample_hz: 100``). Settings are
validated once at start; a bad value raises ``ConfigError`` naming the key, the value, where it
came from and what is accepted, and ``chopper-agent`` exits non-zero with that message.
"""
from __future__ import annotations

import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from agent import fields
from chopper.daemon import settings as _settings
from chopper.daemon.serving import access_field, check_server_access
from chopper.daemon.settings import MAX_MESSAGE_BYTES, ConfigError, check_job_label, is_host_port, job_label_field

BACKENDS = ("auto", "amd", "nvidia", "simulated", "replay")
ENV_PREFIX = "CHOPPER_AGENT_"


@dataclass(frozen=True)
class AgentSettings:
    """Everything ``chopper-agent`` can be told. Units are in the names."""

    node: str = field(default_factory=socket.gethostname, metadata={"help": "node name in every row and label"})
    backend: str = field(default="auto", metadata={"help": "GPU backend: " + ", ".join(BACKENDS)})
    sample_hz: float = field(default=10.0, metadata={"help": "sampling rate, 1-100 Hz"})
    socket_path: str = field(
        default="/run/chopper/agent.sock", metadata={"help": "unix socket for trainers and local consumers"}
    )
    socket_mode: str = field(
        default="0660", metadata={"help": "permission bits of the unix socket, octal however written (0660, 660, "
                                  "0o660)", "kind": "mode"}
    )
    socket_group: str = field(default="", metadata={"help": "group owning the unix socket (empty: unchanged)"})
    grpc_listen: str = field(
        default="", metadata={"help": "optional TCP host:port for gRPC (empty: none; port 0: a free port, logged)"}
    )
    metrics_listen: str = field(
        default="127.0.0.1:9477", metadata={"help": "host:port of Prometheus /metrics (port 0: a free port, logged)"}
    )
    # Ring buffers are bounded by memory (docs/PERFORMANCE.md, agent/buffers.py) and, as before, by items.
    sample_buffer_mib: float = field(
        default=10.0, metadata={"help": "memory for buffered samples, MiB (all GPUs; ~190 B a sample)"}
    )
    marker_buffer_mib: float = field(default=6.0, metadata={"help": "memory for buffered markers, MiB (~105 B each)"})
    summary_buffer_mib: float = field(
        default=6.0, metadata={"help": "memory for buffered step summaries (the delivery resend store), MiB"}
    )
    collective_buffer_mib: float = field(
        default=2.0, metadata={"help": "memory for buffered NCCL/RCCL Inspector collective records, MiB"}
    )
    sample_buffer: int = field(default=600_000, metadata={"help": "samples kept in memory at most (all GPUs)"})
    marker_buffer: int = field(default=1_000_000, metadata={"help": "markers (and Inspector records) kept at most"})
    max_message_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "largest accepted gRPC message"})
    # Access control (docs/SECURITY.md). Secrets are files, never values: a flag shows in ps.
    token_file: str = field(
        default="", metadata={"help": "file of bearer tokens, one per line, that RequestCapture must carry (empty: "
                              "no token needed)"}
    )
    tls_cert: str = access_field("tls_cert", "grpc_listen")
    tls_key: str = access_field("tls_key", "grpc_listen")
    tls_client_ca: str = access_field("tls_client_ca", "grpc_listen")
    rate_limit_calls_per_s: float = access_field("rate_limit_calls_per_s", "grpc_listen")
    rate_limit_messages_per_s: float = access_field("rate_limit_messages_per_s", "grpc_listen")
    aggregator_tls_ca: str = field(
        default="", metadata={"help": "PEM CA bundle of the aggregators' certificates: delivery uses TLS (empty: "
                              "plaintext unless aggregator_tls_cert is set)"}
    )
    aggregator_tls_cert: str = field(
        default="", metadata={"help": "PEM client certificate for mutual TLS to the aggregators (with its key)"}
    )
    aggregator_tls_key: str = field(default="", metadata={"help": "PEM private key of aggregator_tls_cert"})
    peak_flops: float = field(default=0.0, metadata={"help": "override peak dense BF16 FLOP/s per GPU (0: spec)"})
    job_label: str = job_label_field()
    metrics_profile: str = field(default="full", metadata={"help": (
        "families /metrics exports: full (all), standard (all but per-link byte series), gpu (GPU, host and agent "
        "series, no training-job series); docs/METRICS.md, cost per family in docs/PERFORMANCE.md (metric_cost)")})
    metrics_exclude: tuple[str, ...] = field(default=(), metadata={"help": (
        "metric names or shell patterns (chopper_inspector_*) left out of metrics_profile; the agent's own health "
        "series always stay")})
    sim_model: str = field(default="MI300X", metadata={"help": "simulated backend: GPU model"})
    sim_gpus: int = field(default=8, metadata={"help": "simulated backend: number of GPUs"})
    sim_seed: int = field(default=0, metadata={"help": "simulated backend: random seed"})
    sim_hot_gpus: tuple[int, ...] = field(
        default=(), metadata={"help": "simulated backend: comma-separated GPUs with poor cooling"}
    )
    sim_power_cap_w: float = field(
        default=0.0, metadata={"help": "simulated backend: power cap of every GPU, W (0: the model's TDP)"}
    )
    sim_health_events: tuple[str, ...] = field(
        default=(), metadata={"help": "simulated backend: health events GPU:KIND:AT_S[:COUNT[:DETAIL]], "
                              "comma-separated or a YAML list (GPU a chip, KIND one of chopper.schema.ERROR_KINDS "
                              "that the model's vendor reports, AT_S seconds after the first sample), e.g. "
                              "3:ecc_corrected:20:50 (50 corrected ECC "
                              "errors over 2 s) or 1:xid:30:1:79 (docs/HEALTH.md)"}
    )
    sim_partition: str = field(
        default="", metadata={"help": "simulated backend: partition of every chip, which then shows as several "
                              "GPUs: DPX, QPX or CPX on AMD models, a MIG profile such as 3g.40gb on NVIDIA "
                              "models; empty: whole chips (sim_gpus counts chips either way)"}
    )
    sim_memory_partition: str = field(
        default="", metadata={"help": "simulated backend: AMD memory partition NPS1 or NPS4 (NPS4 with CPX only); "
                              "empty: none"}
    )
    replay_dir: str = field(default="", metadata={"help": "replay backend: recorded run directory"})
    replay_speed: float = field(default=1.0, metadata={"help": "replay backend: playback speed factor"})
    summary_buffer: int = field(
        default=100_000, metadata={"help": "step summaries kept in memory at most (the delivery resend store)"}
    )
    aggregators: str = field(
        default="",
        metadata={"help": "aggregator replicas for step summaries: host:port,... or dns:///service:port "
                  "(headless service, re-resolved); empty: no delivery"},
    )
    delivery_batch: int = field(default=512, metadata={"help": "most step summaries per delivered batch"})
    delivery_interval_s: float = field(
        default=0.1, metadata={"help": "how often new step summaries are routed and sent, s"}
    )
    delivery_resolve_s: float = field(
        default=30.0, metadata={"help": "how often a dns:/// aggregator name is resolved again, s"}
    )
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    job_mapping_dir: str = field(
        default="", metadata={"help": "directory of per-GPU job id files that the Slurm prolog writes "
                              "(deploy/slurm); empty: off"},
    )
    pod_resources_socket: str = field(
        default="", metadata={"help": "the kubelet's pod-resources socket, to label GPUs with pod, namespace and "
                              "container (/var/lib/kubelet/pod-resources/kubelet.sock); empty: off"},
    )
    workload_refresh_s: float = field(
        default=5.0, metadata={"help": "how often GPU owners are read from job_mapping_dir and the kubelet, s"}
    )
    rank_idle_s: float = field(
        default=300.0, metadata={"help": "forget a (job, rank) and its /metrics series once no rank of its job has "
                                 "sent a marker for this long (not while it has a step open), s"}
    )
    inspector_dir: str = field(
        default="", metadata={"help": "directory the NCCL/RCCL Inspector profiler plugin dumps into "
                              "(NCCL_INSPECTOR_DUMP_DIR of the jobs, or its parent; docs/INSPECTOR.md); empty: off"},
    )
    inspector_poll_s: float = field(
        default=0.5, metadata={"help": "how often inspector_dir is read for new records, s"}
    )
    inspector_wait_s: float = field(
        default=3.0, metadata={"help": "how long a step summary of a rank with Inspector records waits for the "
                               "records that cover its end (the plugin writes them on its dump interval), s"}
    )
    max_ranks: int = field(
        default=1024, metadata={"help": "(job, rank)s tracked at most; a new one takes the place of one without "
                                "an open step (or silent for rank_idle_s), else its markers are refused as "
                                "too_many_ranks"}
    )


def _check(s: AgentSettings) -> None:
    """Range and consistency checks that a type alone does not express."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{key}: {getattr(s, key)!r} {why}")

    if not s.node.strip():
        raise bad("node", "is empty; name the node, or leave the setting out for the hostname")
    if s.backend not in BACKENDS:
        raise bad("backend", f"is not a backend; choose one of {', '.join(BACKENDS)}")
    if not 1.0 <= s.sample_hz <= 100.0:
        raise bad("sample_hz", "is out of range; use 1 to 100 samples per second")
    if not s.socket_path:
        raise bad("socket_path", "is empty; trainers need a unix socket path")
    # Connecting needs write permission: a mode without it for the owner is a typo (432 for 0660).
    if not (mode := int(s.socket_mode, 8)) & 0o200:
        raise bad("socket_mode", f"({stat.filemode(mode)[1:]}) gives the agent's own user no write permission, so it "
                  "is mistyped; use 0660 (owner and socket_group) or 0600 (owner only)")
    for key in ("metrics_listen", "grpc_listen"):
        value = getattr(s, key)
        if value and not is_host_port(value):
            raise bad(key, "is not host:port, e.g. 127.0.0.1:9477")
    if not s.metrics_listen:
        raise bad("metrics_listen", "is empty; Prometheus needs an address to scrape")
    # Upper bounds: a buffer past 100 M items is tens of GB on its own; gRPC takes message limits as
    # int32 and the servers accept up to twice max_message_bytes (chopper/daemon/serving.py).
    mib = [(f"{name}_buffer_mib", 0.1, 65536) for name in ("sample", "marker", "summary", "collective")]
    for key, low, high in (("sample_buffer", 1000, 100_000_000), ("marker_buffer", 1000, 100_000_000),
                           ("summary_buffer", 1000, 100_000_000), ("max_message_bytes", 64 * 1024, MAX_MESSAGE_BYTES),
                           *mib):
        if not low <= getattr(s, key) <= high:
            raise bad(key, f"is out of range; use {low} to {high}")
    if (why := check_job_label(s.job_label)) is not None:
        raise bad("job_label", why)
    try:
        fields.selected(s.metrics_profile, s.metrics_exclude)
    except fields.FieldSelectionError as exc:
        key = "metrics_exclude" if s.metrics_profile in fields.PROFILES else "metrics_profile"
        raise ConfigError(f"{key}: {exc}") from None
    if s.peak_flops < 0:
        raise bad("peak_flops", "is negative; use 0 for the data-sheet value or a FLOP/s figure")
    if s.sim_gpus < 1 or s.sim_gpus > 64:
        raise bad("sim_gpus", "is out of range; simulate 1 to 64 GPUs")
    if any(g < 0 or g >= s.sim_gpus for g in s.sim_hot_gpus):
        raise bad("sim_hot_gpus", f"names a GPU outside 0..{s.sim_gpus - 1}")
    if s.sim_power_cap_w < 0:
        raise bad("sim_power_cap_w", "is negative; use 0 for the model's TDP or a cap in watts, e.g. 400")
    _check_simulated_health_and_partitions(s, bad)
    if s.backend == "replay" and not s.replay_dir:
        raise ConfigError("replay_dir: required with backend replay; pass --replay-dir RUN_DIR")
    if s.replay_speed <= 0:
        raise bad("replay_speed", "must be positive, e.g. 1 for recorded pace or 10 for ten times faster")
    if s.aggregators:
        from agent.delivery import parse_targets

        try:
            parse_targets(s.aggregators)
        except ValueError as exc:
            raise bad("aggregators", f"is not valid: {exc}") from None
    if not 1 <= s.delivery_batch <= 10_000:
        raise bad("delivery_batch", "is out of range; use 1 to 10000 summaries")
    if not 0.001 <= s.delivery_interval_s <= 10:
        raise bad("delivery_interval_s", "is out of range; use 0.001 to 10 seconds")
    if s.delivery_resolve_s < 1:
        raise bad("delivery_resolve_s", "is too small; resolve at most once a second")
    if s.log_level not in ("debug", "info", "warning", "error"):
        raise bad("log_level", "is not one of debug, info, warning, error")
    for key in ("job_mapping_dir", "pod_resources_socket", "inspector_dir"):
        if getattr(s, key) and not getattr(s, key).startswith("/"):
            raise bad(key, "is not an absolute path; give the full path or leave it empty to turn this off")
    if not 0.5 <= s.workload_refresh_s <= 300:
        raise bad("workload_refresh_s", "is out of range; use 0.5 to 300 seconds")
    if not 0.05 <= s.inspector_poll_s <= 60:
        raise bad("inspector_poll_s", "is out of range; use 0.05 to 60 seconds")
    if not 0 <= s.inspector_wait_s <= 120:
        raise bad("inspector_wait_s", "is out of range; use 0 to 120 seconds (0: never wait for the Inspector)")
    if not 1 <= s.rank_idle_s <= 7 * 24 * 3600:
        raise bad("rank_idle_s", "is out of range; use 1 s to a week")
    if not 1 <= s.max_ranks <= 1_000_000:
        raise bad("max_ranks", "is out of range; use 1 to 1000000")
    check_access(s)


def _check_simulated_health_and_partitions(s: AgentSettings, bad: Callable[[str, str], ConfigError]) -> None:
    """``sim_partition``, ``sim_memory_partition`` and ``sim_health_events`` against ``sim_model``."""
    if not (s.sim_health_events or s.sim_partition or s.sim_memory_partition):
        return  # sim_model is only looked up when one of these needs its vendor
    from agent.backends import sim_health, specs

    spec = specs.SPECS.get(s.sim_model) or specs.SPECS.get(s.sim_model.upper())
    if spec is None:
        raise bad("sim_model", f"is not a simulated GPU model; choose one of {', '.join(specs.SPECS)}")
    try:
        specs.partition_layout(spec, s.sim_partition, s.sim_memory_partition)
    except specs.PartitionError as exc:
        raise bad("sim_" + exc.setting, exc.why) from None
    try:
        sim_health.parse_events(s.sim_health_events, spec.vendor, s.sim_gpus)
    except ValueError as exc:
        raise bad("sim_health_events", str(exc)) from None


def check_access(s: AgentSettings) -> None:
    """TLS, token and rate-limit settings: files readable and loadable, pairs complete.

    Run at start and again on SIGHUP (``agent/main.py``), so that replaced files are checked at once.

    Raises:
        ConfigError: A file is unreadable or does not load, or a pair is incomplete.
    """
    from chopper.daemon.auth import TokenFile
    from chopper.daemon.tls import ClientTLS

    check_server_access(s, "grpc_listen")
    if s.token_file:
        TokenFile(s.token_file)
    if s.aggregator_tls_ca or s.aggregator_tls_cert or s.aggregator_tls_key:
        ClientTLS(s.aggregator_tls_ca, s.aggregator_tls_cert, s.aggregator_tls_key,
                  names=("aggregator_tls_ca", "aggregator_tls_cert", "aggregator_tls_key"))


DAEMON = _settings.Daemon(
    AgentSettings, _check, prog="chopper-agent",
    description="Chopper node agent: samples GPUs, receives training markers, serves gRPC and /metrics.",
    env_prefix=ENV_PREFIX, module="agent.config", doc="docs/CONFIG.md", title="Agent settings",
    shown_defaults={"node": "(hostname)"},
)
# load_settings(argv=None, env=None) -> AgentSettings; markdown() -> docs/CONFIG.md (python -m agent.config).
load_settings = DAEMON.load
markdown = DAEMON.markdown


__all__ = ["AgentSettings", "ConfigError", "check_access", "load_settings", "markdown"]


if __name__ == "__main__":
    print(markdown(), end="")
