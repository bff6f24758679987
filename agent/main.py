"""``chopper-agent``: the per-node daemon. Runs until SIGTERM, SIGINT, SIGQUIT or SIGXCPU, then stops cleanly.

SIGHUP makes the running agent take its token file and TLS files now, as it would at their next
use, and reports a refused one at once (what was in force stays; ``chopper.daemon.auth.recheck``); other
signals are logged and ignored, and faults dump every thread's traceback (``chopper/daemon/stopsignals.py``).
Other settings take a restart.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from agent import fields
from agent.backends.base import BackendUnavailable
from agent.backends.select import select_backend
from agent.capture import log_access
from agent.config import AgentSettings, ConfigError, check_access, load_settings
from agent.control_socket import ControlSocket
from agent.daemon import Agent
from agent.host import HostSampler
from agent.marker_socket import MarkerSocket
from agent.marker_streams import MarkerStreams
from agent.metrics import AgentCollector
from agent.seqpacket import SeqpacketServer
from agent.server import TelemetryHub, build_server
from agent.unix_socket import SocketInUse, SocketKeeper, remove_socket
from chopper.daemon import sdnotify
from chopper.daemon.auth import Reloaded, recheck
from chopper.daemon.entrypoint import run_daemon
from chopper.daemon.metrics_http import serve_metrics
from chopper.daemon.serving import SecureServer
from chopper.daemon.stopsignals import StopSignals
from chopper.daemon.text_format import Registry

log = logging.getLogger("agent")
# The sampler counts as hung (systemd's watchdog then restarts the agent) after this long without a
# tick: far beyond the slowest healthy tick (1 Hz, one vendor call per GPU), short of WatchdogSec.
SAMPLER_STALE_S = 5.0


def main(argv: Sequence[str] | None = None) -> int:
    """Start the agent; returns 0 after a clean stop, 2 on a configuration or startup error."""
    return run_daemon("chopper-agent", argv, load_settings, _recheck_files, _serve)


def _recheck_files(settings: AgentSettings) -> str:
    """SIGHUP before the agent serves: check the files it will take up; raises ConfigError naming a bad one."""
    files = [key for key in ("token_file", "tls_cert", "tls_key", "tls_client_ca", "aggregator_tls_ca",
                             "aggregator_tls_cert", "aggregator_tls_key") if getattr(settings, key)]
    if not files:
        return "no token_file or TLS files configured; other settings take a restart"
    check_access(settings)
    return (f"{', '.join(files)} load; the token file is taken at the next RequestCapture, server certificates at "
            "the next connection, aggregator ones at the next reconnect; other settings take a restart")


def _serve(settings: AgentSettings, stop: StopSignals) -> int:
    """Start serving with ``settings``; returns 0 after a clean stop, 2 on a startup error."""
    hub = TelemetryHub()
    try:
        backend = select_backend(settings)
        agent = Agent(settings, backend, HostSampler(), notify=hub.notify)
        agent.open_backend()
    except (BackendUnavailable, ValueError) as exc:
        print(f"chopper-agent: backend {settings.backend!r} cannot run here: {exc}", file=sys.stderr)
        return 2
    # /metrics first: an agent that cannot bind it exits before any trainer or consumer reached its socket.
    registry = Registry()
    collector = AgentCollector(agent.view, job_label=settings.job_label,
                               exported=fields.selected(settings.metrics_profile, settings.metrics_exclude))
    registry.register(collector)
    try:
        httpd, metrics_thread, metrics_addr = serve_metrics(settings.metrics_listen, registry)
    except OSError as exc:
        print(f"chopper-agent: {exc}", file=sys.stderr)
        agent.stop()
        return 2
    markers = MarkerStreams(agent)
    try:
        server, grpc_bound = build_server(agent, hub, settings, markers)
    except (SocketInUse, ConfigError, OSError, RuntimeError) as exc:
        print(f"chopper-agent: cannot serve gRPC: {exc}", file=sys.stderr)
        httpd.shutdown()
        agent.stop()
        return 2
    # Beside gRPC's socket, trainers' markers and Control streams on sockets that hold no thread per trainer.
    trainer_sockets: list[SeqpacketServer] = []
    try:
        trainer_sockets.append(MarkerSocket(markers, settings).start())
        trainer_sockets.append(ControlSocket(agent, settings).start())
    except (SocketInUse, ConfigError, OSError) as exc:
        print(f"chopper-agent: cannot serve the {'control' if trainer_sockets else 'marker'} socket: {exc}",
              file=sys.stderr)
        for served in trainer_sockets:
            served.stop()
        server.stop(0)
        httpd.shutdown()
        agent.stop()
        remove_socket(settings.socket_path)
        return 2
    marker_socket, control_socket = trainer_sockets
    agent.start()
    if int(settings.socket_mode, 8) & 0o006:
        log.warning("event=socket_open_to_all_users socket=%s mode=%s note='every local user can push markers for "
                    "any job and subscribe; use 0660 with socket_group for the trainers'", settings.socket_path,
                    settings.socket_mode)
    log.info(
        "event=started node=%s backend=%s gpus=%d socket=%s markers=%s control=%s grpc=%s metrics=http://%s/metrics "
        "sample_hz=%g", settings.node, backend.name, len(agent.devices), settings.socket_path, marker_socket.path,
        control_socket.path, grpc_bound or "-", metrics_addr, settings.sample_hz,
    )
    log_access(settings)
    supervision = sdnotify.Supervision(
        [sdnotify.ProgressCheck("sampler", lambda: agent.ticker.ticks_total, SAMPLER_STALE_S),
         sdnotify.thread_check("metrics", metrics_thread)],
        f"serving node={settings.node} backend={backend.name} gpus={len(agent.devices)}",
    )
    supervision.start()
    files = _running_files(server, agent)
    collector.files.update(files)
    stop.reload = lambda: supervision.reload(lambda: f"{recheck(files)}; other settings take a restart")
    keeper = SocketKeeper(server, settings, agent.socket_served_again).start()
    stop.wait()
    log.info("event=stopping signal=%s", stop.received or "-")
    supervision.stop()
    keeper.stop()
    for served in trainer_sockets:
        served.stop()
    server.stop(grace=2.0).wait(5.0)
    agent.stop()
    httpd.shutdown()
    remove_socket(settings.socket_path)
    log.info("event=stopped")
    return 0


def _running_files(server: SecureServer, agent: Agent) -> dict[str, Reloaded]:
    """The file sets the running agent re-reads, by name: the objects in use, so their own state answers.

    A fresh read would not know what they learned while running (a token file once writable by
    others stays refused, ``chopper.daemon.auth``).
    """
    files: dict[str, Reloaded] = {}
    if server.access.tokens is not None:
        files["token_file"] = server.access.tokens
    tls = server.tls
    if tls is not None:
        files["tls"] = tls.files
    if agent.delivery is not None and agent.delivery.tls is not None:
        files["aggregator_tls"] = agent.delivery.tls.files
    return files


if __name__ == "__main__":
    sys.exit(main())
