"""Fuzz both daemons over real gRPC: a real agent on a unix socket and a real aggregator on loopback TCP.

Each method of each service is sent raw bytes (``tests.support.strategies.wire``: valid messages,
mutated ones, garbage). Properties:

- every call ends as a success whose reply decodes, or with a documented status
  (``INVALID_ARGUMENT`` and the like, never ``UNKNOWN``/``INTERNAL``, which would mean a servicer
  raised) and a non-empty message;
- the server keeps serving: after the batch a good request still succeeds;
- what the server refused is counted on its ``/metrics``: undecodable messages per method equal
  those that do not decode, rejected markers equal the replies' ``rejected`` totals.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.config import AggregatorSettings
from aggregator.server import _batch_problem
from chopper.daemon.grpc_decode import Garbled, decoder
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.markers import steps_batch
from tests.support.running_servers import RunningAgent, RunningAggregator
from tests.support.strategies import fuzz, wire
from tests.support.summaries import summary

# Method: (request type, response type, kind, statuses a refusal may carry).
AGENT = {
    "PushMarkers": (pb.MarkerBatch, pb.PushMarkersResponse, "stream_unary",
                    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}),
    "GetInfo": (pb.GetInfoRequest, pb.AgentInfo, "unary_unary", set()),
    "Subscribe": (pb.SubscribeRequest, pb.TelemetryBatch, "unary_stream",
                  {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED}),
    "Control": (pb.ControlHello, pb.ControlCommand, "unary_stream",
                {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED}),
    "RequestCapture": (pb.CaptureRequest, pb.CaptureReply, "unary_unary",
                       {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}),
    "ReportCapture": (pb.CaptureResult, pb.CaptureAck, "unary_unary", {grpc.StatusCode.INVALID_ARGUMENT}),
}
AGGREGATOR = {
    "Deliver": (apb.SummaryBatch, apb.DeliveryAck, "stream_stream", {grpc.StatusCode.INVALID_ARGUMENT}),
    "QuerySteps": (apb.QueryStepsRequest, apb.QueryStepsResponse, "unary_unary", {grpc.StatusCode.INVALID_ARGUMENT}),
}
# Streams that stay open on a good request are cut after this long (the DEADLINE_EXCEEDED above).
STREAM_S = 0.1
# Every other call gets this long: a deadline that passed before the server's thread pool ran the
# handler (a starved CI runner) would leave a garbled request uncounted on the server.
CALL_S = 10


def _call(channel: grpc.Channel, service: str, method: str, spec: tuple, messages: list[bytes],
          stream_s: float) -> list[bytes]:
    """Send raw request bytes to one method; the raw replies (raises ``grpc.RpcError`` on a status).
    ``stream_s`` is the deadline of a server-streaming call."""
    _, _, kind, _ = spec
    path = f"/chopper.v1.{service}/{method}"
    if kind == "stream_unary":
        return [channel.stream_unary(path)(iter(messages), timeout=CALL_S)]
    if kind == "stream_stream":
        return list(channel.stream_stream(path)(iter(messages), timeout=CALL_S))
    if kind == "unary_stream":
        replies: list[bytes] = []
        try:
            for reply in channel.unary_stream(path)(messages[0], timeout=stream_s):
                replies.append(reply)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or not replies:
                raise
        return replies
    return [channel.unary_unary(path)(messages[0], timeout=CALL_S)]


def _exchange(channel: grpc.Channel, service: str, methods: dict, method: str, messages: list[bytes],
              garbled: Counter[str]) -> list[bytes]:
    """One call with the module docstring's first property checked; counts what does not decode."""
    spec = methods[method]
    request_type, response_type, kind, refusals = spec
    decoded = [decoder(request_type.FromString)(m) for m in messages]
    counts_garbled = _counts_garbled(method, kind, decoded)
    garbled[method] += counts_garbled
    try:
        # A garbled request is refused at once, so only a stream that may stay open gets the short cut.
        replies = _call(channel, service, method, spec, messages, CALL_S if counts_garbled else STREAM_S)
    except grpc.RpcError as exc:
        assert exc.code() in refusals, (method, exc.code(), exc.details())
        assert exc.details(), f"{method} refused with no message"
        return []
    return [response_type.FromString(r) for r in replies]


def _counts_garbled(method: str, kind: str, decoded: list) -> bool:
    """Whether the server counts this call as undecodable: its first refused message is garbled
    (a stream ends at the first message it refuses; GetInfo ignores its empty request)."""
    if kind.startswith("unary"):
        return method != "GetInfo" and isinstance(decoded[0], Garbled)
    for message in decoded:
        if isinstance(message, Garbled):
            return True
        if method == "Deliver" and _batch_problem(message):
            return False
    return False


# The fuzz loop calls far faster than the per-client rate limits allow (100 calls/s): a refusal
# for rate would hide what the servicer does with the message, so both servers run without them.
NO_LIMITS = {"rate_limit_calls_per_s": "0", "rate_limit_messages_per_s": "0"}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    r = RunningAgent(tmp_path, **NO_LIMITS)
    yield r
    r.stop()


def _calls(methods: dict) -> st.SearchStrategy[list[tuple[str, list[bytes]]]]:
    """Up to 4 calls, each of one method with 1-3 request messages (only the first for unary requests)."""
    call = st.sampled_from(sorted(methods)).flatmap(
        lambda m: st.tuples(st.just(m), st.lists(wire(methods[m][0]), min_size=1, max_size=3)))
    return st.lists(call, min_size=1, max_size=4)


@fuzz(60, timeout_s=180)
@given(_calls(AGENT))
def test_agent_answers_every_request_and_keeps_serving(agent: RunningAgent,
                                                       calls: list[tuple[str, list[bytes]]]) -> None:
    before, counted_before = agent.scrape(), Counter(agent.agent.undecodable)
    garbled: Counter[str] = Counter()
    rejected, aborted = 0, False
    for method, messages in calls:
        replies = _exchange(agent.channel, "Agent", AGENT, method, messages, garbled)
        if method == "PushMarkers":
            # An aborted stream's reply is lost, not the rejections it counted before the abort.
            rejected += replies[0].rejected if replies else 0
            aborted |= not replies
    good = agent.stub.PushMarkers(iter([steps_batch(0, 1, time.time_ns(), job="after-fuzz")]), timeout=10)
    assert (good.accepted, good.rejected) == (4, 0), "the agent keeps serving after the fuzz batch"
    after = agent.scrape()
    node = agent.settings.node
    for method in AGENT:
        assert agent.agent.undecodable[method] - counted_before[method] == garbled[method], method
        # /metrics shows the methods trainers and consumers use (not yet Control and the capture RPCs).
        key = ("chopper_agent_messages_undecodable_total", (("method", method), ("node", node)))
        if key in after:
            assert after[key] - before.get(key, 0) == garbled[method], method
    counted = sum(v - before.get(k, 0) for k, v in after.items() if k[0] == "chopper_agent_markers_rejected_total")
    assert counted == rejected or (aborted and counted > rejected)


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[RunningAggregator]:
    r = RunningAggregator(tmp_path, settings=AggregatorSettings(**{k: float(v) for k, v in NO_LIMITS.items()}))
    yield r
    r.stop()


@pytest.mark.slow
@fuzz(60, timeout_s=180)
@given(_calls(AGGREGATOR))
def test_aggregator_answers_every_request_and_keeps_serving(aggregator: RunningAggregator,
                                                            calls: list[tuple[str, list[bytes]]]) -> None:
    before = aggregator.scrape()
    garbled: Counter[str] = Counter()
    for method, messages in calls:
        _exchange(aggregator.channel, "Aggregator", AGGREGATOR, method, messages, garbled)
    good = apb.SummaryBatch(agent="after-fuzz", incarnation="i", seq=[1], summaries=[summary("after-fuzz", 0, 0)])
    acks = list(aggregator.stub.Deliver(iter([good]), timeout=10))
    assert [a.acked_seq for a in acks] == [1], "the aggregator keeps serving after the fuzz batch"
    after = aggregator.scrape()
    for method in AGGREGATOR:
        key = ("chopper_aggregator_messages_undecodable_total", (("method", method),))
        assert after.get(key, 0) - before.get(key, 0) == garbled[method], method
