"""A length or count field claiming terabytes must not be allocated: decoders run under an address-space limit.

A subprocess caps its address space (``RLIMIT_AS``) at what it has mapped plus 256 MiB, then
decodes inputs whose length prefixes claim 1 TiB, 2 GiB and 4 GiB (gRPC messages, a
write-ahead-log record). A decoder that trusted the claim would fail to allocate (MemoryError,
or the process dies); the decoders must instead refuse the input as truncated.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import resource, tempfile
    from pathlib import Path

    from aggregator.wal import _HEADER, BATCH, read_segment
    from chopper.daemon.grpc_decode import Garbled, decoder
    from chopper.proto.chopper.v1 import agent_pb2 as pb, aggregator_pb2 as apb
    from tests.support.strategies import length_delimited

    def mapped() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()

    limit = mapped() + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for claim in (2**40, 2**31 - 1, 2**32 + 5):
        for cls, field in ((apb.SummaryBatch, 4), (pb.MarkerBatch, 5), (pb.MarkerBatch, 1), (pb.CaptureReply, 2)):
            out = decoder(cls.FromString)(length_delimited(field, b"\\x08\\x01" * 8, claim))
            assert isinstance(out, Garbled), (cls, field, claim)
        # A packed repeated field (SummaryBatch.seq) claiming billions of varints.
        assert isinstance(decoder(apb.SummaryBatch.FromString)(length_delimited(3, b"\\x01" * 16, claim)), Garbled)
    segment = Path(tempfile.mkdtemp()) / "segment-00000000000000000001.log"
    segment.write_bytes(_HEADER.pack(2**32 - 1, 0, BATCH, 1) + b"x" * 64)
    assert read_segment(segment) == ([], True)
    print("bounded", limit >> 20, "MiB")
""")


@pytest.mark.timeout(60)
def test_length_claims_are_not_allocated() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and "bounded" in done.stdout, done.stderr[-2000:]
