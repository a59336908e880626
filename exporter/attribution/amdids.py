"""Device IDs of AMD's device plugin and DRA driver, resolved against the AMD backend's
inventory (docs/attribution.md, "AMD", cites the versions read).

ROCm/k8s-device-plugin registers, under `amd.com/gpu` (single naming strategy) or
`amd.com/<compute>_<memory>` (mixed, e.g. `amd.com/cpx_nps4`):

- a whole GPU, and partition 0 of a partitioned one, by its PCI address: the name of its
  directory under /sys/module/amdgpu/drivers/pci:amdgpu/ (`0000:0c:00.0`);
- every other partition by its platform device, `amdgpu_xcp_<n>` (/sys/devices/platform/
  amdgpu_xcp_<n>), whose `drm/renderD<m>` is the partition's render node;
- in VF passthrough mode (`amd.com/gpu_vf`, or `amd.com/gpu` single), an IOMMU group number
  (`218`): the group of one or more MxGPU VFs bound to vfio-pci.

ROCm's DRA driver (`gpu.amd.com`) publishes `gpu-<card>-<render>` devices with `pciAddr` (a
whole GPU) or `parentPciAddr` and `renderIndex` (a partition) attributes.

The render node joins a partition: the backend keeps it as the partition's
`compute_instance_id` (exporter/device/amd_inventory.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.dra import ClaimDevice, SliceKey
from exporter.attribution.resourceslices import ResourceSlice
from exporter.device.contract import Inventory, MigRef, VirtualFunction, pci_bdf
from gpu_ledger.sharing import SharingMode

AMD_RESOURCE_PREFIX = "amd.com/"
AMD_DRA_DRIVER = "gpu.amd.com"
_XCP = re.compile(r"amdgpu_xcp_(?P<n>[0-9]{1,6})\Z")
_RENDER = re.compile(r"renderD(?P<n>[0-9]{1,6})\Z")
_GROUP = re.compile(r"[0-9]{1,6}\Z")
_DRA_NAME = re.compile(r"gpu-(?P<card>[0-9]{1,6})-(?P<render>[0-9]{1,6})\Z")
# time-slicing replicas: the plugin's `<id>-slice-<n>` (internal/pkg/plugin/timeslice.go), and
# the `<id>::<n>` other plugins use
_REPLICA = re.compile(r"(?P<base>.+?)(?:-slice-|::)(?P<n>[0-9]{1,6})\Z")


@dataclass(frozen=True)
class AmdSysfs:
    """What sysfs says about the device plugin's IDs."""

    xcp_render: Mapping[str, int] = field(default_factory=dict)  # amdgpu_xcp_N -> render
    iommu_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # group -> BDFs


def read_amd_sysfs(root: str = "/sys") -> AmdSysfs:
    """The partitions' platform devices and the PCI functions' IOMMU groups; what cannot be
    read is simply absent (an ID it would resolve is then reported as unresolved)."""
    xcp: dict[str, int] = {}
    platform = Path(root) / "devices" / "platform"
    try:
        entries = sorted(p for p in platform.iterdir() if _XCP.match(p.name))
    except OSError:
        entries = []
    for p in entries:
        try:
            renders = [m for d in (p / "drm").iterdir() if (m := _RENDER.match(d.name))]
        except OSError:
            continue
        if renders:
            xcp[p.name] = int(renders[0]["n"])
    groups: dict[str, list[str]] = {}
    devices = Path(root) / "bus" / "pci" / "devices"
    try:
        functions = sorted(devices.iterdir())
    except OSError:
        functions = []
    for dev in functions:
        try:
            group = os.path.basename(os.readlink(dev / "iommu_group"))
        except OSError:
            continue
        groups.setdefault(group, []).append(pci_bdf(dev.name))
    return AmdSysfs(xcp, {g: tuple(b) for g, b in groups.items()})


@dataclass(frozen=True)
class AmdRef:
    """What an AMD ID names: a GPU, a partition (`partition` its UUID), or a VF of a GPU (`vf`
    its PCI address, `vf_fraction` its framebuffer share, `vf_use` what the host sees of it)."""

    uuid: str
    partition: str = ""
    vf: str = ""
    vf_fraction: float | None = None
    vf_use: VirtualFunction | None = field(default=None, compare=False)
    replica: bool = False  # one time-slicing share of the device

    @property
    def key(self) -> tuple[str, str]:
        return (self.uuid, self.partition)

    @property
    def mode(self) -> SharingMode:
        if self.vf:
            return SharingMode.VGPU
        if self.replica:
            return SharingMode.TIME_SLICING
        return SharingMode.MIG if self.partition else SharingMode.EXCLUSIVE


def is_amd_resource(resource: str) -> bool:
    return resource.startswith(AMD_RESOURCE_PREFIX)


class AmdDeviceIndex:
    """Resolves AMD IDs for one inventory (rebuilt when it changes)."""

    def __init__(self, inventory: Inventory, sysfs: AmdSysfs,
                 vfs: Mapping[str, Iterable[VirtualFunction]] | None = None) -> None:
        self._by_bdf: dict[str, AmdRef] = {}
        self._by_render: dict[int, AmdRef] = {}
        parts: dict[str, list[MigRef]] = {}
        for m in inventory.migs:
            if m.kind == "amd_partition":
                parts.setdefault(m.parent.uuid, []).append(m)
                if m.compute_instance_id >= 0:
                    self._by_render[m.compute_instance_id] = AmdRef(m.parent.uuid, m.uuid)
        for g in inventory.gpus:
            st = inventory.static.get(g.uuid)
            if st is None or st.vendor != "amd" or not st.pci_bdf:
                continue
            first = min(parts.get(g.uuid, []), key=lambda m: m.gpu_instance_id, default=None)
            # a partitioned GPU's PCI address is its partition 0's ID
            self._by_bdf[st.pci_bdf] = AmdRef(g.uuid, first.uuid if first else "")
        memory = {g.uuid: (inventory.static[g.uuid].memory_bytes or 0)
                  for g in inventory.gpus if g.uuid in inventory.static}
        self._vf_by_bdf: dict[str, AmdRef] = {}
        for gpu_uuid, functions in (vfs or {}).items():
            for vf in functions:
                total = memory.get(gpu_uuid, 0)
                fraction = (vf.framebuffer_bytes / total) if vf.framebuffer_bytes and total \
                    else 0.0
                self._vf_by_bdf[pci_bdf(vf.id)] = AmdRef(gpu_uuid, "", pci_bdf(vf.id),
                                                         min(1.0, fraction), vf)
        self._sysfs = sysfs

    def resolve(self, device_id: str) -> tuple[AmdRef, ...]:
        """Every device an ID names (an IOMMU group may hold several VFs); () for none. A
        time-slicing replica (`<id>-slice-<n>`) names a share of what `<id>` names."""
        base = device_id.strip()
        replica = _REPLICA.match(base)
        if replica:
            return tuple(dataclasses.replace(r, replica=True)
                         for r in self._resolve(replica["base"]) if not r.vf)
        return self._resolve(base)

    def _resolve(self, base: str) -> tuple[AmdRef, ...]:
        ref = self._by_bdf.get(pci_bdf(base)) or self._vf_by_bdf.get(pci_bdf(base))
        if ref is not None:  # a GPU (partition 0), or a VF by address (KubeVirt's PCI plugin)
            return (ref,)
        xcp = _XCP.match(base)
        if xcp:
            render = self._sysfs.xcp_render.get(base)
            part = None if render is None else self._by_render.get(render)
            return () if part is None else (part,)
        if _GROUP.match(base):
            return tuple(r for bdf in self._sysfs.iommu_groups.get(base, ())
                         if (r := self._vf_by_bdf.get(bdf)) is not None)
        return ()

    def resolve_claim(self, dev: ClaimDevice,
                      slices: Mapping[SliceKey, Mapping[str, str]] | None) -> AmdRef | None:
        """A `gpu.amd.com` device: by its ResourceSlice attributes (`pciAddr`, or
        `parentPciAddr` + `renderIndex`), else (slices unreadable) by the render node in its
        `gpu-<card>-<render>` name, which names partitions only."""
        attrs = None if slices is None else slices.get(SliceKey(dev.driver, dev.pool,
                                                               dev.device))
        if attrs is not None:
            render = attrs.get("renderIndex", "")
            if "parentPciAddr" in attrs and render.isdigit():
                return self._by_render.get(int(render))
            whole = self._by_bdf.get(pci_bdf(attrs.get("pciAddr", "")))
            return None if whole is None else AmdRef(whole.uuid)
        if slices is not None:
            return None
        m = _DRA_NAME.match(dev.device)
        return self._by_render.get(int(m["render"])) if m else None


def amd_slice_attributes(slices: Iterable[ResourceSlice]) -> dict[SliceKey, dict[str, str]]:
    """(driver, pool, device) -> attributes of `gpu.amd.com` devices, unqualified names."""
    out: dict[SliceKey, dict[str, str]] = {}
    prefix = AMD_DRA_DRIVER + "/"
    for s in slices:
        if s.driver != AMD_DRA_DRIVER:
            continue
        for dev in s.devices:
            out[SliceKey(s.driver, s.pool, dev.name)] = {
                k.removeprefix(prefix): v for k, v in dev.attributes}
    return out
