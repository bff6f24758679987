"""A plaintext TCP listener is said out loud at start: on loopback every local user can reach it.

A unix socket is guarded by its file mode and group; a TCP port by nothing, loopback included. So
each daemon logs ``event=plaintext_listen`` naming the setting and the fix for every plaintext TCP
listener, and none for its unix socket or a TLS listener (docs/SECURITY.md, "Safe configurations").
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import chopper
from chopper.daemon.access import Refusals
from chopper.daemon.serving import SecureServer
from chopper.daemon.tls import ServerTLS
from chopper.demo.run import free_port, metric_sum
from tests.support.daemons import AgentProcess
from tests.support.hazards import HazardOutcome
from tests.support.pki import Pki
from tests.support.polling import wait_until


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.hazard(item=5, input="agent with --grpc-listen 127.0.0.1:PORT and no TLS",
                    promise="a plaintext TCP listener is logged at start as a warning naming the setting and the "
                    "fix, loopback included; the unix socket alone logs none")
def test_a_plaintext_loopback_listener_is_warned_about_because_any_local_user_can_forge_markers(
        tmp_path: Path, hazard: HazardOutcome) -> None:
    listen = f"127.0.0.1:{free_port()}"
    (tmp_path / "tcp").mkdir()
    (tmp_path / "unix").mkdir()
    tcp = AgentProcess(tmp_path / "tcp", "--grpc-listen", listen).start()
    unix_only = AgentProcess(tmp_path / "unix").start()
    try:
        # What the warning is about: any local process, whatever its user and groups, pushes markers in
        # a job's name over the port; the socket's mode and group never come into it.
        client = chopper.Client("forged", 0, 0, listen, control=False)
        for i in range(3):
            with client.step(i):
                time.sleep(0.01)
        client.shutdown(timeout=5.0)
        assert wait_until(lambda: metric_sum(tcp.metrics(), "chopper_rank_markers_received_total",
                                             training_job="forged") == 6, timeout_s=20)
        warned = [line for line in tcp.log().splitlines() if "event=plaintext_listen" in line]
        assert len(warned) == 1 and f"grpc_listen={listen}" in warned[0] and "WARNING" in warned[0].upper(), warned
        assert "every local user can connect" in warned[0] and "tls_cert" in warned[0], warned
        assert "event=plaintext_listen" not in unix_only.log()
        hazard.outcome = (f"1 warning at start naming grpc_listen={listen} and tls_cert/tls_key/tls_client_ca; 6 of 6 "
                          "markers of a job pushed over the port accepted (why it is warned); 0 warnings for the "
                          "unix socket alone")
    finally:
        tcp.terminate()
        unix_only.terminate()


def test_no_warning_for_a_tls_listener_and_one_for_any_other_plaintext_address(
        pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    server = SecureServer([], [], Refusals(), max_workers=2, max_message_bytes=1 << 16, max_send_bytes=1 << 16,
                          calls_per_s=0, messages_per_s=0)
    with caplog.at_level(logging.WARNING, logger="chopper.daemon.serving"):
        server.add_tcp("127.0.0.1:0", ServerTLS(pki.server.cert, pki.server.key, pki.ca))
        assert "plaintext_listen" not in caplog.text
        server.add_tcp("[::1]:0", None)
        server.add_tcp("0.0.0.0:0", None, key="grpc_listen")
    server.stop(0)
    lines = [r.getMessage() for r in caplog.records if "plaintext_listen" in r.getMessage()]
    assert len(lines) == 2 and "every local user" in lines[0] and "reachable from the network" in lines[1], lines
