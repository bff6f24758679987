"""Which pod, namespace and container holds each GPU: the kubelet's PodResourcesLister v1 API.

The kubelet serves ``/v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); the reply lists, per pod and container, the
device ids that device plugins allocated to it. The agent matches those ids to its GPUs:

1. Only resources of the GPU device plugins count: names starting with ``nvidia.com/`` (NVIDIA's
   plugin; MIG resources too) or ``amd.com/`` (AMD's). Other plugins' ids (NICs, FPGAs) could
   collide with a GPU index and are ignored.
2. A device id names a GPU when it equals one of that GPU's ids (``device_ids``): its UUID (how
   NVIDIA's plugin names devices by default, ``GPU-…``), its PCI bus id (how AMD's plugin names
   them, ``0000:c1:00.0``; compared without case and with the domain made 4 digits), or its
   index as a decimal string (NVIDIA's ``deviceIDStrategy: index``).
3. A GPU held by several containers (time-slicing) gets one entry per container.

Dynamic Resource Allocation claims (``dynamic_resources``) name CDI devices, not plugin ids, and
are not matched.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from agent.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")
# The kubelet answers from memory; a reply slower than this means it is wedged, and the refresh
# thread must not hang on it (the next refresh tries again).
LIST_TIMEOUT_S = 5.0
# Replies list every pod on the node with its CPU ids and memory: allow large nodes.
MAX_REPLY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, order=True)
class PodContainer:
    """One container holding a GPU."""

    namespace: str
    pod: str
    container: str


class PodResourcesUnavailable(RuntimeError):
    """The kubelet could not be asked; the message names the socket, the error and the fix."""


def normalize_id(device_id: str) -> str:
    """Canonical form of a device id: lower case, a PCI bus id's domain as 4 hex digits.

    amdsmi prints ``0000:c1:00.0`` while NVML prints ``00000000:C1:00.0``; both are the same device.
    """
    text = device_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1 and "." in rest and len(domain) > 4 and set(domain[:-4]) == {"0"}:
        return domain[-4:] + ":" + rest
    return text


def device_ids(uuids: Mapping[int, str], bus_ids: Mapping[int, str]) -> dict[str, int]:
    """Every id a device plugin may use for each GPU, normalized, mapped to the GPU index.

    Args:
        uuids: GPU index → UUID as the backend reports it (``DeviceInfo.uuid``).
        bus_ids: GPU index → PCI bus id, where the backend knows it.
    """
    ids: dict[str, int] = {}
    for gpu in sorted(set(uuids) | set(bus_ids)):
        ids[str(gpu)] = gpu
        for value in (uuids.get(gpu, ""), bus_ids.get(gpu, "")):
            if value:
                ids[normalize_id(value)] = gpu
    return ids


def assignments(reply: api_pb2.ListPodResourcesResponse, ids: Mapping[str, int]) -> dict[int, list[PodContainer]]:
    """GPU index → the containers that hold it, sorted, from one ``List`` reply."""
    held: dict[int, set[PodContainer]] = {}
    for pod in reply.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    continue
                for device_id in devices.device_ids:
                    gpu = ids.get(normalize_id(device_id))
                    if gpu is not None:
                        held.setdefault(gpu, set()).add(PodContainer(pod.namespace, pod.name, container.name))
    return {gpu: sorted(containers) for gpu, containers in sorted(held.items())}


class PodResourcesClient:
    """A client of the kubelet's PodResourcesLister on ``socket_path``; one channel, reused.

    Args:
        socket_path: The kubelet's pod-resources socket.
        timeout_s: Deadline of one ``List`` call, seconds.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = LIST_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)]
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list(self) -> api_pb2.ListPodResourcesResponse:
        """Ask the kubelet for every pod's resources.

        Raises:
            PodResourcesUnavailable: The call failed or timed out.
        """
        try:
            reply: api_pb2.ListPodResourcesResponse = self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise PodResourcesUnavailable(
                f"pod_resources_socket {self.socket_path!r}: List failed ({code}: {detail}); mount the kubelet's "
                "pod-resources directory into the agent and run it as a user that may connect (root on most nodes)"
            ) from None
        return reply

    def close(self) -> None:
        self._channel.close()

