"""sd_notify: the datagrams systemd would receive, from the library and from the real daemons."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sampler import FixedRateTicker
from chopper.daemon.sdnotify import Notifier, ProgressCheck, Supervision, thread_check
from chopper.demo.run import free_port
from chopper.runs import consumer
from tests.support.fake_systemd import FakeSystemd
from tests.support.polling import wait_until


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(str(tmp_path / "notify.sock"))
    yield fake
    fake.sock.close()


def test_path_and_abstract_addresses_receive_key_value_lines(systemd: FakeSystemd) -> None:
    assert Notifier(systemd.address).send(READY=1, STATUS="serving node=n1")
    assert systemd.recv() == {"READY": "1", "STATUS": "serving node=n1"}
    abstract = FakeSystemd(f"@chopper-test-{uuid.uuid4().hex}")
    try:
        assert Notifier(abstract.address).stopping()
        assert abstract.recv() == {"STOPPING": "1", "STATUS": "stopping"}
    finally:
        abstract.sock.close()


def test_without_notify_socket_everything_is_a_no_op() -> None:
    notifier = Notifier.from_env({})
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    assert not notifier.send(READY=1)
    supervision = Supervision([lambda: "never asked"], "serving", notifier)
    supervision.start()
    supervision.stop()
    assert supervision.pings_total == 0


def test_watchdog_interval_is_half_of_watchdog_usec_and_only_for_its_pid(caplog: pytest.LogCaptureFixture) -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000"}
    assert Notifier.from_env(env, pid=42).watchdog_interval_s == 15.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "42"}, pid=42).watchdog_interval_s == 15.0
    assert Notifier.from_env({**env, "WATCHDOG_PID": "7"}, pid=42).watchdog_interval_s is None
    assert Notifier.from_env({"WATCHDOG_USEC": "30000000"}, pid=42).watchdog_interval_s is None
    with caplog.at_level(logging.WARNING):
        assert Notifier.from_env({**env, "WATCHDOG_USEC": "30s"}, pid=42).watchdog_interval_s is None
    assert "WATCHDOG_USEC=30s" in caplog.text and "WatchdogSec=" in caplog.text


def test_bad_or_vanished_socket_is_logged_once_and_never_raises(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        relative = Notifier("run/notify")
        assert not relative.enabled and not relative.send(READY=1)
        gone = Notifier(str(tmp_path / "nobody-listens.sock"))
        assert not gone.send(READY=1)
        assert not gone.send(WATCHDOG=1)
    assert "neither an absolute path nor an @abstract name" in caplog.text
    assert caplog.text.count("event=sd_notify_failed") == 1


def test_progress_check_goes_stale_only_without_change() -> None:
    now, count = [0.0], [0]
    check = ProgressCheck("sampler", lambda: count[0], stale_after_s=5.0, monotonic=lambda: now[0])
    assert check() is None
    now[0] = 4.0
    assert check() is None  # slow, not yet stale
    now[0] = 5.5
    assert check() == "sampler made no progress for over 5 s"
    count[0] += 1
    assert check() is None  # moving again
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    assert thread_check("metrics", dead)() == "metrics thread died"


def test_hung_sampler_withholds_pings_until_it_moves_again(systemd: FakeSystemd) -> None:
    """A real ticker whose tick blocks (a hung vendor call): pings stop, STATUS says why, then resume."""
    release, hung = threading.Event(), threading.Event()

    def tick(_now_ns: int) -> None:
        if ticker.ticks_total == 3:
            hung.set()
            release.wait(10)

    ticker = FixedRateTicker(100.0, tick)
    now = [0.0]
    supervision = Supervision(
        [ProgressCheck("sampler", lambda: ticker.ticks_total, 1.0, monotonic=lambda: now[0])],
        "serving", Notifier(systemd.address, watchdog_usec=1_000_000))
    ticker.start()
    try:
        assert supervision.check_once() is None
        assert hung.wait(10)
        now[0] = 0.5
        assert supervision.check_once() is None  # counter moved since the first check
        now[0] = 2.0
        assert supervision.check_once() == "sampler made no progress for over 1 s"
        now[0] = 3.0
        assert supervision.check_once() == "sampler made no progress for over 1 s"
        release.set()
        assert wait_until(lambda: ticker.ticks_total > 4, interval_s=0.01)
        now[0] = 3.5
        assert supervision.check_once() is None
    finally:
        release.set()
        ticker.stop()
    assert systemd.pending() == [
        {"WATCHDOG": "1"}, {"WATCHDOG": "1"}, {"STATUS": "unhealthy: sampler made no progress for over 1 s"},
        {"STATUS": "serving"}, {"WATCHDOG": "1"},
    ]
    assert supervision.pings_total == 3


def _agent(tmp_path: Path, metrics: str) -> tuple[list[str], object]:
    target = f"unix://{tmp_path / 'agent.sock'}"
    argv = ["agent", "--backend", "simulated", "--sim-gpus", "2", "--socket-path", str(tmp_path / "agent.sock"),
            "--metrics-listen", metrics]
    return argv, lambda: consumer.wait_for_info(target, timeout_s=1).backend == "simulated"


def _aggregator(_tmp_path: Path, metrics: str) -> tuple[list[str], object]:
    return ["aggregator.main", "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", metrics], lambda: True


@pytest.mark.slow
@pytest.mark.parametrize("daemon", [_agent, _aggregator], ids=["agent", "aggregator"])
def test_daemon_sends_ready_once_serving_then_watchdog_then_stopping(
        daemon, systemd: FakeSystemd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    metrics = f"127.0.0.1:{free_port()}"
    argv, answers_grpc = daemon(tmp_path, metrics)
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen([sys.executable, "-m", *argv], stderr=log,
                            env={**os.environ, "NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "300000"})
    try:
        ready = systemd.recv(timeout_s=60)
        assert ready["READY"] == "1" and ready["STATUS"].startswith("serving"), ready
        # READY=1 means serving: both faces answer at once, without retrying.
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
            assert b"chopper_" in response.read()
        assert answers_grpc()
        pings = [systemd.recv(timeout_s=5) for _ in range(3)]
        assert pings == [{"WATCHDOG": "1"}] * 3
        proc.send_signal(signal.SIGTERM)
        # Pings already in flight may come first; STOPPING=1 must follow, and nothing after it.
        stopping = next(m for m in iter(lambda: systemd.recv(timeout_s=15), None) if "STOPPING" in m)
        assert stopping == {"STOPPING": "1", "STATUS": "stopping"}
        assert proc.wait(15) == 0
        assert systemd.pending() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "event=unhealthy" not in (tmp_path / "daemon.log").read_text()
