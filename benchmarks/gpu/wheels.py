"""``make gpu-wheels``: download the wheels ``make gpu-check`` installs on a GPU machine without network.

That machine's python already has torch (with CUDA or ROCm), nvidia-ml-py, grpcio, protobuf,
numpy, pandas and pyarrow. The agent and the check also import the packages in ``CARRIED``; grpcio
and protobuf are carried too, because the committed gRPC stubs refuse older releases than the ones
that generated them, and the device's may be older. Each is carried at the version installed here,
the version the test suite ran with, as manylinux2014 (glibc 2.17) x86_64 wheels for every CPython
in ``PYTHONS`` (one wheel where the package is pure Python or abi3).

``requirements.txt`` in the destination pins them; ``make gpu-check`` installs exactly those with
``pip install --no-index --find-links <dest> --no-deps --target <throwaway dir>`` and puts that
directory first on ``PYTHONPATH``, so the device's own site-packages is never modified.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CARRIED = ("grpcio", "grpcio-health-checking", "protobuf", "prometheus-client", "psutil")
PYTHONS = ("3.10", "3.11", "3.12")
PLATFORM = "manylinux2014_x86_64"
# The whole folder travels with the working tree to the GPU machine, which takes 64 MiB in all.
MAX_BYTES = 50 * 2**20


def pins() -> list[str]:
    """``name==version`` of every carried package, at the version installed in this environment."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in CARRIED]


def download(dest: Path, pythons: Sequence[str] = PYTHONS) -> list[Path]:
    """Download the carried wheels into ``dest`` and write ``dest/requirements.txt``.

    Raises:
        RuntimeError: pip failed (its output is in the message), or the wheels exceed ``MAX_BYTES``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wanted = pins()
    for python in pythons:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "--platform", PLATFORM, "--implementation", "cp", "--python-version", python,
             "--dest", str(dest), *wanted], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip download for CPython {python} failed:\n{done.stdout}{done.stderr}")
    (dest / "requirements.txt").write_text("\n".join(wanted) + "\n")
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    if size > MAX_BYTES:
        raise RuntimeError(f"{dest} holds {size / 2**20:.1f} MiB of wheels, more than the {MAX_BYTES / 2**20:.0f} MiB "
                           f"that may travel with the tree; remove stale wheels (rm -r {dest}) and run again")
    return wheels


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.wheels", description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=Path(".gpu-wheels"), help="folder to fill (default .gpu-wheels)")
    p.add_argument("--pythons", nargs="+", default=list(PYTHONS), help="CPython versions (default 3.10 3.11 3.12)")
    args = p.parse_args(argv)
    try:
        wheels = download(args.dest, args.pythons)
    except RuntimeError as exc:
        print(f"gpu-wheels: {exc}", file=sys.stderr)
        return 1
    size = sum(w.stat().st_size for w in wheels)
    print(f"gpu-wheels: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest} for CPython "
          f"{' '.join(args.pythons)}: {' '.join(pins())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
