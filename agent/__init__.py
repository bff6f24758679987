"""The Chopper node agent: samples GPUs, receives trainers' markers, serves gRPC and /metrics."""
from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("chopper-telemetry")
except metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"
