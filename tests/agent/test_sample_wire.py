"""The agent's hand-written Sample encoding reads back as the message protobuf itself builds."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from agent.sample_wire import sample_wire
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import SAMPLE_COLUMNS, ErrorCount, LinkBytes, Sample

DOUBLES = [f.name for f in dataclasses.fields(Sample) if f.type == "float"]


def reference(s: Sample, job: str) -> pb.Sample:
    """The message as the generated class builds it from the sample's fields."""
    return pb.Sample(
        **{c: getattr(s, c) for c in SAMPLE_COLUMNS}, job=job,
        links=[pb.LinkBytes(link=k.link, tx_bytes=k.tx_bytes, rx_bytes=k.rx_bytes) for k in s.links],
        errors=[pb.ErrorCount(kind=e.kind, window=e.window, detail=e.detail, value=e.value, chip_wide=e.chip_wide)
                for e in s.errors],
    )


def same(a: pb.Sample, b: pb.Sample) -> bool:
    """Equal field by field, NaN equal to NaN (message equality says NaN != NaN)."""
    def norm(m: pb.Sample) -> bytes:
        copy = pb.Sample()
        copy.CopyFrom(m)
        for name in DOUBLES:
            if math.isnan(getattr(copy, name)):
                setattr(copy, name, 1234.5)
        for k in copy.links:
            k.tx_bytes = 1234.5 if math.isnan(k.tx_bytes) else k.tx_bytes
            k.rx_bytes = 1234.5 if math.isnan(k.rx_bytes) else k.rx_bytes
        return copy.SerializeToString(deterministic=True)
    return norm(a) == norm(b)


def random_sample(rng: random.Random) -> Sample:
    values = {name: rng.choice([0.0, math.nan, -1.5, 2.0**53 + 2, rng.uniform(0, 1e13)]) for name in DOUBLES}
    links = tuple(LinkBytes(rng.choice([0, 5, 127, 128, 300]), rng.choice([0.0, math.nan, 9.5e12]), 3.0)
                  for _ in range(rng.choice([0, 0, 1, 18])))
    errors = tuple(ErrorCount("xid", "volatile", "79", 2.0, True) for _ in range(rng.choice([0, 0, 1])))
    return Sample(ts_ns=rng.choice([0, 1, 1_780_000_000_123_456_789]), node=rng.choice(["", "node-ü", "n1"]),
                  gpu=rng.choice([0, 7, 300]), links=links, errors=errors, **values)


@pytest.mark.parametrize("seed", range(40))
def test_random_samples_read_back_as_the_generated_message(seed: int) -> None:
    rng = random.Random(seed)
    s = random_sample(rng)
    job = rng.choice(["", "12345", "a,b"])
    assert same(pb.Sample.FromString(sample_wire(s, job)), reference(s, job))


def test_links_arrive_in_order_with_their_values() -> None:
    links = (LinkBytes(0, 0.0, 1.0), LinkBytes(7, 9.5e12, 2.25e3), LinkBytes(127, 2.0**53 + 2, 3.0))
    msg = pb.Sample.FromString(sample_wire(Sample(1, "n", 0, link_tx_bytes=9.5e12, links=links), "job"))
    assert [(k.link, k.tx_bytes, k.rx_bytes) for k in msg.links] == [tuple(k) for k in links]
    assert (msg.ts_ns, msg.job, msg.link_tx_bytes) == (1, "job", 9.5e12)


def test_a_link_index_past_one_varint_byte_is_encoded_too() -> None:
    links = (LinkBytes(1, 1.0, 1.0), LinkBytes(300, 2.0, 4.0))
    msg = pb.Sample.FromString(sample_wire(Sample(1, "n", 0, links=links), ""))
    assert [(k.link, k.tx_bytes, k.rx_bytes) for k in msg.links] == [(1, 1.0, 1.0), (300, 2.0, 4.0)]


def test_unread_values_are_nan_and_no_links_no_entries() -> None:
    msg = pb.Sample.FromString(sample_wire(Sample(1, "n", 0), ""))
    assert math.isnan(msg.busy_ratio) and math.isnan(msg.vr_temp_c) and len(msg.links) == 0 and not msg.job
