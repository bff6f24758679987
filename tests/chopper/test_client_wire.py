"""What the client puts on the wire, against a real gRPC servicer on a unix socket: every marker sent or counted.

Every text and number a trainer hands the client (identity at start, names and payloads per
marker) either fits the wire and the agent's rules, is replaced by what fits (and said so), or
costs only the smallest unit that holds it: a field, a marker, never a batch or a thread.
"""
from __future__ import annotations

import enum
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.markers import batch_markers
from chopper.client import _BATCH_BYTES, Client
from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc
from tests.support.client_under_test import FLUSH_S, fast_client, invariant_holds
from tests.support.hazards import HazardOutcome
from tests.support.marker_recorder import Recorder, short_socket_path, start_server

# The smallest message any agent setting accepts: twice max_message_bytes at its floor of 64 KiB.
SMALLEST_AGENT_MESSAGE = 2 * 64 * 1024


@pytest.fixture(name="sock")
def _sock(tmp_path: Path) -> Iterator[Path]:
    yield from short_socket_path(tmp_path)


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Exceptions that ended any thread (what would print a traceback), as ``Name: message``."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: seen.append(f"{args.thread.name if args.thread else '?'}: {args.exc_value!r}"))
    return seen


def messages(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event}" in r.getMessage()]


@pytest.mark.hazard(item=6, input="job 'caf\\udcff' (CHOPPER_JOB=$'caf\\xff'), device UUID with a raw byte and a "
                                  "newline, rank 2**40, GPU -5, pid 2**70",
                    promise="each replaced at start by what the wire holds, with one warning naming it and the fix; "
                            "every marker delivered; queued == sent + dropped; no thread dies")
def test_identity_no_wire_field_holds_is_replaced_at_start_and_said(
        sock: Path, caplog: pytest.LogCaptureFixture, thread_errors: list[str], hazard: HazardOutcome) -> None:
    caplog.set_level(logging.INFO, logger="chopper.client")
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock, job="caf\udcff", device_uuid="GPU-\udcff\n", rank=2**40, gpu=-5, pid=2**70)
        for i in range(50):
            with c.step(i), c.phase("forward"):
                pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    headers = {(b.job, b.device_uuid, b.rank, b.gpu, b.pid) for b in rec.batches}
    assert headers == {("caf\\xff", "GPU-\\xff\\n", 0, -1, os.getpid())}
    assert len(rec.markers()) == s["sent"] == s["queued"] == 200 and s["dropped"] == 0 and invariant_holds(s)
    replaced = messages(caplog, "identity_replaced")
    assert [m.split()[1] for m in replaced] == ["field=job", "field=rank", "field=gpu", "field=device_uuid",
                                                "field=pid"]
    assert all("fix=" in m for m in replaced)
    assert thread_errors == []  # the control thread sent its hello with the replaced job
    hazard.outcome = (f"job sent as {c.job!r}, rank {c.rank}, GPU {c.gpu}, UUID {c.device_uuid!r}; "
                      f"{len(replaced)} warnings at start; queued {s['queued']}, sent {s['sent']}, received "
                      f"{len(rec.markers())}, dropped {s['dropped']}; 0 threads died")


@pytest.mark.hazard(item=6, input="CHOPPER_AGENT naming a socket path with a byte that is not UTF-8",
                    promise="the path reaches the agent (percent-encoded, which gRPC decodes); every marker delivered")
def test_a_socket_path_that_is_not_utf8_is_reached(hazard: HazardOutcome) -> None:
    with tempfile.TemporaryDirectory(prefix="chp\udcff", dir="/tmp") as d:
        path = Path(d) / "agent.sock"
        rec = Recorder()
        server = start_server(Path(d.replace("\udcff", "%FF")) / "agent.sock", rec)  # gRPC decodes %FF
        try:
            assert os.path.exists(path)
            c = fast_client(path)
            for i in range(20):
                with c.step(i):
                    pass
            c.shutdown(FLUSH_S)
        finally:
            server.stop(None)
    s = c.stats()
    assert c.target.startswith("unix:///tmp/chp%FF")
    assert len(rec.markers()) == s["sent"] == s["queued"] == 40
    hazard.outcome = f"target sent as {c.target[:22]}…; {s['sent']} of {s['queued']} markers received"


@pytest.mark.hazard(item=6, input="a target gRPC cannot encode (a lone surrogate); a phase name whose __str__ raises",
                    promise="the sender and control threads never die: one warning, retried; every marker sent or "
                            "counted by reason")
def test_failures_inside_the_client_threads_are_counted_never_fatal(
        sock: Path, caplog: pytest.LogCaptureFixture, thread_errors: list[str], hazard: HazardOutcome) -> None:
    caplog.set_level(logging.WARNING, logger="chopper.client")
    unusable = Client(job="j", rank=0, gpu=0, agent="unix:///tmp/\ud800.sock", initial_backoff_s=0.01,
                      max_backoff_s=0.05)
    for i in range(30):
        with unusable.step(i):
            pass
    assert unusable._done.wait(0) is False  # still alive, retrying
    unusable.shutdown(0.5)
    u = unusable.stats()
    assert (u["queued"], u["sent"], u["dropped_at_shutdown"]) == (60, 0, 60) and invariant_holds(u)
    assert len(messages(caplog, "sender_failed")) == 1 and "UnicodeEncodeError" in u["last_error"]

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no name")

    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock)
        with c.step(0):
            with c.phase(Unprintable()):  # type: ignore[arg-type]
                pass
            with c.phase("forward"):
                pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    assert [m.name for m in rec.markers()] == ["", "forward", "forward", ""]
    assert s["dropped_invalid_by_reason"] == {"encode_error": 2} and s["sent"] == 4 and invariant_holds(s)
    assert thread_errors == []
    hazard.outcome = (f"unusable target: sender alive after {len(messages(caplog, 'sender_failed'))} warning, "
                      f"{u['queued']} queued = {u['dropped_at_shutdown']} counted at shutdown; broken name: 2 markers "
                      f"dropped as encode_error, {s['sent']} sent in the same batch; 0 threads died")


@pytest.mark.hazard(item=11, input="in one batch: a 5 MB and a 300-char name, a name with a raw byte, step 'abc', "
                                   "step 3.0, flops 'lots', tokens 4096.0 and 'many', bytes 2**70",
                    promise="each problem costs its smallest unit (marker or field), named and counted; the rest "
                            "of the batch is sent")
def test_each_bad_marker_or_field_costs_only_itself(sock: Path, caplog: pytest.LogCaptureFixture,
                                                    hazard: HazardOutcome) -> None:
    caplog.set_level(logging.WARNING, logger="chopper.client")
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock, flush_interval_s=3600.0, control=False)  # everything goes in the shutdown batch
        with c.step(0, flops="lots", tokens=4096.0):  # type: ignore[arg-type]
            with c.phase("p" * (5 << 20)), c.phase("q" * 300):
                pass
            with c.phase("caf\udcff"), c.collective("all_reduce", bytes=2**70):
                pass
        with c.step("abc"):  # type: ignore[arg-type]
            pass
        with c.step(3.0, tokens="many"):  # type: ignore[arg-type]
            pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    rows = [(m.kind, m.step, m.name, m.flops, m.tokens, m.bytes) for m in rec.markers()]
    assert rows == [
        (1, 0, "", 0.0, 0, 0),
        (3, 0, "caf\\xff", 0.0, 0, 0), (5, 0, "all_reduce", 0.0, 0, 0),
        (6, 0, "all_reduce", 0.0, 0, 0), (4, 0, "caf\\xff", 0.0, 0, 0),
        (2, 0, "", 0.0, 4096, 0),
        (1, 3, "", 0.0, 0, 0), (2, 3, "", 0.0, 0, 0),
    ]
    assert len(rec.batches) == 1 and s["last_error"] == ""
    assert s["dropped_invalid_by_reason"] == {"bad_name": 4, "bad_step": 2}
    assert s["fields_dropped"] == {"flops": 1, "bytes": 2, "tokens": 1}
    assert (s["queued"], s["sent"], s["dropped"]) == (14, 8, 6) and invariant_holds(s)
    assert rec.batches[0].client_dropped_total == 6
    warned = messages(caplog, "marker_dropped") + messages(caplog, "marker_field_dropped")
    assert len(warned) == 5 and any("more than 256" in m for m in warned)
    hazard.outcome = (f"1 batch, {s['sent']} of {s['queued']} markers sent; dropped by reason "
                      f"{s['dropped_invalid_by_reason']}, fields left out {s['fields_dropped']}; the raw byte sent "
                      f"escaped; {len(warned)} warnings, one per problem; stream unbroken")


def start_small_server(path: Path, servicer: agent_pb2_grpc.AgentServicer) -> grpc.Server:
    """A servicer that takes messages only as large as the smallest agent setting does."""
    return start_server(path, servicer, options=[("grpc.max_receive_message_length", SMALLEST_AGENT_MESSAGE)])


@pytest.mark.hazard(item=11, input="4,096 markers of 256 four-byte characters each (4 MB) for an agent that takes "
                                   "128 KiB messages",
                    promise="batches are sized to what every agent setting takes: nothing refused whole")
def test_batches_fit_the_smallest_message_an_agent_takes(sock: Path, hazard: HazardOutcome) -> None:
    rec = Recorder()
    server = start_small_server(sock, rec)
    try:
        c = fast_client(sock, max_batch=4096, flush_interval_s=3600.0, control=False)
        for _ in range(2048):
            with c.phase("\U0001f600" * 256):
                pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    sizes = [b.ByteSize() for b in rec.wire]
    assert s["sent"] == len(rec.markers()) == 4096 and s["dropped"] == 0 and s["last_error"] == ""
    assert max(sizes) <= _BATCH_BYTES + 2048 < SMALLEST_AGENT_MESSAGE
    hazard.outcome = (f"{s['sent']} of {s['queued']} markers received in {len(sizes)} batches of at most "
                      f"{max(sizes) / 1024:.1f} KiB (limit {SMALLEST_AGENT_MESSAGE // 1024} KiB); 0 dropped")


def test_a_valid_identity_is_sent_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chopper.client")
    c = Client(job="llama-7b", rank=3, gpu=1, agent="unix:///run/chopper/agent.sock", device_uuid="GPU-8932f937",
               start=False)
    assert (c.job, c.rank, c.gpu, c.device_uuid, c.target) == (
        "llama-7b", 3, 1, "GPU-8932f937", "unix:///run/chopper/agent.sock")
    assert messages(caplog, "identity_replaced") == []
    c.shutdown(0)


@pytest.mark.parametrize(("value", "sent"), [("1", True), (" 1\n", True), ("0", False), ("", False), (None, False)])
def test_every_batch_says_whether_the_inspector_plugin_is_on(sock: Path, monkeypatch: pytest.MonkeyPatch,
                                                              value: str | None, sent: bool) -> None:
    """NCCL turns its Inspector plugin on with NCCL_INSPECTOR_ENABLE=1 (ext-profiler/inspector README)."""
    if value is None:
        monkeypatch.delenv("NCCL_INSPECTOR_ENABLE", raising=False)
    else:
        monkeypatch.setenv("NCCL_INSPECTOR_ENABLE", value)
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock, control=False)
        with c.step(0):
            pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    assert rec.batches and {b.inspector_enabled for b in rec.batches} == {sent}


def test_plain_markers_go_in_columns_and_arrive_as_the_markers_they_were(sock: Path) -> None:
    rec = Recorder()
    server = start_server(sock, rec)
    try:
        c = fast_client(sock, max_batch=64, control=False)
        for i in range(8):
            with c.step(i, flops=1.5e12, tokens=4096):
                with c.phase("forward"):
                    pass
                with c.collective("all_reduce", bytes=1 << 20):
                    pass
            if i == 0:
                assert rec.wait_for(lambda got: len(got) == 6)
        assert rec.wait_for(lambda got: len(got) == 48)
        with c.phase("x" * 300):  # over the name limit: dropped alone, from a batch of messages
            pass
        c.shutdown(FLUSH_S)
    finally:
        server.stop(None)
    s = c.stats()
    assert s["sent"] == 48 and s["dropped_invalid_by_reason"] == {"bad_name": 2}
    # A new name goes as messages once (its check), then every batch is columns.
    assert rec.wire[0].markers and any(b.columns.ts_ns and not b.markers for b in rec.wire)
    got = [(m.kind, m.step, m.name, m.flops, m.tokens, m.bytes, m.clock) for m in rec.markers()]
    assert got[:6] == [(1, 0, "", 0.0, 0, 0, 1), (3, 0, "forward", 0.0, 0, 0, 1), (4, 0, "forward", 0.0, 0, 0, 1),
                       (5, 0, "all_reduce", 0.0, 0, 1 << 20, 1), (6, 0, "all_reduce", 0.0, 0, 1 << 20, 1),
                       (2, 0, "", 1.5e12, 4096, 0, 1)]
    assert got == [(kind, i, *rest) for i in range(8) for kind, _, *rest in got[:6]]


def test_a_name_that_only_equals_a_checked_one_goes_as_its_own_text() -> None:
    class Phase(str, enum.Enum):  # noqa: UP042 - as training code writes it: str() is not its value
        FORWARD = "forward"

    c = Client("j", 0, 0, "unix:///nonexistent.sock", start=False, control=False)
    with c.phase("forward"):
        pass
    first = c._pack(agent_pb2)
    with c.phase(Phase.FORWARD):  # equal to "forward", but its text is str(member)
        pass
    second = c._pack(agent_pb2)
    with c.phase("forward"):
        pass
    third = c._pack(agent_pb2)
    assert first is not None and second is not None and third is not None
    assert [m.name for m in batch_markers(second)] == [str(Phase.FORWARD)] * 2 and second.markers
    assert [m.name for m in batch_markers(third)] == ["forward"] * 2 and third.columns.ts_ns
