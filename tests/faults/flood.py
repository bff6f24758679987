"""A broken trainer that pushes markers as fast as gRPC takes them: ``python -m tests.faults.flood``.

It sends well-formed ``MarkerBatch`` messages of ``--batch`` markers (steps of 10 markers, as the
demo marks them) on ``--streams`` concurrent ``PushMarkers`` streams, reopening each at once when
the agent ends it, until ``--duration`` has passed or SIGTERM arrives (a test ends the flood once
it has had its effect); then it cancels the streams.
The batch is serialized once; each message is those bytes plus
its own ``seq`` field (protobuf keeps the last value of a repeated scalar field), so the sender
costs almost nothing and the offered rate is what gRPC's flow control lets through. Prints one
JSON line: ``offered`` markers (handed to the transport), ``seconds``, ``offered_per_s``,
``streams`` opened, ``errors`` (status codes of the streams the agent ended) and
``accepted``/``rejected`` as the agent answered streams that ended before the deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import grpc

from chopper.daemon.stopsignals import StopSignals
from chopper.proto.chopper.v1 import agent_pb2 as pb

METHOD = "/chopper.v1.Agent/PushMarkers"
PATTERN = (
    (pb.MARKER_KIND_STEP_BEGIN, ""), (pb.MARKER_KIND_PHASE_BEGIN, "forward"), (pb.MARKER_KIND_PHASE_END, "forward"),
    (pb.MARKER_KIND_PHASE_BEGIN, "backward"), (pb.MARKER_KIND_PHASE_END, "backward"),
    (pb.MARKER_KIND_COLLECTIVE_BEGIN, "all_reduce"), (pb.MARKER_KIND_COLLECTIVE_END, "all_reduce"),
    (pb.MARKER_KIND_PHASE_BEGIN, "optimizer"), (pb.MARKER_KIND_PHASE_END, "optimizer"), (pb.MARKER_KIND_STEP_END, ""),
)


def batch_bytes(job: str, rank: int, markers: int) -> bytes:
    """One serialized batch of ``markers`` markers (whole steps), stamped now, without ``seq``."""
    now = time.time_ns()
    batch = pb.MarkerBatch(job=job, rank=rank, gpu=-1, pid=os.getpid())
    for i in range(markers):
        kind, name = PATTERN[i % len(PATTERN)]
        batch.markers.add(ts_ns=now + i * 1000, kind=kind, step=i // len(PATTERN), name=name, bytes=1024)
    return batch.SerializeToString()


def flood(
    target: str, duration_s: float, markers: int, streams: int, stop: threading.Event, job: str = "flood",
) -> dict[str, object]:
    """Offer markers on ``streams`` concurrent streams for ``duration_s`` or until ``stop`` is set, then cancel
    what is still open."""
    body = batch_bytes(job, 0, markers)
    channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
    push = channel.stream_unary(METHOD, request_serializer=lambda b: b,
                                response_deserializer=pb.PushMarkersResponse.FromString)
    started = time.monotonic()
    deadline = started + duration_s
    lock = threading.Lock()
    sent = {"offered": 0, "seq": 0, "streams": 0, "accepted": 0, "rejected": 0}
    errors: Counter[str] = Counter()

    def over() -> bool:
        return stop.is_set() or time.monotonic() >= deadline

    def messages() -> Iterator[bytes]:
        while not over():
            with lock:
                sent["seq"] += 1
                seq = sent["seq"]
            yield body + pb.MarkerBatch(seq=seq).SerializeToString()
            with lock:  # gRPC asks for the next message once this one is written
                sent["offered"] += markers

    def sender() -> None:
        while not over():
            with lock:
                sent["streams"] += 1
            call = push.future(messages())
            try:
                while not call.done() and not over():
                    stop.wait(0.05)
                if not call.done():
                    call.cancel()  # the flood is over: whatever the agent has not read is abandoned
                    continue
                response = call.result()
                with lock:
                    sent["accepted"] += response.accepted
                    sent["rejected"] += response.rejected
            except grpc.RpcError as exc:
                with lock:
                    errors[exc.code().name] += 1
                time.sleep(0.01)

    threads = [threading.Thread(target=sender) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # in slices: a SIGTERM handed to a sender thread still reaches this one
            t.join(0.1)
    seconds = time.monotonic() - started
    channel.close()
    return {**sent, "seconds": seconds, "offered_per_s": sent["offered"] / seconds, "errors": dict(errors)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True, help="agent gRPC target")
    parser.add_argument("--duration", type=float, required=True, help="seconds of flood (at most, with SIGTERM)")
    parser.add_argument("--batch", type=int, default=50_000, help="markers per message")
    parser.add_argument("--streams", type=int, default=4, help="concurrent PushMarkers streams")
    args = parser.parse_args(argv)
    with StopSignals() as stop:
        print(json.dumps(flood(args.agent, args.duration, args.batch, args.streams, stop.event)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
