"""``python -m tests.faults.nvml_agent ARGS``: ``chopper-agent ARGS`` over a fake NVML whose GPUs can fall off the bus.

The fake is ``tests.support.nvml_fake.FakeNode`` (an autospec'd ``pynvml`` answering with the H100
fixture the nvidia backend's tests read), installed as the ``pynvml`` module: the vendor-library
seam, the only place the project fakes. ``SIGUSR1`` makes every NVML call that reads a device raise
``NVMLError_GpuIsLost`` (what NVML says when a GPU falls off the bus); ``SIGUSR2`` brings the GPUs
back. Everything else is the real agent (``agent.main.main``), whose main thread wakes every
``chopper.daemon.stopsignals.POLL_S`` seconds, so these handlers run within that whichever thread the
kernel hands the signal to.
"""
from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

import pynvml

from tests.support.nvml_fake import FakeNode, load_fixture

DEVICE_CALLS = ("nvmlDeviceGetFieldValues", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetCount")


def install() -> FakeNode:
    """Put the fake NVML in place of ``pynvml`` and wire SIGUSR1/SIGUSR2 to lose and restore the GPUs."""
    node = FakeNode(load_fixture())
    answers = {name: getattr(node.nv, name).side_effect for name in DEVICE_CALLS}
    counts = {name: getattr(node.nv, name).return_value for name in DEVICE_CALLS}

    def lost(*_: Any) -> Any:
        raise pynvml.NVMLError_GpuIsLost()

    def lose(*_: Any) -> None:
        for name in DEVICE_CALLS:
            getattr(node.nv, name).side_effect = lost

    def restore(*_: Any) -> None:
        for name in DEVICE_CALLS:
            getattr(node.nv, name).side_effect = answers[name]
            getattr(node.nv, name).return_value = counts[name]

    signal.signal(signal.SIGUSR1, lose)
    signal.signal(signal.SIGUSR2, restore)
    sys.modules["pynvml"] = node.nv
    return node


def main(argv: Sequence[str] | None = None) -> int:
    install()
    from agent.main import main as agent_main

    return agent_main([*(sys.argv[1:] if argv is None else argv), "--backend", "nvidia"])


if __name__ == "__main__":
    sys.exit(main())
