"""Client for the kubelet PodResources v1 API over its unix socket.

One channel stays open across cycles. After any failed call the channel is closed and the next
cycle builds a fresh one: a channel left in TRANSIENT_FAILURE backs off for up to minutes, while
a restarted kubelet is reachable at once. Every call carries a deadline (options.rpc_timeout).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from exporter.attribution import podresources_pb2 as pb
from exporter.attribution import podresources_pb2_grpc
from exporter.core import SourceStatus

pb_grpc: Any = podresources_pb2_grpc  # generated without annotations

log = logging.getLogger(__name__)

ALLOCATABLE_INTERVAL = 60.0  # seconds between GetAllocatableResources refreshes
_MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's own limit for this API


@dataclass(frozen=True)
class Allocation:
    """One container's devices of one resource, as List reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def _reason(err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    return code.name.lower().replace("_", "-") if code is not None else "error"


class PodResourcesClient:
    def __init__(self, socket_path: str, rpc_timeout: float,
                 allocatable_interval: float = ALLOCATABLE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = socket_path
        self.rpc_timeout = rpc_timeout
        self.allocatable_interval = allocatable_interval
        self._clock = clock
        self._channel: Any = None
        self._stub: Any = None
        self._allocatable_at: float | None = None  # None: fetch on the next poll
        # (resource, device id) pairs the kubelet can hand out, from GetAllocatableResources
        self.allocatable: tuple[tuple[str, str], ...] = ()
        self.status = SourceStatus(False, "not-polled")
        self.reconnects = 0

    def _connect(self) -> None:
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE)])
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
            self._allocatable_at = None  # a new connection may be a restarted kubelet

    def _drop(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
            self.reconnects += 1

    def poll(self) -> list[Allocation] | None:
        """List once (and GetAllocatableResources when due). None when the kubelet did not
        answer; `status` says why."""
        if not os.path.exists(self.socket_path):
            self._drop()
            self.status = SourceStatus(False, "no-socket")
            return None
        self._connect()
        try:
            now = self._clock()
            if self._allocatable_at is None or now - self._allocatable_at >= \
                    self.allocatable_interval:
                self._fetch_allocatable()
                self._allocatable_at = now
            response = self._stub.List(pb.ListPodResourcesRequest(), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            self._drop()
            self.status = SourceStatus(False, _reason(err))
            log.debug("podresources: %s", err)
            return None
        self.status = SourceStatus(True)
        return [
            Allocation(pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids))
            for pod in response.pod_resources for c in pod.containers for d in c.devices]

    def _fetch_allocatable(self) -> None:
        try:
            response = self._stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self.rpc_timeout)
        except grpc.RpcError as err:
            # Kubelets before 1.23 (or with the feature gate off) lack this call: List still
            # works, replica counts then come from List alone.
            if err.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNKNOWN):
                log.info("podresources: GetAllocatableResources unavailable: %s", _reason(err))
                return
            raise
        self.allocatable = tuple(
            (d.resource_name, device_id) for d in response.devices for device_id in d.device_ids)

    def close(self) -> None:
        self._drop()
