"""Shared pytest configuration: ``gpu``-marked tests skip themselves where no GPU is present."""
from __future__ import annotations

import pytest

from tests.support.hazards import HazardOutcome


def _has_gpu() -> bool:
    """True when a real AMD or NVIDIA GPU answers through its vendor library."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        from agent.backends.amd import import_amdsmi

        amdsmi = import_amdsmi()
        amdsmi.amdsmi_init()
        try:
            return len(amdsmi.amdsmi_get_processor_handles()) > 0
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real AMD or NVIDIA GPU (none found through NVML or amdsmi)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def hazard() -> HazardOutcome:
    """The measured outcome of a ``@pytest.mark.hazard(item=..., input=..., promise=...)`` test."""
    return HazardOutcome()
