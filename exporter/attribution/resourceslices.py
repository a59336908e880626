"""The ResourceSlices of this node (DRA, `resource.k8s.io/v1`): which devices a driver
publishes, with their attributes, for attributing claimed devices (issue 11 builds on this).

A NodeScopedWatch of `/apis/resource.k8s.io/v1/resourceslices` with
`fieldSelector=spec.nodeName=<node>`, the same list+watch, 410 relist and backoff as the pod
watch. Needs `get`, `list`, `watch` on `resourceslices` in the exporter's ClusterRole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.core import ExporterOptions
from exporter.kube.client import connector
from exporter.kube.watch import DEFAULT_BACKOFF, BackoffPolicy, NodeScopedWatch, WatchedKind


@dataclass(frozen=True)
class SliceDevice:
    name: str
    # scalar attributes (`int`, `bool`, `string`, `version`) as text, sorted by name; names as
    # the driver wrote them (`uuid`, or qualified like `gpu.nvidia.com/uuid`)
    attributes: tuple[tuple[str, str], ...] = ()

    def attribute(self, name: str) -> str | None:
        return dict(self.attributes).get(name)


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    node: str
    devices: tuple[SliceDevice, ...] = ()


def _value(raw: Any) -> str | None:
    """A DeviceAttribute ({"string": ...} or int/bool/version) as text."""
    if not isinstance(raw, dict):
        return None
    for key in ("string", "int", "version"):
        if key in raw and raw[key] is not None:
            return str(raw[key])
    if isinstance(raw.get("bool"), bool):
        return "true" if raw["bool"] else "false"
    return None


def resource_slice(obj: dict[str, Any]) -> ResourceSlice | None:
    """A ResourceSlice from its JSON; None without a name or a driver."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name, driver = meta.get("name"), spec.get("driver")
    if not isinstance(name, str) or not isinstance(driver, str):
        return None
    devices = []
    for dev in spec.get("devices") or ():
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            continue
        attrs = dev.get("attributes") or {}
        pairs = sorted((str(k), v) for k, raw in attrs.items()
                       if (v := _value(raw)) is not None) if isinstance(attrs, dict) else []
        devices.append(SliceDevice(dev["name"], tuple(pairs)))
    pool = spec.get("pool") or {}
    return ResourceSlice(name, driver, str(pool.get("name") or ""),
                         str(spec.get("nodeName") or ""), tuple(devices))


RESOURCE_SLICES = WatchedKind("ResourceSlice", "/apis/resource.k8s.io/v1/resourceslices",
                              resource_slice)


def resource_slice_watch(options: ExporterOptions, *, policy: BackoffPolicy = DEFAULT_BACKOFF,
                         watch_timeout: int = 300,
                         request_timeout: float = 10.0) -> NodeScopedWatch[ResourceSlice]:
    """Not started: call start(). `items` maps each slice's UID to its ResourceSlice."""
    return NodeScopedWatch(RESOURCE_SLICES, options.node,
                           connector(options.kubeconfig, request_timeout), policy=policy,
                           watch_timeout=watch_timeout)
