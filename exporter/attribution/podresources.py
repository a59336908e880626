"""Client for the kubelet PodResources v1 API over its unix socket.

One HTTP/2 connection stays open across cycles (exporter/attribution/unarygrpc.py, not grpcio:
see docs/performance.md, "Memory"). After any failed call it is closed and the next cycle opens
a fresh one, so a restarted kubelet is reachable at once. Every call carries a deadline
(options.rpc_timeout). Messages are the generated protobuf classes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from exporter.attribution import podresources_pb2 as pb
from exporter.attribution.dra import ClaimDevice
from exporter.attribution.unarygrpc import RpcError, StatusCode, UnaryChannel
from exporter.core import SourceStatus

log = logging.getLogger(__name__)

ALLOCATABLE_INTERVAL = 60.0  # seconds between GetAllocatableResources refreshes
_MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's own limit for this API
_SERVICE = "/v1.PodResourcesLister"


@dataclass(frozen=True)
class Allocation:
    """One container's devices of one resource, as List reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesClient:
    def __init__(self, socket_path: str, rpc_timeout: float,
                 allocatable_interval: float = ALLOCATABLE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = socket_path
        self.rpc_timeout = rpc_timeout
        self.allocatable_interval = allocatable_interval
        self._clock = clock
        self._channel: UnaryChannel | None = None
        self._allocatable_at: float | None = None  # None: fetch on the next poll
        # (resource, device id) pairs the kubelet can hand out, from GetAllocatableResources
        self.allocatable: tuple[tuple[str, str], ...] = ()
        self.status = SourceStatus(False, "not-polled")
        self.reconnects = 0
        # DRA devices of the claims containers consume, from the last successful List
        self.claim_devices: tuple[ClaimDevice, ...] = ()

    def _connect(self) -> UnaryChannel:
        if self._channel is None:
            self._channel = UnaryChannel(self.socket_path, max_message=_MAX_MESSAGE)
            self._allocatable_at = None  # a new connection may be a restarted kubelet
        return self._channel

    def _drop(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
            self.reconnects += 1

    def _call(self, method: str, request: Any, response: Any) -> Any:
        data = self._connect().call(f"{_SERVICE}/{method}", request.SerializeToString(),
                                    self.rpc_timeout)
        try:
            return response.FromString(data)
        except DecodeError as err:
            raise RpcError(StatusCode.INTERNAL, f"{method}: {err}") from err

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
            response = self._call("List", pb.ListPodResourcesRequest(),
                                  pb.ListPodResourcesResponse)
        except RpcError as err:
            self._drop()
            self.status = SourceStatus(False, err.reason)
            log.debug("podresources: %s", err)
            return None
        self.status = SourceStatus(True)
        self.claim_devices = tuple(
            ClaimDevice(pod.namespace, pod.name, c.name, d.claim_namespace, d.claim_name,
                        r.driver_name, r.pool_name, r.device_name)
            for pod in response.pod_resources for c in pod.containers
            for d in c.dynamic_resources for r in d.claim_resources)
        return [
            Allocation(pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids))
            for pod in response.pod_resources for c in pod.containers for d in c.devices]

    def _fetch_allocatable(self) -> None:
        try:
            response = self._call("GetAllocatableResources", pb.AllocatableResourcesRequest(),
                                  pb.AllocatableResourcesResponse)
        except RpcError as err:
            # Kubelets before 1.23 (or with the feature gate off) lack this call: List still
            # works, replica counts then come from List alone.
            if err.code in (StatusCode.UNIMPLEMENTED, StatusCode.UNKNOWN):
                log.info("podresources: GetAllocatableResources unavailable: %s", err.reason)
                return
            raise
        self.allocatable = tuple(
            (d.resource_name, device_id) for d in response.devices for device_id in d.device_ids)

    def close(self) -> None:
        self._drop()
