"""A simulated kubelet PodResources endpoint: a real gRPC server on a unix socket.

Tests and the demo point the exporter's attribution at it exactly as at a kubelet. `hang` makes
every handler block until it is cleared or the server stops, to exercise client deadlines.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from exporter.attribution import podresources_pb2 as pb
from exporter.attribution import podresources_pb2_grpc

pb_grpc: Any = podresources_pb2_grpc  # generated without annotations


@dataclass(frozen=True)
class ClaimAllocation:
    """A DRA ResourceClaim a container consumes and the devices allocated to it."""

    namespace: str
    name: str
    # (driver, pool, device name) as the DRA driver's ResourceSlices name them
    devices: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class ContainerAllocation:
    name: str
    # (resource_name, [device ids]) as the device plugin reports them
    devices: list[tuple[str, list[str]]] = field(default_factory=list)
    claims: list[ClaimAllocation] = field(default_factory=list)


@dataclass(frozen=True)
class PodAllocation:
    namespace: str
    name: str
    containers: list[ContainerAllocation] = field(default_factory=list)


def _pod_message(pod: PodAllocation) -> Any:
    return pb.PodResources(
        name=pod.name, namespace=pod.namespace,
        containers=[
            pb.ContainerResources(
                name=c.name,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)
                         for r, ids in c.devices],
                dynamic_resources=[
                    pb.DynamicResource(
                        claim_name=claim.name, claim_namespace=claim.namespace,
                        claim_resources=[pb.ClaimResource(driver_name=d, pool_name=p,
                                                          device_name=n)
                                         for d, p, n in claim.devices])
                    for claim in c.claims])
            for c in pod.containers])


class _Servicer(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._k = kubelet

    def List(self, request: Any, context: Any) -> Any:
        self._k._wait_if_hung()
        self._k.calls["List"] += 1
        return pb.ListPodResourcesResponse(
            pod_resources=[_pod_message(p) for p in self._k._pods()])

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        self._k._wait_if_hung()
        self._k.calls["GetAllocatableResources"] += 1
        by_resource: dict[str, list[str]] = {}
        for resource, device_id in self._k._allocatable():
            by_resource.setdefault(resource, []).append(device_id)
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=r, device_ids=ids)
            for r, ids in by_resource.items()])

    def Get(self, request: Any, context: Any) -> Any:
        self._k._wait_if_hung()
        self._k.calls["Get"] += 1
        for p in self._k._pods():
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=_pod_message(p))
        context.abort(grpc.StatusCode.NOT_FOUND,
                      f"pod {request.pod_namespace}/{request.pod_name} not found")
        return None  # unreachable: abort raises


class FakeKubelet:
    """`pods` and `allocatable` are called on every request, so a test can change them live."""

    def __init__(self, socket_path: str, pods: Callable[[], list[PodAllocation]],
                 allocatable: Callable[[], list[tuple[str, str]]]) -> None:
        self.socket_path = socket_path
        self._pods = pods
        self._allocatable = allocatable
        self._server: Any = None
        self._release = threading.Event()
        self._release.set()
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0, "Get": 0}

    @property
    def hang(self) -> bool:
        return not self._release.is_set()

    @hang.setter
    def hang(self, value: bool) -> None:
        if value:
            self._release.clear()
        else:
            self._release.set()

    def _wait_if_hung(self) -> None:
        self._release.wait()

    def start(self) -> FakeKubelet:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # a stale socket from a killed server
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        self._release.set()  # let hung handlers return so the pool can drain
        if server is not None:
            server.stop(grace=None).wait()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
