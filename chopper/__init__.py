"""Chopper telemetry: step-aligned GPU efficiency telemetry for LLM training.

Training code adds two lines::

    import chopper
    chopper.init()                      # job, rank, GPU and agent socket from the environment
    for i, batch in enumerate(loader):
        with chopper.step(i, flops=model_flops, tokens=batch_tokens):
            with chopper.phase("forward"):
                loss = model(batch)
            ...

Markers go to the node agent over a unix socket from a background thread; a marker costs
microseconds, never blocks and never raises, and a missing agent is counted, not fatal (see
``chopper.client``). Before ``init`` the context managers are no-ops.

This module stays light: it imports neither torch, numpy, pandas nor grpc (grpc and the stubs
load in the sender thread).
"""
from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from chopper import _device_clock, _identity
from chopper.client import NOOP, Client, _Collective, _NoOp, _Phase, _Step

__all__ = ["Client", "collective", "init", "phase", "shutdown", "stats", "step"]

_client: Client | None = None
_last: Client | None = None  # the client shut down last, so stats() still reports after shutdown
_lock = threading.Lock()
_atexit_registered = False

_EMPTY_STATS: dict[str, Any] = {
    "queued": 0, "pending": 0, "sent": 0, "dropped": 0, "batches_sent": 0,
    "connected": False, "last_error": "",
}


def init(
    job: str | None = None,
    rank: int | None = None,
    agent: str | None = None,
    gpu: int | None = None,
    queue_size: int = 65536,
) -> Client:
    """Start the process-wide marker client, replacing (and flushing) any previous one.

    Args:
        job: Job id; default ``CHOPPER_JOB``, else the Slurm job (or array task), else
            ``TORCHELASTIC_RUN_ID`` unless ``none``, else what Kubernetes training operators
            expose, else ``"default"`` (docs/IDENTITY.md).
        rank: Global rank; default from ``torch.distributed`` when torch is already imported and
            the process group initialised, else ``RANK``, Slurm, Open MPI, PMI or PMIx.
        agent: gRPC target of the node agent; default ``CHOPPER_AGENT``, else
            ``unix:///run/chopper/agent.sock``.
        gpu: The agent's index of the GPU this rank drives, -1 for none; default resolved from
            the visibility variables, the local rank and torch's device UUID (docs/IDENTITY.md).
        queue_size: Most markers buffered while the agent is slow or away; more are dropped and
            counted.

    Returns:
        The new client. Timestamps are device events when torch is imported with CUDA/ROCm
        initialised (call ``init`` after moving the model to the GPU), else CPU time.
    """
    global _client, _atexit_registered
    env = os.environ
    identity = _identity.resolve(env, job=job, rank=rank, gpu=gpu)
    client = Client(
        job=identity.job,
        rank=identity.rank,
        gpu=identity.gpu,
        device_uuid=identity.device_uuid,
        device_source=identity.device_source,
        agent=agent if agent is not None else _identity.default_agent(env),
        queue_size=queue_size,
        device_clock=_device_clock.from_torch(),
    )
    with _lock:
        old, _client = _client, client
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    if old is not None:
        old.shutdown()
    return client


def step(i: int, flops: float | None = None, tokens: int | None = None) -> _Step | _NoOp:
    """``with chopper.step(i, flops=..., tokens=...)``: one training step (FLOPs on this rank)."""
    c = _client
    if c is None:
        return NOOP
    return _Step(c, i, flops, tokens)


def phase(name: str) -> _Phase | _NoOp:
    """``with chopper.phase("forward")``: a named phase inside the current step."""
    c = _client
    if c is None:
        return NOOP
    return _Phase(c, name)


def collective(name: str, bytes: int | None = None) -> _Collective | _NoOp:
    """``with chopper.collective("all_reduce", bytes=n)``: a collective of ``n`` payload bytes."""
    c = _client
    if c is None:
        return NOOP
    return _Collective(c, name, bytes)


def stats() -> dict[str, Any]:
    """Counters of the current (or last shut-down) client, see ``Client.stats``; zeros before ``init``."""
    c = _client if _client is not None else _last
    return dict(_EMPTY_STATS) if c is None else c.stats()


def shutdown(timeout: float = 2.0) -> None:
    """Flush within ``timeout`` seconds and stop the client; later markers are no-ops."""
    global _client, _last
    with _lock:
        c, _client = _client, None
        if c is not None:
            _last = c
    if c is not None:
        c.shutdown(timeout)


def _forget_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the client but not its sender thread;
    # markers there would only fill a dead queue.
    global _client
    _client = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
