"""What ``chopper record`` took from each Subscribe stream it opened, for tests that stop it."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.runs import consumer


class ObservedStream:
    """The recorder's Subscribe stream, passed through unchanged, noting what record() has taken from it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.markers = 0
        self.last_sample_ns = 0

    def __iter__(self) -> Iterator[pb.TelemetryBatch]:
        for batch in self.stream:
            yield batch
            # Noted once record() has stored the batch and asks for the next one.
            self.markers += len(batch.markers)
            if batch.samples:
                self.last_sample_ns = max(self.last_sample_ns, batch.samples[-1].ts_ns)

    def cancel(self) -> bool:
        return bool(self.stream.cancel())


def observe_recorder_streams(monkeypatch: pytest.MonkeyPatch) -> list[ObservedStream]:
    """Wrap ``consumer.subscribe`` so the test sees what ``record()`` took from each stream it opens.

    A stop drops what is still in flight, and a recorder can lag the agent by seconds on a busy
    machine: tests wait on these counts before they stop it.
    """
    observed: list[ObservedStream] = []
    subscribe = consumer.subscribe

    def observed_subscribe(*args: Any) -> tuple[Any, ObservedStream]:
        channel, stream = subscribe(*args)
        observed.append(ObservedStream(stream))
        return channel, observed[-1]

    monkeypatch.setattr(consumer, "subscribe", observed_subscribe)
    return observed
