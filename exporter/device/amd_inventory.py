"""Discover the node's AMD GPUs and their compute x memory partitions through amdsmi.

amdsmi lists one processor handle per *partition*: an MI300X in CPX mode is eight handles that
share the GPU's PCI address, each with its own `current_partition_id` (amdsmi_get_gpu_kfd_info)
and DRM render node (amdsmi_get_gpu_enumeration_info). Handles are grouped by PCI address into
physical GPUs; a GPU of more than one handle is partitioned and each handle is a `Partition`
of kind "amd_partition":

- profile `<compute>_<memory>` lower case (e.g. "cpx_nps4"), the device plugin's resource name;
- slices 1 of parent_slices = the number of compute partitions (priced as that fraction);
- gpu_instance_id = the partition index, slot the same (the device plugin's partition order);
- compute_instance_id = the DRM render minor (`renderD<n>`) of the partition: the device
  plugin names partitions by their `amdgpu_xcp_<n>` platform device and the DRA driver by
  `gpu-<card>-<render>`, both of which lead to the render node (-1 when unknown).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from exporter.device.amd_calls import AmdCalls, number, text
from exporter.device.amdsmiapi import AmdSmiApi, Handle
from exporter.device.contract import (
    DeviceLost,
    GpuRef,
    GpuStatic,
    Inventory,
    MigRef,
    pci_bdf,
)
from exporter.device.identity import amdsmi_id, identity, published_uuid

log = logging.getLogger(__name__)
MIB = 1 << 20
# AmdSmiVirtualizationMode (amdsmi.h amdsmi_virtualization_mode_t) -> GpuStatic's spelling
VIRTUALIZATION = {0: "", 1: "none", 2: "host", 3: "guest", 4: "passthrough"}


@dataclass(frozen=True)
class AmdGpu:
    """GpuRef.handle of an AMD GPU: its handles in partition order (one when unpartitioned)."""

    bdf: str
    members: tuple[Handle, ...] = field(compare=False)

    @property
    def primary(self) -> Handle:
        """Partition 0: where amdsmi reports the device-wide activity, power and energy."""
        return self.members[0]


@dataclass(frozen=True)
class _Member:
    handle: Handle
    bdf: str
    partition: int  # -1: not partitioned


def discover(api: AmdSmiApi, previous: Inventory | None = None, node: str = "") -> Inventory:
    """Every AMD GPU and partition. A GPU lost since `previous` keeps its identity (its series
    stay the same series, `gpu_up 0`), and so does one whose UUID amdsmi does not give this
    time. `node` names this node in the uuid of a GPU without a chip-derived UUID."""
    r = AmdCalls(api)
    members: dict[str, list[_Member]] = {}
    for h in r.call(api.amdsmi_get_processor_handles) or []:
        try:
            bdf = pci_bdf(text(r.call(api.amdsmi_get_gpu_device_bdf, h)))
            kfd = r.call(api.amdsmi_get_gpu_kfd_info, h) or {}
            part = number(kfd.get("current_partition_id"))
        except DeviceLost:
            continue  # a vanished handle: its GPU is kept from `previous` below if known
        members.setdefault(bdf, []).append(_Member(h, bdf, -1 if part is None else int(part)))
    known = {pci_bdf(previous.static[g.uuid].pci_bus_id): g for g in previous.gpus
             if g.uuid in previous.static} if previous else {}
    gpus: list[GpuRef] = []
    migs: list[MigRef] = []
    static: dict[str, GpuStatic] = {}
    driver = ""
    index_of = _indexes(sorted(members), {bdf: g.index for bdf, g in known.items()})
    for bdf in sorted(members):
        index = index_of[bdf]
        group = sorted(members[bdf], key=lambda m: m.partition)
        try:
            old = known.get(bdf)
            kept = {m.slot: m.uuid for m in previous.migs if m.parent == old} \
                if old is not None and previous is not None else {}
            gpu, st, parts = _gpu(api, r, index, bdf, group, node,
                                  None if old is None else old.uuid, kept)
        except DeviceLost:
            old = known.get(bdf)
            if old is None or previous is None:
                log.warning("AMD GPU %s is lost and was never seen healthy; it is not listed",
                            bdf)
                continue
            gpus.append(old)
            static[old.uuid] = previous.static[old.uuid]
            migs.extend(m for m in previous.migs if m.parent == old)
            continue
        gpus.append(gpu)
        static[gpu.uuid] = st
        migs.extend(parts)
        if not driver:
            info = r.call(api.amdsmi_get_gpu_driver_info, group[0].handle) or {}
            driver = text(info.get("driver_version"))
    for bdf, old in known.items():  # gone from amdsmi's list altogether
        if bdf not in members and previous is not None:
            gpus.append(old)
            static[old.uuid] = previous.static[old.uuid]
            migs.extend(m for m in previous.migs if m.parent == old)
    return Inventory(driver_version=driver, gpus=tuple(gpus), migs=tuple(migs),
                     static=static)


def _indexes(bdfs: list[str], previous: dict[str, int]) -> dict[str, int]:
    """A GPU keeps the index it had (its series stay the same series when another GPU is lost
    and drops out of amdsmi's list); a new one takes the lowest index not in use."""
    out = {b: previous[b] for b in bdfs if b in previous}
    used = set(previous.values())
    free = (i for i in range(len(bdfs) + len(used)) if i not in used)
    for b in bdfs:
        if b not in out:
            out[b] = next(free)
    return out


def _gpu(api: AmdSmiApi, r: AmdCalls, index: int, bdf: str, group: list[_Member], node: str,
         known: str | None, known_parts: dict[int, str]
         ) -> tuple[GpuRef, GpuStatic, list[MigRef]]:
    """`known`, `known_parts`: the GPU's uuid and its partitions' by slot in the previous
    inventory, kept where amdsmi gives no UUID this time."""
    primary = group[0].handle
    chip = amdsmi_id(text(r.call(api.amdsmi_get_gpu_device_uuid, primary)))
    kept = chip is None and known is not None
    uuid = known if kept and known is not None else published_uuid(identity(chip, node, bdf))
    model = text((r.call(api.amdsmi_get_gpu_asic_info, primary) or {}).get("market_name"))
    partitioned = len(group) > 1
    ref = GpuRef(index, uuid, model, partitioned, AmdGpu(bdf, tuple(m.handle for m in group)),
                 vendor="amd")
    compute = text(r.call(api.amdsmi_get_gpu_compute_partition, primary)).lower()
    memory = text(r.call(api.amdsmi_get_gpu_memory_partition, primary)).lower()
    mode = number((r.call(api.amdsmi_get_gpu_virtualization_mode, primary) or {})
                  .get("mode"))  # newer releases only: else NOT_SUPPORTED, absent
    vram_total = 0.0
    for m in group:  # each partition reports its share of the GPU's memory
        vram_total += number((r.call(api.amdsmi_get_gpu_vram_usage, m.handle) or {})
                             .get("vram_total")) or 0.0
    st = GpuStatic(
        pci_bus_id=text(r.call(api.amdsmi_get_gpu_device_bdf, primary)) or bdf,
        vbios_version=text((r.call(api.amdsmi_get_gpu_vbios_info, primary) or {})
                           .get("version")),
        mig_mode=("enabled" if partitioned else "disabled") if compute else "",
        virtualization_mode=VIRTUALIZATION.get(int(mode), str(int(mode)))
        if mode is not None else "",
        vendor="amd",
        memory_bytes=int(vram_total * MIB) if vram_total else None,
    )
    parts: list[MigRef] = []
    if partitioned:
        profile = f"{compute}_{memory}" if compute and memory else compute
        seen: set[str] = {uuid}
        for slot, m in enumerate(group):
            own = amdsmi_id(text(r.call(api.amdsmi_get_gpu_device_uuid, m.handle)))
            part_uuid = known_parts.get(slot, "") if kept else \
                own.value if own is not None and chip is not None else ""
            if not part_uuid or part_uuid in seen:  # a library giving partitions no own UUID
                part_uuid = f"{uuid}/{slot}"
            seen.add(part_uuid)
            n = number((r.call(api.amdsmi_get_gpu_enumeration_info, m.handle) or {})
                       .get("drm_render"))  # ROCm 6.4+
            render = -1 if n is None else int(n)
            parts.append(MigRef(
                parent=ref, uuid=part_uuid,
                gpu_instance_id=m.partition if m.partition >= 0 else slot,
                compute_instance_id=render, profile=profile, slices=1,
                parent_slices=len(group), handle=m.handle, slot=slot,
                kind="amd_partition"))
    return ref, st, parts
