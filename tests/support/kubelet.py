"""A kubelet's PodResourcesLister v1 served for real: gRPC on a unix socket, in the test process.

Only the vendor seam is ours: the reply, which tests set to what a GPU node's kubelet returns.
"""
from __future__ import annotations

import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from agent.kubelet.podresources.v1 import api_pb2 as kpb
from agent.kubelet.podresources.v1 import api_pb2_grpc


def container(name: str, resource: str = "", *device_ids: str) -> kpb.ContainerResources:
    devices = [kpb.ContainerDevices(
        resource_name=resource, device_ids=list(device_ids),
        topology=kpb.TopologyInfo(nodes=[kpb.NUMANode(ID=0)]),
    )] if resource else []
    return kpb.ContainerResources(name=name, devices=devices, cpu_ids=[2, 3])


def pod(namespace: str, name: str, *containers: kpb.ContainerResources) -> kpb.PodResources:
    return kpb.PodResources(namespace=namespace, name=name, containers=list(containers))


class KubeletPodResources(api_pb2_grpc.PodResourcesListerServicer):
    """Serves ``reply`` to ``List``; ``delay_s`` makes it slow, as a wedged kubelet is."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.reply = kpb.ListPodResourcesResponse()
        self.delay_s = 0.0
        self.calls = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def List(  # the gRPC method's name
        self, request: kpb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> kpb.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        return self.reply

    def start(self) -> KubeletPodResources:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0).wait(5)
