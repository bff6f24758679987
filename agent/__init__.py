"""The Chopper node agent: samples GPUs, receives trainers' markers, serves gRPC and /metrics."""
from __future__ import annotations
