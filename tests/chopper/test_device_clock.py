"""Device-event timestamps: lazy resolution, ordering, pooling and re-anchoring, with a fake GPU."""
from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from chopper._device_clock import DeviceClock, from_torch
from chopper.client import Client
from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc
from chopper.schema import ClockSource

CPU_AT_SYNC = 1_700_000_000_000_000_000


def f32(x: float) -> float:
    """Round to float32, as cudaEventElapsedTime does."""
    return struct.unpack("f", struct.pack("f", x))[0]


class FakeGpu:
    """One in-order stream: ``launch`` enqueues work, ``complete`` lets the device catch up.

    Positions are true nanoseconds since init; the device timer runs ``drift`` fast, as real GPU
    timers do against CLOCK_REALTIME.
    """

    def __init__(self, drift: float = 0.0) -> None:
        self.enqueued_ns = 0
        self.done_ns = 0
        self.created = 0
        self.syncs = 0
        self.drift = drift

    def launch(self, ns: int) -> None:
        self.enqueued_ns += ns

    def complete(self, upto: int | None = None) -> None:
        self.done_ns = self.enqueued_ns if upto is None else upto

    def synchronize(self) -> None:
        self.syncs += 1
        self.complete()

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def anchor(self) -> tuple[FakeEvent, int]:
        """A reference on an idle side stream: completes at once, at the device's current time."""
        ev = FakeEvent(self)
        ev.t = self.done_ns
        return ev, CPU_AT_SYNC + self.done_ns


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.t: int | None = None

    def record(self, stream: object = None) -> None:
        self.t = self.gpu.enqueued_ns

    def query(self) -> bool:
        return self.t is not None and self.gpu.done_ns >= self.t

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time needs both events completed"
        assert self.t is not None and end.t is not None
        return f32((end.t - self.t) * (1 + self.gpu.drift) / 1e6)


def make_clock(gpu: FakeGpu, **kw) -> DeviceClock:
    return DeviceClock(gpu.event, gpu.synchronize, cpu_clock=lambda: CPU_AT_SYNC, **kw)


def test_events_resolve_only_once_the_gpu_reaches_them() -> None:
    gpu = FakeGpu()
    gpu.launch(5_000)  # work queued before init: the reference waits for it via the one sync
    clock = make_clock(gpu)
    assert gpu.syncs == 1
    gpu.launch(250_000)
    ev1 = clock.record()
    gpu.launch(1_000_000)
    ev2 = clock.record()
    assert gpu.syncs == 1  # recording never synchronizes
    assert clock.resolve(ev1) is None and clock.resolve(ev2) is None
    gpu.complete(upto=gpu.enqueued_ns - 1_000_000)
    assert clock.resolve(ev1) == CPU_AT_SYNC + 250_000
    assert clock.resolve(ev2) is None
    gpu.complete()
    assert clock.resolve(ev2) == CPU_AT_SYNC + 1_250_000


def test_resolved_events_are_reused() -> None:
    gpu = FakeGpu()
    clock = make_clock(gpu)
    for _ in range(1000):
        gpu.launch(1000)
        ev = clock.record()
        gpu.complete()
        assert clock.resolve(ev) is not None
    assert gpu.created == 2  # the reference and one pooled event


def test_reanchoring_bounds_float32_rounding_and_timer_drift() -> None:
    """A fixed reference is ms off after hours (float32 ms, 10 ppm drift); re-anchoring is not."""
    errors = {}
    for name, use_anchor in (("anchored", True), ("fixed", False)):
        gpu = FakeGpu(drift=10e-6)
        now = [0.0]
        clock = make_clock(
            gpu, anchor=gpu.anchor if use_anchor else None, reanchor_every_s=10.0, monotonic=lambda now=now: now[0]
        )
        worst = 0
        for _ in range(7200):  # two hours of ~1 s steps
            gpu.launch(1_000_000_037)
            now[0] += 1.0
            ev = clock.record()
            gpu.launch(50_000_000)  # the device is still busy when the event is resolved
            gpu.complete(upto=gpu.enqueued_ns - 10_000_000)
            ts = clock.resolve(ev)
            assert ts is not None
            assert ev.t is not None
            worst = max(worst, abs(ts - (CPU_AT_SYNC + ev.t)))
        errors[name] = worst
    assert errors["fixed"] > 10_000_000  # 10 ppm over 2 h = 72 ms
    assert errors["anchored"] < 200_000  # 10 ppm over ≤ 11 s plus float32 at 10 s: ~0.1 ms


class Recorder(agent_pb2_grpc.AgentServicer):
    def __init__(self) -> None:
        self.markers: list[agent_pb2.Marker] = []
        self.cond = threading.Condition()

    def PushMarkers(self, request_iterator, context):
        for batch in request_iterator:
            with self.cond:
                self.markers.extend(batch.markers)
                self.cond.notify_all()
        return agent_pb2.PushMarkersResponse()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    agent_pb2_grpc.add_AgentServicer_to_server(rec, srv)
    path = tmp_path / "a.sock"
    assert srv.add_insecure_port(f"unix://{path}")
    srv.start()
    yield f"unix://{path}", rec
    srv.stop(None)


def test_client_holds_markers_until_the_gpu_completes_them(server: tuple[str, Recorder]) -> None:
    target, rec = server
    gpu = FakeGpu()
    c = Client(job="j", rank=0, gpu=0, agent=target, device_clock=make_clock(gpu), flush_interval_s=0.005)
    try:
        gpu.launch(100)
        with c.step(1):
            gpu.launch(2_000)  # the forward pass
            with c.phase("forward"):
                gpu.launch(3_000)
            gpu.launch(4_000)
        gpu.complete(upto=2_100)  # reached STEP_BEGIN and PHASE_BEGIN only
        with rec.cond:
            assert rec.cond.wait_for(lambda: len(rec.markers) == 2, 30)
        time.sleep(0.1)
        assert len(rec.markers) == 2  # PHASE_END waits: its event has not completed
        gpu.complete()
        c.shutdown(30.0)  # returns once flushed; generous for a starved machine
    finally:
        c.shutdown(0.1)
    assert [(m.kind, m.ts_ns - CPU_AT_SYNC, m.clock) for m in rec.markers] == [
        (1, 100, ClockSource.DEVICE),
        (3, 2_100, ClockSource.DEVICE),
        (4, 5_100, ClockSource.DEVICE),
        (2, 9_100, ClockSource.DEVICE),
    ]


def test_shutdown_with_a_never_completing_event_is_bounded(server: tuple[str, Recorder]) -> None:
    target, _rec = server
    gpu = FakeGpu()
    c = Client(job="j", rank=0, gpu=0, agent=target, device_clock=make_clock(gpu), flush_interval_s=0.005)
    gpu.launch(10)
    with c.step(1):
        pass
    t0 = time.perf_counter()
    c.shutdown(0.3)
    # At most timeout + 0.5 s by design; catches a shutdown that waits for the event, which never completes.
    # The bound leaves a starved machine seconds.
    assert time.perf_counter() - t0 < 5.0
    assert c._done.wait(30), "the sender did not exit"  # the counters are final once it has
    s = c.stats()
    assert s["sent"] == 0 and s["dropped_at_shutdown"] == 2


def test_from_torch_falls_back_to_cpu_without_torch_or_cuda() -> None:
    assert from_torch(modules={}) is None

    class Cuda:
        @staticmethod
        def is_available() -> bool:
            return False

    class Torch:
        cuda = Cuda

    assert from_torch(modules={"torch": Torch}) is None


@pytest.mark.gpu
def test_real_device_events_land_inside_the_cpu_window() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch build without CUDA/ROCm")
    torch.cuda.init()
    torch.ones(1, device="cuda")
    clock = from_torch()
    assert clock is not None
    t0 = time.time_ns()
    ev_a = clock.record()
    torch.cuda._sleep(50_000_000)  # tens of ms of device time, host returns at once
    ev_b = clock.record()
    assert clock.resolve(ev_b) is None  # still running: resolution is lazy
    torch.cuda.synchronize()
    t1 = time.time_ns()
    ta, tb = clock.resolve(ev_a), clock.resolve(ev_b)
    assert ta is not None and tb is not None
    slack = 2_000_000  # 2 ms: the init synchronize's latency plus event resolution
    assert t0 - slack <= ta < tb <= t1 + slack
