"""The Chopper node agent: samples GPUs, receives trainers' markers, serves gRPC and /metrics."""
from __future__ import annotations

from chopper import __version__ as __version__  # the release is chopper's; kept here for agent.daemon
