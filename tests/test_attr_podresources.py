"""PodResourcesClient and FakeKubelet over a real gRPC unix socket."""

import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.attribution import podresources_pb2 as pb
from exporter.attribution import podresources_pb2_grpc
from exporter.attribution.podresources import Allocation, PodResourcesClient
from exporter.core import SourceStatus
from exporter.sim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation

GPU = "GPU-0aa1c2d3-0000-4000-8000-00000000000a"
PODS = [PodAllocation("ml", "train", [
    ContainerAllocation("main", [("nvidia.com/gpu", [f"{GPU}::0", f"{GPU}::1"])]),
    ContainerAllocation("log", [])])]
pb_grpc: Any = podresources_pb2_grpc  # generated without annotations
ALLOCATABLE = [("nvidia.com/gpu", f"{GPU}::{n}") for n in range(4)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sock() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="gl-pr-", dir="/tmp")
    yield str(Path(d) / "kubelet.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(sock: str) -> Iterator[FakeKubelet]:
    k = FakeKubelet(sock, lambda: PODS, lambda: ALLOCATABLE).start()
    yield k
    k.stop()


def test_list_and_allocatable_cadence(sock: str, kubelet: FakeKubelet) -> None:
    clock = Clock()
    client = PodResourcesClient(sock, rpc_timeout=2, clock=clock)
    try:
        for _ in range(3):
            assert client.poll() == [
                Allocation("ml", "train", "main", "nvidia.com/gpu", (f"{GPU}::0", f"{GPU}::1"))]
        assert client.status == SourceStatus(True)
        assert client.allocatable == tuple(ALLOCATABLE)
        assert kubelet.calls == {"List": 3, "GetAllocatableResources": 1, "Get": 0}
        clock.now += 61
        client.poll()
        assert kubelet.calls["GetAllocatableResources"] == 2
    finally:
        client.close()


def test_deadline_on_a_hung_kubelet(sock: str, kubelet: FakeKubelet) -> None:
    client = PodResourcesClient(sock, rpc_timeout=0.2)
    try:
        assert client.poll() is not None
        kubelet.hang = True
        assert client.poll() is None
        assert client.status == SourceStatus(False, "deadline-exceeded")
        kubelet.hang = False
        assert client.poll() is not None
        # the fresh channel re-read the allocatable devices
        assert kubelet.calls["GetAllocatableResources"] == 2
    finally:
        client.close()


def test_get_by_name(sock: str, kubelet: FakeKubelet) -> None:
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        got = stub.Get(pb.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=2)
        assert [c.name for c in got.pod_resources.containers] == ["main", "log"]
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=2)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


class OldKubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """A kubelet before GetAllocatableResources: only List is implemented."""

    def List(self, request: Any, context: Any) -> Any:
        return pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
            name="p", namespace="n", containers=[pb.ContainerResources(
                name="c", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                                       device_ids=[GPU])])])])


def test_kubelet_without_allocatable(sock: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(OldKubelet(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    client = PodResourcesClient(sock, rpc_timeout=2)
    try:
        assert client.poll() == [Allocation("n", "p", "c", "nvidia.com/gpu", (GPU,))]
        assert client.status.up and client.allocatable == ()
    finally:
        client.close()
        server.stop(None).wait()
