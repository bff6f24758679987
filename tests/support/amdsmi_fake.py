"""A fake amdsmi (an autospec of the installed package) answering from tests/fixtures/amdsmi.

The vendor package cannot be imported without ROCm's ``libamd_smi.so``, so ``import_real_amdsmi``
imports it once with ``ctypes.CDLL`` stubbed (and then removes it from ``sys.modules`` again), and
``mock.create_autospec`` builds the fake from it: a call with the wrong signature fails here as
it would on hardware. Its enums and exception classes stay the real ones, since the backend uses
them as values. Every answer comes from a fixture file, each of which states its source.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest

from agent.backends.amd import AmdBackend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "amdsmi"
MIB = 1024 * 1024


def load(name: str) -> dict[str, Any]:
    """A fixture of tests/fixtures/amdsmi by file name."""
    return json.loads((FIXTURES / name).read_text())


def _vendor_modules() -> list[str]:
    return [name for name in sys.modules if name == "amdsmi" or name.startswith("amdsmi.")]


def import_real_amdsmi() -> ModuleType:
    """The installed amdsmi package, imported against a stand-in for libamd_smi.so; skips if absent."""
    if importlib.util.find_spec("amdsmi") is None:
        pytest.skip("amdsmi is not installed (pip install 'chopper-telemetry[amd]')")
    saved = {name: sys.modules.pop(name) for name in _vendor_modules()}
    try:
        with mock.patch("ctypes.CDLL", return_value=mock.MagicMock()), \
                contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module("amdsmi")
    finally:
        # Other tests (and conftest's GPU probe) must see the package as it really imports here.
        for name in _vendor_modules():
            del sys.modules[name]
        sys.modules.update(saved)


class FakeNode:
    """MI300X GPUs answering from the recorded reads, one tick at a time.

    Without ``partitions``, ``gpus`` whole chips (SPX, NPS1), each on a PCI bus of its own. With
    ``partitions`` (the entries of mi300x_cpx_nps4.json), one handle per partition; partitions
    that share a PCI ``domain:bus:device`` read one gpu_metrics table, their chip's, with
    ``metrics_update`` (the fixture's partition-shaped fields) applied. Health
    queries answer ``health["readings"][tick]`` (the last reading after the last tick).
    """

    def __init__(self, real: ModuleType, recorded: dict[str, Any], gpus: int = 2,
                 health: dict[str, Any] | None = None, partitions: list[dict[str, Any]] | None = None,
                 metrics_update: dict[str, Any] | None = None) -> None:
        self.real = real
        self.device = recorded["device"]
        self.health = health if health is not None else load("mi300x_health.json")
        self.places = partitions if partitions is not None else [self._whole_chip(i) for i in range(gpus)]
        self.handles = [f"handle{i}" for i in range(len(self.places))]
        chips: dict[str, list[dict[str, Any]]] = {}
        self.ticks = [chips.setdefault(p["gpu_device_bdf"].rpartition(".")[0], copy.deepcopy(recorded["ticks"]))
                      for p in self.places]
        for tick in (t for chip in chips.values() for t in chip):
            tick["gpu_metrics_info"].update(copy.deepcopy(metrics_update or {}))
        self.tick = 0
        self.opened = False
        self.smi = mock.create_autospec(real)
        # Classes and enums the backend uses as values, not calls, must be the real ones.
        for name in dir(real):
            if name.startswith("AmdSmi") and isinstance(getattr(real, name), type):
                setattr(self.smi, name, getattr(real, name))
        s = self.smi
        s.amdsmi_get_processor_handles.return_value = self.handles
        s.amdsmi_get_gpu_asic_info.return_value = self.device["gpu_asic_info"]
        s.amdsmi_get_clock_info.return_value = self.device["clock_info_gfx"]
        s.amdsmi_get_power_cap_info.return_value = self.device["power_cap_info"]
        for query in ("gpu_device_uuid", "gpu_device_bdf", "gpu_kfd_info", "gpu_compute_partition",
                      "gpu_memory_partition"):
            getattr(s, f"amdsmi_get_{query}").side_effect = lambda h, q=query: self._place(h)[q]
        s.amdsmi_get_gpu_metrics_info.side_effect = lambda h: self._read(h)["gpu_metrics_info"]
        s.amdsmi_get_gpu_vram_usage.side_effect = self._vram
        s.amdsmi_get_gpu_ras_block_features_enabled.side_effect = \
            lambda h: copy.deepcopy(self.health["gpu_ras_block_features_enabled"])
        s.amdsmi_get_gpu_ecc_count.side_effect = lambda h, block: self._health("gpu_ecc_count")[block.name]
        for query in ("gpu_total_ecc_count", "pcie_info", "gpu_bad_page_info"):
            getattr(s, f"amdsmi_get_{query}").side_effect = lambda h, q=query: self._health(q)
        s.amdsmi_gpu_xgmi_error_status.side_effect = lambda h: self._health("gpu_xgmi_error_status")

    def _whole_chip(self, i: int) -> dict[str, Any]:
        uuid = self.device["gpu_device_uuid"]
        return {"gpu_device_bdf": f"0000:{0x05 + 0x20 * i:02x}:00.0", "gpu_device_uuid": uuid[:-1] + str(i),
                "gpu_kfd_info": {"kfd_id": 10000 + i, "node_id": 2 + i, "current_partition_id": 0},
                "gpu_compute_partition": "SPX", "gpu_memory_partition": "NPS1"}

    def _place(self, handle: str) -> dict[str, Any]:
        return self.places[self.handles.index(handle)]

    def _read(self, handle: str) -> dict[str, Any]:
        return self.ticks[self.handles.index(handle)][min(self.tick, 1)]

    def _vram(self, handle: str) -> dict[str, Any]:
        own = self._place(handle).get("gpu_vram_usage")
        if own is not None:
            return dict(own)
        return self.device["gpu_vram_usage"] if not self.opened else self._read(handle)["gpu_vram_usage"]

    def _health(self, query: str) -> Any:
        readings = self.health["readings"]
        return copy.deepcopy(readings[min(self.tick, len(readings) - 1)][query])

    def metrics(self, gpu: int, tick: int) -> dict[str, Any]:
        """The gpu_metrics table GPU ``gpu`` answers at ``tick`` (its chip's)."""
        return self.ticks[gpu][tick]["gpu_metrics_info"]

    def now_ns(self, tick: int) -> int:
        return int(self.ticks[0][tick]["now_ns"])

    def error(self, code: int) -> Exception:
        return self.real.AmdSmiLibraryException(code)

    def fail(self, query: str, code: int) -> None:
        """Make ``smi.<query>`` raise amdsmi's exception for ``code`` on every handle."""
        getattr(self.smi, query).side_effect = self.error(code)


@contextlib.contextmanager
def backend_for(node: FakeNode, *, opened: bool = False) -> Iterator[AmdBackend]:
    """The amd backend of node "node-a" over ``node``'s amdsmi (``open()``-ed if asked), closed afterwards."""
    backend = AmdBackend("node-a", smi=node.smi)
    if opened:
        backend.open()
        node.opened = True
    try:
        yield backend
    finally:
        backend.close()
