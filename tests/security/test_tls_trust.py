"""Trust of the TLS files, at start and on every reload, against real daemons and real TLS clients.

Whoever can write ``tls_client_ca`` can add their own CA to it and so pass mutual TLS; whoever can
write a client's CA bundle can stand in for the server. Every TLS file is therefore read as one
that holds trust (``chopper.daemon.tls``): refused at start when others can write it, and refused at a
reload when it has become so, the previous files staying in force.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from chopper.daemon.tls import ClientTLS, ServerTLS
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc
from tests.support.daemons import AgentProcess, AggregatorProcess
from tests.support.hazards import HazardOutcome
from tests.support.pki import Authority, Pki
from tests.support.polling import wait_until

OK, REFUSED = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE


def query(address: str, tls: ClientTLS) -> grpc.StatusCode:
    """One QuerySteps call over a new connection (so a new handshake); its status code."""
    with grpc.secure_channel(address, tls.credentials()) as channel:
        try:
            aggregator_pb2_grpc.AggregatorStub(channel).QuerySteps(apb.QueryStepsRequest(job="j"), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return OK


def server_files(directory: Path, pki: Pki) -> tuple[Path, Path, Path]:
    """Copies of the server's chain, key and client CA bundle, as an operator installs them (0644, key 0600)."""
    directory.mkdir()
    cert, key, ca = directory / "server.pem", directory / "server.key", directory / "client-ca.pem"
    for source, target, mode in ((pki.server.cert, cert, 0o644), (pki.server.key, key, 0o600), (pki.ca, ca, 0o644)):
        shutil.copy(source, target)
        target.chmod(mode)
    return cert, key, ca


@pytest.mark.hazard(item=4, input="a TLS client-CA file made writable by others at run time",
                    promise="refused at reload: the previous CA stays in force, logged and counted")
def test_a_client_ca_made_writable_at_run_time_never_lets_the_ca_added_to_it_in(tmp_path: Path, pki: Pki,
                                                                               hazard: HazardOutcome) -> None:
    cert, key, ca = server_files(tmp_path / "etc", pki)
    agg = AggregatorProcess(tmp_path, "agg", "--tls-cert", str(cert), "--tls-key", str(key),
                            "--tls-client-ca", str(ca)).start()
    assert agg.proc is not None
    trusted = ClientTLS(pki.ca, pki.client_a.cert, pki.client_a.key)
    stranger = ClientTLS(pki.ca, pki.stranger.cert, pki.stranger.key)  # its certificate is from other_ca
    try:
        assert (query(agg.address, trusted), query(agg.address, stranger)) == (OK, REFUSED)

        ca.chmod(0o666)  # the clumsy operator; then anyone adds their own CA
        with ca.open("ab") as bundle:
            bundle.write(Path(pki.other_ca).read_bytes())
        writable = [query(agg.address, c) for c in (stranger, trusted, stranger)]

        ca.chmod(0o644)  # fixing the mode does not launder what was written meanwhile
        fixed = [query(agg.address, c) for c in (stranger, trusted, stranger)]
        refused = {reason: agg.value("chopper_aggregator_tls_reloads_refused_total", reason=reason)
                   for reason in ("unsafe", "tainted", "unusable")}

        os.kill(agg.proc.pid, signal.SIGHUP)  # SIGHUP asks the running server, which remembers
        assert wait_until(lambda: "event=reload_failed signal=SIGHUP" in agg.log()), agg.log()[-2000:]

        fresh = ca.with_name("client-ca.new")  # the way out: a new file moved over the path
        shutil.copy(pki.ca, fresh)
        fresh.chmod(0o644)
        fresh.rename(ca)
        after_mv = [query(agg.address, c) for c in (trusted, stranger)]
        reloads = agg.value("chopper_aggregator_tls_reloads_total")
    finally:
        agg.stop()
    log = agg.log()
    assert writable == [REFUSED, OK, REFUSED] and fixed == [REFUSED, OK, REFUSED], (writable, fixed)
    assert refused == {"unsafe": 1, "tainted": 1, "unusable": 0}, refused
    assert log.count("event=tls_reload_failed") == 2, log[-3000:]  # once per broken state, not per connection
    assert "tls_client_ca" in log and "is writable by every user (mode 0666)" in log
    sighup = re.search(r"event=reload_failed signal=SIGHUP .*", log)
    assert sighup and "tls_client_ca" in sighup[0] and "writable by other users earlier" in sighup[0], log[-3000:]
    assert after_mv == [OK, REFUSED] and reloads == 1
    hazard.outcome = (f"client certificate from the CA appended to the world-writable bundle refused at "
                      f"{writable.count(REFUSED)} of 2 handshakes, and at {fixed.count(REFUSED)} of 2 after chmod "
                      f"0644 back; the trusted client served throughout; refused reloads counted unsafe="
                      f"{refused['unsafe']:g}, tainted={refused['tainted']:g}, logged once each; SIGHUP named the "
                      f"tainted tls_client_ca; a new file mv'd over the path taken ({reloads:g} reload)")


@pytest.mark.slow
@pytest.mark.hazard(item=4, input="tls_client_ca, tls_key or aggregator_tls_ca writable by others at start",
                    promise="a start-up error naming the setting, the file and the fix")
def test_daemons_refuse_to_start_with_tls_files_others_can_write(tmp_path: Path, pki: Pki,
                                                                  hazard: HazardOutcome) -> None:
    cert, key, ca = server_files(tmp_path / "etc", pki)
    server = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(ca)]
    cases = [
        ("tls_client_ca", ca, 0o666, AggregatorProcess(tmp_path / "a", "agg", *server)),
        ("tls_key", key, 0o620, AggregatorProcess(tmp_path / "b", "agg", *server)),
        ("aggregator_tls_ca", ca, 0o602,
         AgentProcess(tmp_path / "c", "--aggregators", "127.0.0.1:1", "--aggregator-tls-ca", str(ca))),
    ]
    outcomes = []
    for setting, path, mode, daemon in cases:
        daemon.workdir.mkdir()
        before = path.stat().st_mode
        path.chmod(mode)
        try:
            proc = subprocess.run(daemon.argv(), capture_output=True, text=True, timeout=60)
        finally:
            path.chmod(before)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{setting} {path}: is writable by" in proc.stderr and "chmod 0640" in proc.stderr, proc.stderr[-2000:]
        outcomes.append(f"{setting} {mode:04o}: exit {proc.returncode}")
    hazard.outcome = "daemon exits 2 naming the setting, the file and the chmod/chown fix: " + "; ".join(outcomes)


def test_a_client_ca_bundle_made_writable_keeps_the_one_in_use_and_counts_it(tmp_path: Path, pki: Pki,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    # The agent's aggregator_tls_ca: read again at each reconnect, through the same checks as the server's files.
    ca = tmp_path / "ca.pem"
    shutil.copy(pki.ca, ca)
    ca.chmod(0o644)
    tls = ClientTLS(str(ca), pki.client_a.cert, pki.client_a.key,
                    names=("aggregator_tls_ca", "aggregator_tls_cert", "aggregator_tls_key"))
    in_use = tls.files.material["aggregator_tls_ca"]
    ca.chmod(0o666)
    with ca.open("ab") as bundle:
        bundle.write(Path(pki.other_ca).read_bytes())
    with caplog.at_level("WARNING", logger="chopper.daemon.tls"):
        for _ in range(3):  # three reconnects
            tls.credentials()
    assert tls.files.material["aggregator_tls_ca"] == in_use
    assert tls.files.refused["unsafe"] == 1 and caplog.text.count("event=tls_reload_failed") == 1, caplog.text
    assert "aggregator_tls_ca" in caplog.text


def test_a_set_taken_on_sighup_is_still_handed_to_grpc_at_the_next_handshake(tmp_path: Path, pki: Pki) -> None:
    cert, key, _ = server_files(tmp_path / "etc", pki)
    tls = ServerTLS(str(cert), str(key))
    assert tls.fetch() is None  # nothing changed since start
    renewed = Authority(tmp_path, "renewed-ca").issue("chopper-server", server=True)
    for source, target in ((renewed.key, key), (renewed.cert, cert)):
        fresh = target.with_suffix(".new")
        shutil.copy(source, fresh)
        fresh.rename(target)
    tls.files.check()  # SIGHUP takes the new set first
    assert tls.files.reloads == 1 and tls.files.material["tls_cert"] == Path(renewed.cert).read_bytes()
    assert tls.fetch() is not None and tls.fetch() is None  # handed over once, then unchanged
