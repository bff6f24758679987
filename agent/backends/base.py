"""The one small protocol every GPU backend implements, and the errors it may raise.

A backend converts its vendor's units to the DESIGN data model (``chopper.schema``) at this
boundary and nowhere else. The sampler calls ``open()`` once, ``sample(now_ns)`` on every tick
and ``close()`` at shutdown. A backend never swallows a failure silently: it raises one of the
errors below, which the sampler turns into ``chopper_agent_backend_up`` and error counters while
the daemon keeps serving.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agent.marker_wire import MarkerRow
from chopper.schema import DeviceInfo, Sample


class BackendError(Exception):
    """A backend failed; the message names the problem and what to do about it."""


class BackendUnavailable(BackendError):
    """The backend cannot run here: vendor library missing, no device, no permission.

    Raised by ``open()``. Auto-detection moves on to the next backend; an explicitly chosen
    backend makes the agent exit with this message.
    """


class DeviceLost(BackendError):
    """A device stopped answering (fell off the bus, driver reset).

    Raised by ``sample()``. The sampler reports the backend down and retries ``open()`` with
    backoff until the device is back.

    Attributes:
        gpu: Local index of the lost device, or None when the backend cannot tell.
    """

    def __init__(self, message: str, gpu: int | None = None) -> None:
        super().__init__(message)
        self.gpu = gpu


@runtime_checkable
class Backend(Protocol):
    """A source of per-GPU samples.

    Attributes:
        name: Backend name as chosen in the config: ``amd``, ``nvidia``, ``simulated``, ``replay``.
    """

    name: str

    def open(self) -> list[DeviceInfo]:
        """Initialise the vendor library and return one row per GPU, ordered by ``gpu``."""
        ...

    def sample(self, now_ns: int) -> list[Sample]:
        """Read every GPU once; ``now_ns`` (CLOCK_REALTIME) becomes each sample's ``ts_ns``."""
        ...

    def close(self) -> None:
        """Release the vendor library; safe to call twice or after a failed ``open()``."""
        ...


@runtime_checkable
class MarkerObserver(Protocol):
    """Optional extra of a backend that reacts to training markers (the simulator does)."""

    def observe_markers(self, gpu: int, markers: Sequence[MarkerRow]) -> None:
        """Called by the agent once per batch with its accepted markers, of a rank driving local GPU ``gpu``.

        Each marker is a row (``agent.marker_wire``): ``(ts_ns, kind, step, name, flops, tokens, bytes, clock)``.
        """
        ...

