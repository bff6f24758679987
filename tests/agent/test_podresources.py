"""The kubelet pod-resources client against a real PodResourcesLister on a unix socket."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kubelet.podresources.v1 import api_pb2 as kpb
from agent.podresources import (
    PodContainer,
    PodResourcesClient,
    PodResourcesUnavailable,
    assignments,
    device_ids,
    normalize_id,
)
from agent.workload import PodResourcesSource, Workload, WorkloadTracker
from tests.support.kubelet import KubeletPodResources, container, pod

ROOT = Path(__file__).resolve().parents[2]
PROTO = "agent/kubelet/podresources/v1/api.proto"

NV = {0: "GPU-5c0b8a5e-27c6-5b0e-9f43-ffd6a8e8a2a1", 1: "GPU-9d1e6a77-0c1f-5a71-b7d5-3a0c6f2b1e90",
      2: "GPU-0e4b5a61-9a0e-5d1b-8c3e-62a1f4b9c7d2", 3: "GPU-7f2c3d18-4b6a-5e0f-a1d9-c85e2b7a9f03"}
AMD_BUS = {0: "0000:05:00.0", 1: "0000:26:00.0", 2: "0000:46:00.0", 3: "0000:65:00.0"}


def node_reply() -> kpb.ListPodResourcesResponse:
    """What a busy 4-GPU node's kubelet lists: several pods, GPUs and other devices, idle pods, time-slicing."""
    return kpb.ListPodResourcesResponse(pod_resources=[
        pod("kube-system", "coredns-5d78c9869d-x7k2p", container("coredns")),
        pod("ml-train", "llama-8b-worker-0",
            container("trainer", "nvidia.com/gpu", NV[0], NV[1]),
            container("sidecar")),
        pod("ml-train", "llama-8b-worker-0-sriov", container("net", "intel.com/sriov_netdevice", "0000:3b:02.1", "2")),
        pod("research", "notebook-abc", container("jupyter", "nvidia.com/gpu", NV[2])),
        pod("research", "notebook-def", container("jupyter", "nvidia.com/gpu", NV[2])),  # time-sliced GPU
        pod("amd-train", "mixtral-worker-3", container("trainer", "amd.com/gpu", "0000:65:00.0")),
    ])


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletPodResources]:
    server = KubeletPodResources(tmp_path / "kubelet.sock").start()
    yield server
    server.stop()


def test_list_over_the_unix_socket_maps_gpus_to_containers(kubelet: KubeletPodResources) -> None:
    kubelet.reply = node_reply()
    client = PodResourcesClient(str(kubelet.socket))
    try:
        held = assignments(client.list(), device_ids(NV, {}))
    finally:
        client.close()
    assert held == {
        0: [PodContainer("ml-train", "llama-8b-worker-0", "trainer")],
        1: [PodContainer("ml-train", "llama-8b-worker-0", "trainer")],
        2: [PodContainer("research", "notebook-abc", "jupyter"), PodContainer("research", "notebook-def", "jupyter")],
    }  # the SR-IOV id "2" is not GPU 2; no NVIDIA UUID matches the AMD pod


def test_amd_device_ids_are_pci_bus_ids_in_either_spelling() -> None:
    reply = node_reply()
    nvml_style = {3: "00000000:65:00.0"}  # NVML pads the domain to 8 digits and upper-cases hex
    assert assignments(reply, device_ids({3: "amd-uuid-3"}, nvml_style)) == {
        3: [PodContainer("amd-train", "mixtral-worker-3", "trainer")]
    }
    assert assignments(reply, device_ids({}, AMD_BUS))[3] == [PodContainer("amd-train", "mixtral-worker-3", "trainer")]
    assert normalize_id("00000000:C1:00.0") == normalize_id("0000:c1:00.0") == "0000:c1:00.0"
    assert normalize_id("GPU-ABC") == "gpu-abc"


def test_index_device_ids_as_nvidia_plugin_index_strategy(kubelet: KubeletPodResources) -> None:
    kubelet.reply = kpb.ListPodResourcesResponse(pod_resources=[pod("a", "p", container("c", "nvidia.com/gpu", "1"))])
    client = PodResourcesClient(str(kubelet.socket))
    try:
        assert assignments(client.list(), device_ids(NV, {})) == {1: [PodContainer("a", "p", "c")]}
    finally:
        client.close()


def test_no_kubelet_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=2)
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable, match=r"pod_resources_socket '.*absent.sock': List failed \(UNAVAIL"):
        client.list()
    assert time.monotonic() - started < 3
    client.close()


def test_a_wedged_kubelet_times_out_and_the_tracker_keeps_its_last_reading(kubelet: KubeletPodResources) -> None:
    kubelet.reply = node_reply()
    # The deadline leaves a starved runner seconds for the good Lists (connection setup included);
    # the wedged kubelet answers well after it.
    source = PodResourcesSource(PodResourcesClient(str(kubelet.socket), timeout_s=3.0))
    tracker = WorkloadTracker([source], refresh_s=1)
    tracker.set_device_ids(device_ids(NV, {}))
    tracker.refresh()
    first = tracker.table()
    assert first[0] == (Workload("podresources", namespace="ml-train", pod="llama-8b-worker-0", container="trainer"),)
    assert source.health.up
    kubelet.delay_s = 6.0
    tracker.refresh()
    assert not source.health.up and source.health.errors == {"unavailable": 1}
    assert tracker.table() == first  # ownership rarely changes; a hiccup must not unlabel every GPU
    kubelet.delay_s = 0.0
    kubelet.reply = kpb.ListPodResourcesResponse()
    tracker.refresh()
    assert source.health.up and tracker.table() == {}
    source.client.close()


def test_vendored_stubs_are_what_protoc_generates(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", PROTO],
        check=True, cwd=ROOT, timeout=60,
    )
    stubs = sorted((tmp_path / Path(PROTO).parent).glob("api_pb2*"))
    assert [p.name for p in stubs] == ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]
    for generated in stubs:
        committed = ROOT / Path(PROTO).parent / generated.name
        assert committed.read_text() == generated.read_text(), "regenerate as agent/kubelet/__init__.py says"

