"""A sample's per-link counters on the wire: the agent's hand-encoded Sample.links read as protobuf writes them."""
from __future__ import annotations

import math

from agent.daemon import _sample_to_pb
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import LinkBytes, Sample


def _reference(s: Sample) -> pb.Sample:
    return pb.Sample(links=[pb.LinkBytes(link=k.link, tx_bytes=k.tx_bytes, rx_bytes=k.rx_bytes) for k in s.links])


def test_links_arrive_as_protobuf_encodes_them() -> None:
    links = (LinkBytes(0, 0.0, 1.0), LinkBytes(7, 9.5e12, 2.25e3), LinkBytes(127, 2.0**53 + 2, 3.0))
    msg = _sample_to_pb(Sample(1, "n", 0, link_tx_bytes=9.5e12, links=links), "job")
    assert list(msg.links) == list(_reference(Sample(1, "n", 0, links=links)).links)
    assert (msg.ts_ns, msg.job, msg.link_tx_bytes) == (1, "job", 9.5e12)
    again = pb.Sample.FromString(msg.SerializeToString())
    assert [(k.link, k.tx_bytes, k.rx_bytes) for k in again.links] == [tuple(k) for k in links]


def test_unread_link_is_nan_on_the_wire() -> None:
    msg = _sample_to_pb(Sample(1, "n", 0, links=(LinkBytes(3, math.nan, 5.0),)), "")
    assert msg.links[0].link == 3 and math.isnan(msg.links[0].tx_bytes) and msg.links[0].rx_bytes == 5.0


def test_link_index_past_one_varint_byte_takes_the_generated_path() -> None:
    links = (LinkBytes(1, 1.0, 1.0), LinkBytes(300, 2.0, 4.0))
    msg = _sample_to_pb(Sample(1, "n", 0, links=links), "")
    assert [(k.link, k.tx_bytes, k.rx_bytes) for k in msg.links] == [(1, 1.0, 1.0), (300, 2.0, 4.0)]


def test_no_links_no_entries() -> None:
    assert len(_sample_to_pb(Sample(1, "n", 0), "").links) == 0
