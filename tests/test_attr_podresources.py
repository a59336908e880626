"""PodResourcesClient (our unary gRPC over h2) against FakeKubelet, a real grpcio server on a
unix socket."""

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
from exporter.attribution.unarygrpc import RpcError, StatusCode, UnaryChannel
from exporter.core import SourceStatus
from gpusim.kubelet import ContainerAllocation, FakeKubelet, PodAllocation

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


def test_error_status_and_message_from_the_server(sock: str, kubelet: FakeKubelet) -> None:
    channel = UnaryChannel(sock)
    try:
        request = pb.GetPodResourcesRequest(pod_name="train", pod_namespace="ml")
        got = pb.GetPodResourcesResponse.FromString(
            channel.call("/v1.PodResourcesLister/Get", request.SerializeToString(), 2))
        assert [c.name for c in got.pod_resources.containers] == ["main", "log"]
        missing = pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml")
        with pytest.raises(RpcError) as err:
            channel.call("/v1.PodResourcesLister/Get", missing.SerializeToString(), 2)
        assert err.value.code == StatusCode.NOT_FOUND
        assert err.value.message == "pod ml/nope not found"
        with pytest.raises(RpcError) as err:
            channel.call("/v1.PodResourcesLister/Nope", b"", 2)
        assert err.value.code == StatusCode.UNIMPLEMENTED
    finally:
        channel.close()


def test_large_response_needs_flow_control(sock: str) -> None:
    """Far more than HTTP/2's default 64 KiB window in one answer."""
    pods = [PodAllocation("ns", f"pod-{i}", [ContainerAllocation(
        "main", [("nvidia.com/gpu", [f"GPU-{i:08x}-0000-4000-8000-000000000000::{i % 16}"])])])
        for i in range(3000)]
    with FakeKubelet(sock, lambda: pods, lambda: ALLOCATABLE):
        client = PodResourcesClient(sock, rpc_timeout=5)
        try:
            got = client.poll()
            assert got is not None and len(got) == 3000
            assert got[-1].pod == "pod-2999" and client.status.up
            assert client.poll() is not None  # the same connection serves the next cycle
            assert client.reconnects == 0
        finally:
            client.close()


def test_restarted_kubelet_is_reached_again(sock: str) -> None:
    client = PodResourcesClient(sock, rpc_timeout=1)
    try:
        with FakeKubelet(sock, lambda: PODS, lambda: ALLOCATABLE):
            assert client.poll() is not None
        assert client.poll() is None  # stopped: the socket file is gone
        assert client.status == SourceStatus(False, "no-socket")
        with FakeKubelet(sock, lambda: PODS, lambda: ALLOCATABLE) as again:
            assert client.poll() is not None and client.status.up
            assert again.calls["GetAllocatableResources"] == 1  # re-read on the new kubelet
    finally:
        client.close()


def test_something_else_on_the_socket(sock: str) -> None:
    """A socket that accepts and closes (not a gRPC server): unavailable, no traceback."""
    import socket
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock)
    server.listen(4)

    def serve() -> None:
        for _ in range(2):
            try:
                conn, _ = server.accept()
            except OSError:  # the test closed the socket: the client tried fewer times
                return
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = PodResourcesClient(sock, rpc_timeout=2)
    try:
        assert client.poll() is None
        assert client.status == SourceStatus(False, "unavailable")
    finally:
        client.close()
        server.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting (close does not)
        server.close()
        thread.join(timeout=5)


def test_connection_closed_while_idle_is_retried_at_once(sock: str) -> None:
    """A kubelet restart (or a GOAWAY on an idle connection) between two cycles: the next poll
    still answers, on a fresh connection, instead of losing a cycle."""
    client = PodResourcesClient(sock, rpc_timeout=2)
    try:
        with FakeKubelet(sock, lambda: PODS, lambda: ALLOCATABLE):
            assert client.poll() is not None
        with FakeKubelet(sock, lambda: PODS, lambda: ALLOCATABLE):
            assert client.poll() is not None and client.status.up
        assert client.reconnects == 0  # the channel object survived; its socket was replaced
    finally:
        client.close()
