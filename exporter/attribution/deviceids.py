"""Device IDs as device plugins report them, resolved against the node's NVML inventory.

Forms (DESIGN.md §4): `GPU-<uuid>`, `MIG-<uuid>`, either with a `::<n>` replica suffix
(time-slicing / MPS), the legacy `MIG-GPU-<uuid>/<gi>/<ci>`, GKE's `nvidia0`, `nvidia0/gi1`,
`nvidia0/vgpu3`, the NVIDIA device plugin's `deviceIDStrategy: index` (`0`, `0::1`, and
`<gpu>:<j>` for the j-th MIG device handle of GPU `<gpu>`, as its rm package numbers them),
CDI fully-qualified names `<vendor>/<class>=<name>` whose name is any of the above or `all`,
and PCI addresses (`0000:0c:00.0`, in any vendor's spelling: contract.pci_bdf), which AMD's and
Intel's device plugins build their IDs from; an address resolves to the GPU whose
`GpuStatic.pci_bdf` it is, the join key beside the UUID. The same physical device can appear
under several IDs (replicas), so every ID resolves to a `DeviceRef` keyed by (uuid, mig_uuid).

HAMi's device plugin registers each GPU `deviceSplitCount` times (10 in its chart) as
`GPU-<uuid>-<n>` (Project-HAMi/HAMi `pkg/device-plugin/nvidiadevice/nvinternal/rm/devices.go`
GetPluginDevices, v2.4.0 to v2.10.0; MIG devices keep their `MIG-<uuid>`). Such an ID resolves
to its GPU as a `slot`: the kubelet picks slots without knowing HAMi's decision (unless HAMi's
GetPreferredAllocation is on), so the pod's `hami.io/vgpu-devices-allocated` annotation, not
the slot, says which GPU and how much (fractional.py); a slot is never a unit of its own.

Numbers in IDs are ASCII digits of bounded length (a regex digit class would take `٣`;
`int()` refuses 4,300 digits): anything else is no ID form and resolves to nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.core import GpuRef, GpuStatic, MigRef
from exporter.device.contract import pci_address
from gpu_ledger.sharing import SharingMode

log = logging.getLogger(__name__)


MAX_ID = 256  # longer device IDs are no form we know
_N = "[0-9]{1,6}"  # an index, replica or instance number
_REPLICA = re.compile(rf"^(?P<base>.+?)::(?P<n>{_N})$")
_GKE = re.compile(rf"^nvidia(?P<index>{_N})(?:/(?P<kind>gi|vgpu)(?P<n>{_N}))?$")
_LEGACY_MIG = re.compile(rf"^MIG-(?P<parent>GPU-[0-9A-Fa-f-]+)/(?P<gi>{_N})/(?P<ci>{_N})$")
_INDEX = re.compile(rf"^(?P<gpu>{_N})(?::(?P<slot>{_N}))?$")
_HAMI_SLOT = re.compile(rf"^(?P<gpu>GPU-[0-9A-Fa-f-]+)-(?P<n>{_N})$")
# cheap pre-check before parsing an address: hex digits, ':' and '.' only
_ADDRESS_LIKE = re.compile(r"^[0-9A-Fa-f]{1,8}:[0-9A-Fa-f:.]{4,16}$")
# CDI fully-qualified device name: vendor/class=name (the kind is not checked: the resource
# already said this is a GPU)
_CDI = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*=(?P<name>.+)$")


@dataclass(frozen=True)
class DeviceRef:
    uuid: str  # the GPU (parent for MIG)
    mig_uuid: str  # '' for a whole GPU
    replica: bool  # the ID names one share of the device (time-slicing / MPS)
    slot: bool = False  # HAMi's kubelet slot `GPU-<uuid>-<n>`: the annotation is the unit

    @property
    def key(self) -> tuple[str, str]:
        return (self.uuid, self.mig_uuid)


def _bare(uuid: str) -> str:
    """Lower-case UUID without its GPU-/MIG- prefix: NVML and plugins differ in both."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith(("gpu-", "mig-")) else u


class DeviceIndex:
    """Resolves device IDs for one inventory. Rebuilt only when the inventory changes; each
    distinct ID is parsed once and memoised, since List repeats the same IDs every cycle."""

    def __init__(self, gpus: Iterable[GpuRef], migs: Iterable[MigRef],
                 static: Mapping[str, GpuStatic] | None = None) -> None:
        self._gpu_by_uuid: dict[str, GpuRef] = {}
        self._gpu_by_bdf: dict[str, GpuRef] = {}
        self._gpu_by_index: dict[int, GpuRef] = {}
        self._mig_by_uuid: dict[str, MigRef] = {}
        self._mig_by_gi: dict[tuple[str, int], MigRef] = {}
        self._mig_by_slot: dict[tuple[int, int], MigRef] = {}
        for g in gpus:
            self._gpu_by_uuid[_bare(g.uuid)] = g
            # indexes are per vendor (NVIDIA's 0 and an Intel iGPU's 0): index IDs are NVIDIA
            # plugins' only, so the NVIDIA GPU keeps the index
            if g.vendor == "nvidia" or g.index not in self._gpu_by_index:
                self._gpu_by_index[g.index] = g
            bdf = (static or {}).get(g.uuid, GpuStatic()).pci_bdf
            if pci_address(bdf):
                self._gpu_by_bdf[bdf] = g
        for m in migs:
            self._mig_by_uuid[_bare(m.uuid)] = m
            self._mig_by_gi[(m.parent.uuid, m.gpu_instance_id)] = m
            if m.slot >= 0:
                self._mig_by_slot[(m.parent.index, m.slot)] = m
        self._memo: dict[str, DeviceRef | None] = {}
        self._whole = tuple(DeviceRef(g.uuid, "", False)
                            for g in sorted(self._gpu_by_index.values(), key=lambda g: g.index))

    def resolve(self, device_id: str) -> DeviceRef | None:
        """The device an ID names, or None when no GPU or MIG instance on this node matches."""
        try:
            return self._memo[device_id]
        except KeyError:
            ref = self._memo[device_id] = self._parse(device_id)
            return ref

    def by_bdf(self, address: str) -> GpuRef | None:
        """The GPU at a PCI address (any spelling), or None."""
        bdf = pci_address(address)
        return None if bdf is None else self._gpu_by_bdf.get(bdf)

    def resolve_all(self, device_id: str) -> tuple[DeviceRef, ...]:
        """Every device an ID names: CDI's `<kind>=all` names each GPU of the node, any other
        form one device or none."""
        cdi = _CDI.match(device_id.strip())
        if cdi and cdi["name"] == "all":
            return self._whole
        ref = self.resolve(device_id)
        return () if ref is None else (ref,)

    def _parse(self, device_id: str) -> DeviceRef | None:
        replica = False
        base = device_id.strip()
        if len(base) > MAX_ID:
            return None
        cdi = _CDI.match(base)
        if cdi:
            base = cdi["name"]
        m = _REPLICA.match(base)
        if m:
            base, replica = m["base"], True
        if self._gpu_by_bdf and _ADDRESS_LIKE.match(base):
            gpu = self.by_bdf(base)
            if gpu is not None:
                return DeviceRef(gpu.uuid, "", replica)
        g = _GKE.match(base)
        if g:
            return self._gke(int(g["index"]), g["kind"], int(g["n"] or 0), replica)
        by_index = _INDEX.match(base)
        if by_index:
            return self._by_index(int(by_index["gpu"]), by_index["slot"], replica)
        legacy = _LEGACY_MIG.match(base)
        if legacy:
            parent = self._gpu_by_uuid.get(_bare(legacy["parent"]))
            mig = self._mig_by_gi.get((parent.uuid, int(legacy["gi"]))) if parent else None
            return DeviceRef(mig.parent.uuid, mig.uuid, replica) if mig else None
        bare = _bare(base)
        if not base.lower().startswith("mig-"):
            gpu = self._gpu_by_uuid.get(bare)
            if gpu is not None:
                return DeviceRef(gpu.uuid, "", replica)
        mig_ref = self._mig_by_uuid.get(bare)
        if mig_ref is not None:
            return DeviceRef(mig_ref.parent.uuid, mig_ref.uuid, replica)
        slot = _HAMI_SLOT.match(base)
        gpu = self._gpu_by_uuid.get(_bare(slot["gpu"])) if slot else None
        return DeviceRef(gpu.uuid, "", False, slot=True) if gpu is not None else None

    def _by_index(self, gpu_index: int, slot: str | None, replica: bool) -> DeviceRef | None:
        if slot is None:
            gpu = self._gpu_by_index.get(gpu_index)
            return None if gpu is None else DeviceRef(gpu.uuid, "", replica)
        mig = self._mig_by_slot.get((gpu_index, int(slot)))
        return None if mig is None else DeviceRef(mig.parent.uuid, mig.uuid, replica)

    def _gke(self, index: int, kind: str | None, n: int, replica: bool) -> DeviceRef | None:
        gpu = self._gpu_by_index.get(index)
        if gpu is None:
            return None
        if kind == "gi":
            mig = self._mig_by_gi.get((gpu.uuid, n))
            return None if mig is None else DeviceRef(gpu.uuid, mig.uuid, replica)
        # nvidiaN/vgpuM is GKE time-sharing: one of several shares of GPU N
        return DeviceRef(gpu.uuid, "", replica or kind == "vgpu")


# The device plugins' resource prefixes of each vendor (NVIDIA; AMD's amd.com/gpu and its
# partitions and VFs; Intel's gpu.intel.com/i915 and /xe).
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/", "gpu.intel.com/")


def is_gpu_resource(resource: str, overrides: Mapping[str, SharingMode]) -> bool:
    """Resources whose IDs we try to resolve; anything else (NICs, FPGAs) is ignored quietly."""
    return resource.startswith(GPU_RESOURCE_PREFIXES) or resource in overrides


def sharing_mode(resource: str, ref: DeviceRef,
                 overrides: Mapping[str, SharingMode]) -> SharingMode:
    """Sharing mode for a unit of `resource`. IDs cannot tell MPS from time-slicing, so a
    configured override for the resource name wins over everything inferred here."""
    mode = overrides.get(resource)
    if mode:
        return mode
    if ref.replica or resource == "nvidia.com/gpu.shared":
        return SharingMode.TIME_SLICING
    if resource.startswith("nvidia.com/mig-") or ref.mig_uuid:
        return SharingMode.MIG
    return SharingMode.EXCLUSIVE


class UnknownIds:
    """Device IDs that resolve to nothing on this node: logged once each, and counted per
    resource (gpu_exporter_unresolved_device_ids_total), once per allocation per cycle."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.by_resource: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.by_resource.values())

    def report(self, resource: str, device_id: str) -> None:
        self.by_resource[resource] = self.by_resource.get(resource, 0) + 1
        if (resource, device_id) not in self.seen:
            self.seen.add((resource, device_id))
            log.warning("podresources: %s device ID %r matches no GPU or MIG instance on this "
                        "node; its allocation is not attributed", resource, device_id)
