"""Every signal a service manager or an operator may send, to both real daemons: none kills silently.

A signal whose default action ends the process (SIGHUP, SIGUSR1, SIGALRM, ...) killed both daemons
without a log line and left the agent's socket behind. Each test here sends real signals to a real
daemon process and reads what it did from its exit status, its socket and its log
(``chopper/daemon/stopsignals.py`` says what each signal does): SIGHUP re-checks the files taken up while
running and the daemon keeps serving; signals with no use are logged, with one line per signal per
poll however many arrive, and ignored; the stop signals stop cleanly and remove the socket; a fault
leaves every thread's traceback.
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from chopper.daemon.stopsignals import POLL_S, signal_name
from chopper.runs import consumer
from tests.support.daemons import AgentProcess, AggregatorProcess, Daemon
from tests.support.fake_systemd import FakeSystemd
from tests.support.hazards import HazardOutcome
from tests.support.pki import write_token
from tests.support.polling import wait_until

# Signals that mean nothing to the daemons: each must be logged and survived. SIGHUP re-checks files.
IGNORED = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO,
           signal.SIGPWR, signal.SIGSTKFLT, signal.SIGRTMIN, signal.SIGRTMAX]
FLOOD = 500


def _send(daemon: Daemon, sig: int) -> None:
    assert daemon.proc is not None
    os.kill(daemon.proc.pid, sig)


def _logged(daemon: Daemon, pattern: str, timeout_s: float = 10.0) -> bool:
    return wait_until(lambda: re.search(pattern, daemon.log()) is not None, timeout_s=timeout_s)


def _survives_signals(daemon: Daemon) -> tuple[list[str], int]:
    """Send SIGHUP and every ignored signal, then a flood of SIGUSR1; returns the names logged and the flood's lines."""
    assert daemon.proc is not None
    _send(daemon, signal.SIGHUP)
    assert _logged(daemon, r"event=reloaded signal=SIGHUP"), daemon.log()
    for sig in IGNORED:
        _send(daemon, sig)
    logged = [signal_name(sig) for sig in IGNORED
              if _logged(daemon, rf"event=signal_ignored signal={re.escape(signal_name(sig))} count=")]
    before = daemon.log().count("signal=SIGUSR1 ")
    for _ in range(FLOOD):
        _send(daemon, signal.SIGUSR1)
    # A loaded machine may not run the daemon's main thread for seconds; it logs at its next poll.
    assert _logged(daemon, r"(?s)signal=SIGUSR1 .*signal=SIGUSR1 ", timeout_s=60.0), daemon.log()
    time.sleep(4 * POLL_S)  # the rest of the flood is logged at the next polls, if it is
    assert daemon.proc.poll() is None, daemon.log()
    return logged, daemon.log().count("signal=SIGUSR1 ") - before


@pytest.mark.slow
@pytest.mark.hazard(item=15, input="SIGHUP, SIGUSR1/2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, "
                    "SIGRTMIN, SIGRTMAX and 500 x SIGUSR1 to a running agent, then SIGTERM",
                    promise="SIGHUP re-checks the token file and TLS files; the others are logged and the agent "
                    "keeps serving; a stop removes the socket; never a death without a log line")
def test_agent_outlives_signals_and_reports_them(tmp_path: Path, hazard: HazardOutcome,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "capture.token"
    write_token(token, "first")
    systemd = FakeSystemd(str(tmp_path / "notify.sock"))
    monkeypatch.setenv("NOTIFY_SOCKET", systemd.address)
    agent = AgentProcess(tmp_path, "--token-file", str(token)).start()
    assert agent.proc is not None
    try:
        assert systemd.recv()["READY"] == "1"
        logged, flood_lines = _survives_signals(agent)
        # systemctl reload waits for these: RELOADING=1 with the time, then READY=1 once re-checked.
        told = systemd.pending()
        assert [m.get("RELOADING") or m.get("READY") for m in told[:2]] == ["1", "1"], told
        assert "RELOADING" in told[0] and int(told[0]["MONOTONIC_USEC"]) > 0 and "READY" in told[1], told
        consumer.wait_for_info(agent.target, timeout_s=5.0)  # still serving
        token.write_text("")  # a bad replacement: SIGHUP reports it, the tokens in use stay
        _send(agent, signal.SIGHUP)
        assert _logged(agent, r"event=reload_failed signal=SIGHUP .*token_file .*holds no token"), agent.log()
        assert agent.proc.poll() is None
    finally:
        code = agent.terminate()
        systemd.sock.close()
    assert logged == [signal_name(sig) for sig in IGNORED], agent.log()
    assert flood_lines <= FLOOD // 10, f"{flood_lines} lines for {FLOOD} signals"
    assert code == 0 and not agent.socket.exists(), agent.log()
    assert "event=stopping signal=SIGTERM" in agent.log() and "event=stopped" in agent.log()
    hazard.outcome = (f"alive and serving after SIGHUP (files re-checked, logged, RELOADING=1 then READY=1 to "
                      f"systemd) and {len(logged)} other signals, "
                      f"each logged; {FLOOD} x SIGUSR1 gave {flood_lines} log lines; an emptied token file on SIGHUP "
                      f"logged reload_failed naming it; SIGTERM: exit {code}, socket removed")


@pytest.mark.slow
@pytest.mark.hazard(item=15, input="SIGHUP, SIGUSR1/2, SIGALRM and 7 other unused signals, 500 x SIGUSR1 to a "
                    "running aggregator, then SIGTERM",
                    promise="each logged and survived, the aggregator keeps serving; SIGTERM stops it cleanly")
def test_aggregator_outlives_signals_and_reports_them(tmp_path: Path, hazard: HazardOutcome) -> None:
    aggregator = AggregatorProcess(tmp_path, "agg", "--store-dir", str(tmp_path / "store")).start()
    assert aggregator.proc is not None
    try:
        logged, flood_lines = _survives_signals(aggregator)
        assert aggregator.query("no-such-job") == []  # still serving
    finally:
        aggregator.stop()
    assert logged == [signal_name(sig) for sig in IGNORED], aggregator.log()
    assert flood_lines <= FLOOD // 10
    assert aggregator.proc.returncode == 0 and "event=stopping signal=SIGTERM" in aggregator.log()
    hazard.outcome = (f"alive and serving QuerySteps after SIGHUP and {len(logged)} other signals, each logged; "
                      f"{FLOOD} x SIGUSR1 gave {flood_lines} log lines; SIGTERM: exit "
                      f"{aggregator.proc.returncode}")


@pytest.mark.slow
@pytest.mark.parametrize(("daemon", "sig"), [("agent", signal.SIGQUIT), ("aggregator", signal.SIGXCPU)])
def test_other_stop_signals_stop_cleanly(tmp_path: Path, daemon: str, sig: signal.Signals) -> None:
    process: Daemon = AgentProcess(tmp_path).start() if daemon == "agent" else AggregatorProcess(tmp_path).start()
    assert process.proc is not None
    _send(process, sig)
    assert process.proc.wait(15) == 0, process.log()
    assert f"event=stopping signal={sig.name}" in process.log() and "event=stopped" in process.log()
    if isinstance(process, AgentProcess):
        assert not process.socket.exists()


@pytest.mark.slow
@pytest.mark.hazard(item=15, input="SIGABRT (systemd's watchdog signal) to a running agent",
                    promise="never a death without a log line: every thread's traceback is written before it dies")
def test_a_fault_leaves_every_threads_traceback(tmp_path: Path, hazard: HazardOutcome) -> None:
    agent = AgentProcess(tmp_path).start()
    assert agent.proc is not None
    _send(agent, signal.SIGABRT)
    code = agent.proc.wait(15)
    log = agent.log()
    threads = len(re.findall(r"^(?:Thread|Current thread) 0x", log, re.MULTILINE))
    assert code == -signal.SIGABRT and "Fatal Python error: Aborted" in log, log[-2000:]
    assert threads >= 3, log[-3000:]  # main, sampler, gRPC and HTTP threads at least
    hazard.outcome = f"exit {code} (SIGABRT) with 'Fatal Python error: Aborted' and the tracebacks of {threads} threads"


@pytest.mark.slow
def test_a_stop_removes_the_socket_and_nothing_else(tmp_path: Path) -> None:
    """A regular file put at socket_path while the agent runs is still there, intact, after SIGTERM."""
    agent = AgentProcess(tmp_path).start()
    agent.socket.unlink()
    agent.socket.write_bytes(b"operator's data\n")
    assert _logged(agent, r"event=socket_not_recreated"), agent.log()  # the keeper leaves it alone too
    assert agent.terminate() == 0, agent.log()
    assert agent.socket.read_bytes() == b"operator's data\n"
    assert "event=socket_path_replaced" in agent.log()
