"""The job-side marker client against a real gRPC agent servicer on a unix socket."""
from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import chopper
from chopper.client import NOOP, Client
from chopper.identity import process as _identity
from chopper.identity.jobname import job_name_problem
from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc
from chopper.schema import ClockSource, MarkerKind
from tests.support.client_under_test import FLUSH_S, fast_client, invariant_holds
from tests.support.marker_recorder import Recorder, short_socket_path, start_server
from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    yield from short_socket_path(tmp_path)


@pytest.fixture(autouse=True)
def _no_global_client() -> Iterator[None]:
    chopper.shutdown(0.5)
    yield
    chopper.shutdown(0.5)


def counter_clock(start: int = 1_700_000_000_000_000_000, step: int = 1000) -> Callable[[], int]:
    it = itertools.count(start, step)
    return lambda: next(it)


def as_rows(markers: list[agent_pb2.Marker]) -> list[tuple]:
    return [(m.kind, m.step, m.name, m.flops, m.tokens, m.bytes, m.clock) for m in markers]


def test_markers_arrive_exactly_in_order_with_identity_and_seq(sock: Path) -> None:
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        clock = counter_clock()
        c = fast_client(sock, clock=clock, max_batch=4, pid=4242, device_uuid="GPU-8932f937")
        for i in range(3):
            with c.step(i, flops=1.5e12 * (i + 1), tokens=4096 + i):
                with c.phase("forward"):
                    pass
                with c.collective("all_reduce", bytes=(1 << 20) + i):
                    pass
                with c.phase("backward"):
                    pass
        c.shutdown(timeout=FLUSH_S)
    finally:
        server.stop(None)

    cpu = int(ClockSource.CPU)
    K = MarkerKind
    expected = []
    for i in range(3):
        expected += [
            (K.STEP_BEGIN, i, "", 0.0, 0, 0, cpu),
            (K.PHASE_BEGIN, i, "forward", 0.0, 0, 0, cpu),
            (K.PHASE_END, i, "forward", 0.0, 0, 0, cpu),
            (K.COLLECTIVE_BEGIN, i, "all_reduce", 0.0, 0, (1 << 20) + i, cpu),
            (K.COLLECTIVE_END, i, "all_reduce", 0.0, 0, (1 << 20) + i, cpu),
            (K.PHASE_BEGIN, i, "backward", 0.0, 0, 0, cpu),
            (K.PHASE_END, i, "backward", 0.0, 0, 0, cpu),
            (K.STEP_END, i, "", 1.5e12 * (i + 1), 4096 + i, 0, cpu),
        ]
    markers = rec.markers()
    assert as_rows(markers) == [tuple(int(x) if isinstance(x, K) else x for x in row) for row in expected]
    # The injected clock ticks 1 µs per marker: timestamps are exactly its readings, in order.
    assert [m.ts_ns for m in markers] == [1_700_000_000_000_000_000 + 1000 * k for k in range(24)]
    assert [b.seq for b in rec.batches] == list(range(1, len(rec.batches) + 1))
    assert all(len(b.markers) <= 4 for b in rec.batches)
    assert {(b.job, b.rank, b.gpu, b.pid, b.client_dropped_total, b.device_uuid) for b in rec.batches} == {
        ("j1", 3, 1, 4242, 0, "GPU-8932f937")}
    s = c.stats()
    assert (s["queued"], s["sent"], s["dropped"], s["batches_sent"]) == (24, 24, 0, len(rec.batches))
    assert s["connected"] is False


def test_tiny_queue_drops_are_counted_then_delivered_with_the_drop_total(sock: Path) -> None:
    c = fast_client(sock, queue_size=4)  # no agent yet
    t0 = time.perf_counter()
    for i in range(5):
        with c.step(i):
            pass
    # Catches marking that blocks on the full queue, which nothing drains without an agent; with headroom for a
    # starved machine. Shorter waits per marker are caught by test_agent_absent_never_raises_bounded_time_one_warning.
    assert time.perf_counter() - t0 < 2.0
    s = c.stats()
    assert (s["queued"], s["dropped_queue_full"], s["pending"], s["sent"]) == (4, 6, 4, 0)

    rec = Recorder()
    server = start_server(sock, rec)
    try:
        assert rec.wait_for(lambda ms: len(ms) == 4)
        assert [(m.kind, m.step) for m in rec.markers()] == [(1, 0), (2, 0), (1, 1), (2, 1)]
        assert rec.batches[0].client_dropped_total == 6
        assert rec.batches[0].seq == 1
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    assert (s["sent"], s["dropped"]) == (4, 6)
    assert invariant_holds(s)


def test_agent_absent_never_raises_bounded_time_one_warning(sock: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chopper.client")
    c = fast_client(sock, queue_size=100)
    t0 = time.perf_counter()
    for i in range(500):
        with c.step(i), c.phase("forward"):
            pass
    # 2000 markers, 1900 of them dropped: a few hundred ns each. The bound leaves a starved machine seconds and
    # still catches any wait on the absent agent per dropped marker (its backoff starts at 20 ms: 38 s in all).
    assert time.perf_counter() - t0 < 5.0
    assert wait_until(lambda: c.stats()["last_error"] != "", timeout_s=30), "the sender never tried the agent"
    time.sleep(0.5)  # several more reconnect attempts at 20 → 200 ms backoff, which must not warn again
    t0 = time.perf_counter()
    c.shutdown(timeout=0.3)
    # At most timeout + 0.5 s by design; catches a shutdown that waits for the absent agent to take the queue.
    assert time.perf_counter() - t0 < 5.0
    assert c._done.wait(30), "the sender did not exit"  # the counters are final once it has
    s = c.stats()
    assert s["sent"] == 0 and s["connected"] is False
    assert s["queued"] == 100 and s["dropped_queue_full"] == 1900 and s["dropped_at_shutdown"] == 100
    assert s["dropped"] == 2000
    assert s["last_error"]
    warnings = [r for r in caplog.records if "agent_unreachable" in r.getMessage()]
    assert len(warnings) == 1
    assert "target='unix://" in warnings[0].getMessage()


def test_agent_restart_flow_resumes_in_order(sock: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chopper.client")
    rec1 = Recorder()
    server1 = start_server(sock, rec1)
    c = fast_client(sock)
    try:
        for i in range(10):
            with c.step(i):
                pass
        assert rec1.wait_for(lambda ms: len(ms) == 20)
        server1.stop(None).wait()
        assert wait_until(lambda: not c.stats()["connected"], timeout_s=30)
        for i in range(100, 110):  # marked while the agent is down: queued
            with c.step(i):
                pass
            time.sleep(0.005)
        rec2 = Recorder()
        server2 = start_server(sock, rec2)
        try:
            for i in range(1000, 1010):
                with c.step(i):
                    pass
            assert rec2.wait_for(lambda ms: sum(m.step >= 1000 for m in ms) == 20)
            c.shutdown(FLUSH_S)
        finally:
            server2.stop(None)
    finally:
        server1.stop(None)
        c.shutdown(0.1)

    after = [(m.kind, m.step) for m in rec2.markers() if m.step >= 1000]
    assert after == [(k, i) for i in range(1000, 1010) for k in (1, 2)]
    # Markers made while the agent was down were queued, not lost.
    down = [m.step for m in rec2.markers() if 100 <= m.step < 110]
    assert down == [i for i in range(100, 110) for _ in (0, 1)]
    seqs = [b.seq for b in rec1.batches + rec2.batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    s = c.stats()
    assert invariant_holds(s)
    # A batch in flight at the break counts as dropped even if it did arrive (it cannot be known).
    assert len(rec1.markers()) + len(rec2.markers()) <= s["sent"] + s["dropped_in_flight"]
    assert s["dropped_queue_full"] == 0 and s["dropped_at_shutdown"] == 0
    assert len([r for r in caplog.records if "agent_unreachable" in r.getMessage()]) == 1


class Stuck(agent_pb2_grpc.AgentServicer):
    """An agent that accepts the stream and never reads or answers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def PushMarkers(self, request_iterator, context):
        self.entered.set()
        self.release.wait(120)
        return agent_pb2.PushMarkersResponse()


def test_shutdown_never_hangs_on_a_stuck_agent(sock: Path) -> None:
    stuck = Stuck()
    server = start_server(sock, stuck)
    try:
        c = fast_client(sock)
        assert stuck.entered.wait(30)
        for i in range(20_000):
            with c.step(i):
                pass
        t0 = time.perf_counter()
        c.shutdown(timeout=0.3)
        # At most timeout + 0.5 s by design; the stuck agent holds the stream for 120 s, which a shutdown or a
        # sender that waits on it would take. The bounds leave a starved machine seconds.
        assert time.perf_counter() - t0 < 5.0
        assert c._done.wait(30), "the sender did not exit"  # the counters are final once it has
        s = c.stats()
        assert s["queued"] == 40_000 and s["pending"] == 0
        assert invariant_holds(s)
    finally:
        stuck.release.set()
        server.stop(None)


def test_hot_path_never_raises_and_bad_fields_are_counted(sock: Path) -> None:
    def broken_clock() -> int:
        raise RuntimeError("clock broke")

    c = Client(job="j", rank=0, gpu=-1, agent=f"unix://{sock}", clock=broken_clock, start=False)
    with c.step(1), c.phase("x"), c.collective("all_gather", bytes=1):
        pass
    assert c.stats()["dropped_error"] == 6 and c.stats()["queued"] == 0
    c.shutdown(0.1)

    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock)
        with c.step(1, flops="lots"):  # type: ignore[arg-type]  # a trainer bug must not crash training
            pass
        with c.step(2, flops=2.0, tokens=7):
            pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    rows = [(m.kind, m.step, m.flops, m.tokens) for m in rec.markers()]
    # The step that carried a bad value is kept without it: the field is the smallest unit to lose.
    assert rows == [(1, 1, 0.0, 0), (2, 1, 0.0, 0), (1, 2, 0.0, 0), (2, 2, 2.0, 7)]
    s = c.stats()
    assert (s["dropped_invalid"], s["sent"], s["fields_dropped"]) == (0, 4, {"flops": 1})
    assert rec.batches[-1].client_dropped_total == 0


def test_module_api_is_a_noop_before_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chopper, "_last", None)  # a client an earlier test module shut down
    assert chopper.step(1) is NOOP and chopper.phase("f") is NOOP and chopper.collective("a", bytes=1) is NOOP
    with chopper.step(1, flops=1.0), chopper.phase("forward"), chopper.collective("all_reduce", bytes=8):
        pass
    s = chopper.stats()
    assert (s["queued"], s["sent"], s["dropped"], s["connected"]) == (0, 0, 0, False)


def test_module_init_replaces_and_flushes_previous_client(sock: Path) -> None:
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        first = chopper.init(job="first", rank=0, gpu=0, agent=f"unix://{sock}")
        with chopper.step(1, tokens=5), chopper.phase("forward"):
            pass
        second = chopper.init(job="second", rank=0, gpu=0, agent=f"unix://{sock}")
        assert first._done.is_set()
        assert first.stats()["sent"] == 4
        with chopper.step(2), chopper.collective("all_reduce", bytes=64):
            pass
        chopper.shutdown(FLUSH_S)
        assert chopper.stats()["sent"] == 4  # the last client's counters survive shutdown
        assert second._done.is_set()
    finally:
        server.stop(None)
    by_job = [(b.job, m.kind, m.step, m.name, m.bytes) for b in rec.batches for m in b.markers]
    assert by_job == [
        ("first", 1, 1, "", 0), ("first", 3, 1, "forward", 0), ("first", 4, 1, "forward", 0),
        ("first", 2, 1, "", 0),
        ("second", 1, 2, "", 0), ("second", 5, 2, "all_reduce", 64), ("second", 6, 2, "all_reduce", 64),
        ("second", 2, 2, "", 0),
    ]
    with chopper.step(3):  # after shutdown: no-op again
        pass
    assert chopper.stats()["queued"] == 4


def test_init_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, sock: Path) -> None:
    for key in ("CHOPPER_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
                "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CHOPPER_GPU"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("CHOPPER_AGENT", f"unix://{sock}")
    c = chopper.init()
    assert (c.job, c.rank, c.gpu, c.device_uuid, c.target) == ("777", 5, 6, "", f"unix://{sock}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8932f937")
    c = chopper.init()
    assert (c.gpu, c.device_uuid) == (-1, "GPU-8932f937")  # the agent maps the UUID to its index
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-1")
    monkeypatch.setenv("CHOPPER_JOB", "mine")
    assert chopper.init().job == "mine"
    chopper.shutdown(0.1)


def test_identity_sources_in_order() -> None:
    assert _identity.default_job({}) == "default"
    assert _identity.default_job({"SLURM_JOB_ID": "9", "TORCHELASTIC_RUN_ID": "te"}) == "9"
    assert _identity.default_job({"SLURM_JOB_ID": "9", "CHOPPER_JOB": "mine"}) == "mine"
    assert _identity.default_agent({}) == "unix:///run/chopper/agent.sock"


def test_import_chopper_is_light() -> None:
    code = (
        "import sys, json, chopper\n"
        "heavy = ['torch', 'numpy', 'pandas', 'grpc', 'google.protobuf', 'pyarrow']\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == []


def test_a_job_name_the_agent_would_reject_is_replaced_and_said(sock: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chopper.client")
    fast_client(sock, job="j1").shutdown(timeout=0.1)
    numeric = fast_client(sock, job=1234)  # a Slurm job id passed as an int
    assert numeric.job == "1234"
    numeric.shutdown(timeout=0.1)
    assert not [r for r in caplog.records if "identity_replaced" in r.getMessage()]
    c = fast_client(sock, job="x" * 300)  # longer than the store's directory names allow
    with c.step(0):  # training goes on
        pass
    c.shutdown(timeout=0.1)
    (warning,) = [r.getMessage() for r in caplog.records if "identity_replaced" in r.getMessage()]
    assert "URI-encoded, more than 251" in warning and "CHOPPER_JOB" in warning and c.job in warning
    assert c.job.startswith("x" * 200) and job_name_problem(c.job) is None


class _CountingEvent(threading.Event):
    """An Event that counts the waits with a timeout: the sender's wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.waits += 1
        return super().wait(timeout)


def test_an_idle_client_wakes_once_a_flush_interval(sock: Path) -> None:
    # It once woke every millisecond once the queue was empty: 3% of a core doing nothing.
    server = start_server(sock, Recorder())
    try:
        c = fast_client(sock, flush_interval_s=0.05, start=False, control=False)
        event = _CountingEvent()
        c._wake = event  # what the sender sleeps on (Client._wait_for)
        c.start()
        with c.step(0):
            pass
        wait_until(lambda: c.stats()["sent"] == 2, timeout_s=10)
        before = event.waits
        time.sleep(1.0)
        assert event.waits - before <= 25, event.waits - before  # 20 flush intervals in a second
        c.shutdown(2.0)
        assert c.stats()["sent"] == 2
    finally:
        server.stop(0)


def test_full_batches_go_at_once_and_a_partial_one_waits_for_its_flush(sock: Path) -> None:
    server = start_server(sock, Recorder())
    try:
        c = fast_client(sock, max_batch=8, flush_interval_s=3600.0, control=False)
        wait_until(lambda: c.stats()["connected"], timeout_s=10)
        for i in range(17):  # 34 markers: four full batches (a wake-up's worth), 2 left
            with c.step(i):
                pass
        wait_until(lambda: c.stats()["sent"] == 32, timeout_s=10)
        time.sleep(0.5)
        assert c.stats()["sent"] == 32  # the other 2 wait for the flush an hour away, or the shutdown
        c.shutdown(2.0)
        assert c.stats()["sent"] == 34
    finally:
        server.stop(0)
