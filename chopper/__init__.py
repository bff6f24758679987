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

Markers still queued when the process ends are flushed (``SIGTERM_FLUSH_S`` at most): at a normal
exit by ``atexit``; on SIGTERM (what Kubernetes, Slurm and systemd send to stop a job) by a
handler ``init`` installs, because SIGTERM's default action ends the process before ``atexit``
runs. The handler flushes, puts the previous disposition back and lets the signal take its
course: the process ends as SIGTERM ends it (status -15), or the previous handler runs. It is
installed only from the main thread (Python allows no other) and only over the default
disposition or a handler of torch's (torchrun's elastic handler raises in the main thread):
a handler of the training code's, or ``SIG_IGN``, is the training code's choice, and is left
alone. ``shutdown`` puts the previous disposition back.

This module stays light: it imports neither torch, numpy, pandas nor grpc (grpc and the stubs
load in the sender thread). The client itself (``chopper.client``, the identity rules, the device
clock) loads in ``init`` or on first use of ``chopper.Client`` (PEP 562), so ``import chopper.trace``
and the other analysis subpackages, which import this package first, do not pay for it.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from chopper._noop import NOOP, _NoOp

if TYPE_CHECKING:
    from chopper.client import Client, _Collective, _Phase, _Step

__all__ = ["Client", "collective", "init", "phase", "shutdown", "stats", "step"]

# The release, in one place: pyproject.toml reads it (a setuptools dynamic version) and both daemons
# export it (``chopper_agent_info``, ``chopper_aggregator_info``, ``GetInfo``).
__version__ = "0.1.0"

# Longest a stop waits for the flush, s: well inside the grace period before SIGKILL (Kubernetes
# and Slurm's KillWait 30 s, systemd 90 s).
SIGTERM_FLUSH_S = 2.0

_client: Client | None = None
_last: Client | None = None  # the client shut down last, so stats() still reports after shutdown
_lock = threading.Lock()
_atexit_registered = False
_sigterm_previous: Any = None  # the disposition our SIGTERM handler replaced; None while it is not installed

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
        initialised (call ``init`` after moving the model to the GPU), else CPU time. Called from
        the main thread, ``init`` also makes SIGTERM flush first (module docstring).
    """
    from chopper import _device_clock
    from chopper.client import Client
    from chopper.identity import process as _identity

    global _client, _atexit_registered, _Step, _Phase, _Collective
    # Bound here, not imported at the top (module docstring): step/phase/collective construct
    # them directly, a method call less per marker on the training loop's path.
    from chopper.client import _Collective, _Phase, _Step
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
    _install_sigterm_flush()
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


def shutdown(timeout: float = SIGTERM_FLUSH_S) -> None:
    """Flush within ``timeout`` seconds and stop the client; later markers are no-ops. SIGTERM is as before ``init``."""
    global _client, _last
    with _lock:
        c, _client = _client, None
        if c is not None:
            _last = c
    if c is not None:
        c.shutdown(timeout)
    _uninstall_sigterm_flush()


def _install_sigterm_flush() -> None:
    global _sigterm_previous
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm or not (current == signal.SIG_DFL or _is_torchs(current)):
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (AttributeError, OSError, ValueError):  # no SIGTERM here, or an interpreter without signals
        return
    _sigterm_previous = current


def _uninstall_sigterm_flush() -> None:
    global _sigterm_previous
    if _sigterm_previous is None or threading.current_thread() is not threading.main_thread():
        return  # elsewhere ours stays: with no client it only passes the signal on
    with contextlib.suppress(AttributeError, OSError, ValueError):
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # one set after ours is not ours to replace
            signal.signal(signal.SIGTERM, _sigterm_previous)
    _sigterm_previous = None


def _is_torchs(handler: Any) -> bool:
    module = getattr(handler, "__module__", None) or ""
    return callable(handler) and (module == "torch" or module.startswith("torch."))


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Flush the client within ``SIGTERM_FLUSH_S``, then pass the signal to what handled it before ``init``.

    Reads ``_client`` without ``_lock``: the signal may have interrupted ``init`` holding it. A
    second SIGTERM during the flush finds the previous disposition taken and ends the process.
    """
    global _client, _last, _sigterm_previous
    previous, _sigterm_previous = _sigterm_previous, None
    c = _client
    if c is not None:
        _client, _last = None, c
        began = time.monotonic()
        pending = c.stats()["pending"]
        c.shutdown(SIGTERM_FLUSH_S)
        s = c.stats()
        import logging  # loaded already: the client imports it

        logging.getLogger("chopper.client").log(
            logging.WARNING if s["dropped"] else logging.INFO,
            "event=flushed_on_signal signal=SIGTERM pending=%d queued=%d sent=%d dropped=%d seconds=%.3f",
            pending, s["queued"], s["sent"], s["dropped"], time.monotonic() - began)
    if previous is None:
        previous = signal.SIG_DFL
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGTERM, previous)
    if callable(previous):
        previous(signum, frame)
    else:
        signal.raise_signal(signum)  # the default disposition now: the process ends as SIGTERM ends it


def __getattr__(name: str) -> Any:
    """``chopper.Client``, imported on first use (module docstring)."""
    if name == "Client":
        from chopper.client import Client

        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _forget_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the client but not its sender thread;
    # markers there would only fill a dead queue.
    global _client
    _client = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
