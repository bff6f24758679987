"""The committed gRPC stubs are exactly what protoc generates from the committed .proto files."""
from __future__ import annotations

from pathlib import Path

from chopper.proto.generate import REPO_ROOT, generate


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    generated = generate(tmp_path)
    assert {p.name for p in generated} >= {"agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py"}
    for rel in generated:
        committed = REPO_ROOT / rel
        assert committed.exists(), f"{rel} is generated but not committed; run `make proto`"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale; run `make proto` and commit"
