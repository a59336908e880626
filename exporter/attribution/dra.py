"""DRA (`resource.k8s.io`) claimed devices resolved to GPUs and MIG instances.

PodResources v1 lists, per container, the devices of each ResourceClaim it consumes as
(driver, pool, device name). The driver's ResourceSlices for this node say what a device name
is: the NVIDIA DRA driver (`gpu.nvidia.com`) publishes `gpu-<minor>` and
`gpu-<minor>-mig-<profile>-<start>-<size>` devices whose `uuid` attribute is the NVML UUID
(a MIG device's parent is `parentUUID`). Attribute names may also be qualified with the driver
(`gpu.nvidia.com/uuid`); both are read.

Without ResourceSlices (no API access, RBAC without `resourceslices`, watch down) a
`gpu-<n>` name is taken as NVML index n, which holds where device minors follow NVML order
(the usual case, not a guarantee); MIG device names then cannot be resolved. The exporter says
so in `gpu_exporter_dra_fallback`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.attribution.deviceids import DeviceIndex, DeviceRef
from exporter.attribution.resourceslices import ResourceSlice

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
_GPU_NAME = re.compile(r"gpu-(?P<n>[0-9]{1,6})\Z")  # ASCII: `\d` would take `٣`


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a ResourceClaim a container consumes, as PodResources lists it."""

    namespace: str  # the pod's
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class SliceKey:
    driver: str
    pool: str
    device: str


def slice_uuids(slices: Iterable[ResourceSlice]) -> dict[SliceKey, str]:
    """(driver, pool, device name) → the device's `uuid` attribute, for devices that carry one."""
    out: dict[SliceKey, str] = {}
    for s in slices:
        for dev in s.devices:
            uuid = dev.attribute("uuid") or dev.attribute(f"{s.driver}/uuid")
            if uuid:
                out[SliceKey(s.driver, s.pool, dev.name)] = uuid
    return out


class DraResolver:
    """Resolves claimed devices of the GPU drivers in `drivers` against one DeviceIndex."""

    def __init__(self, drivers: Iterable[str] = (NVIDIA_DRA_DRIVER,)) -> None:
        self.drivers = frozenset(drivers)

    def is_gpu(self, dev: ClaimDevice) -> bool:
        return dev.driver in self.drivers

    @staticmethod
    def resolve(dev: ClaimDevice, uuids: dict[SliceKey, str] | None,
                index: DeviceIndex) -> DeviceRef | None:
        """The device a claim names; `uuids` None means ResourceSlices are unreadable and
        the `gpu-<n>` fallback applies."""
        if uuids is not None:
            uuid = uuids.get(SliceKey(dev.driver, dev.pool, dev.device))
            return index.resolve(uuid) if uuid else None
        m = _GPU_NAME.match(dev.device)
        return index.resolve(m["n"]) if m else None
