"""Regenerate the committed Python stubs of the wire contract (``make proto``).

Run from the repository root: ``python -m chopper.proto.generate [--out DIR]``. Stubs are
generated with the import path ``chopper.proto.chopper.v1`` so they live inside the ``chopper``
package; ``tests/chopper/test_proto_stubs.py`` regenerates them into a temporary directory and
fails on any difference from the committed files.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_FILES = sorted((REPO_ROOT / "chopper" / "proto" / "chopper" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every ``chopper.v1`` proto into ``out_dir``.

    Returns the generated files, relative to ``out_dir``.
    """
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    out_dir.mkdir(parents=True, exist_ok=True)
    rel = [str(p.relative_to(REPO_ROOT)) for p in PROTO_FILES]
    args = [
        "protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {rel}")
    stub_dir = out_dir / "chopper" / "proto" / "chopper" / "v1"
    return sorted(p.relative_to(out_dir) for p in stub_dir.glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
