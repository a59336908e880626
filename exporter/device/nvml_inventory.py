"""Discover the node's NVIDIA GPUs and MIG instances through NVML. Identity is static between
refreshes, so the sampler keeps the last inventory and refreshes it at a slow cadence rather
than every cycle."""

from __future__ import annotations

import logging
import re

from exporter.device.contract import GpuRef, GpuStatic, Inventory, MigRef
from exporter.device.nvmlapi import NvmlApi
from exporter.nvmlcall import GpuLost, Reader, text

log = logging.getLogger(__name__)

_PROFILE_IN_NAME = re.compile(r"MIG\s+(\S+)$")
_VIRT = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
DEFAULT_PARENT_SLICES = 7

# NVML_GPU_INSTANCE_PROFILE_7_SLICE (nvml.h): the whole GPU's profile, whose slice count is the
# parent's
_PROFILE_7_SLICE = 4


def cuda_version_text(raw: int | None) -> str:
    if not raw:
        return ""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def discover(nvml: NvmlApi, previous: Inventory | None = None) -> Inventory:
    """Read identity for every GPU. A GPU lost since the previous inventory keeps its old
    identity so its series (gpu_up 0) stay the same series."""
    r = Reader(nvml)
    known = {g.index: g for g in previous.gpus} if previous else {}
    old_static = previous.static if previous else {}
    gpus: list[GpuRef] = []
    migs: list[MigRef] = []
    static: dict[str, GpuStatic] = {}
    count = r.call(nvml.nvmlDeviceGetCount) or 0
    for index in range(count):
        try:
            handle = r.call(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            uuid = text(r.call(nvml.nvmlDeviceGetUUID, handle) or "")
            model = text(r.call(nvml.nvmlDeviceGetName, handle) or "")
            mode = r.call(nvml.nvmlDeviceGetMigMode, handle)
            mig_enabled = bool(mode and mode[0])
            pci = r.call(nvml.nvmlDeviceGetPciInfo, handle)
            virt = r.call(nvml.nvmlDeviceGetVirtualizationMode, handle)
            mem = r.call(nvml.nvmlDeviceGetMemoryInfo, handle)
            gpu = GpuRef(index, uuid, model, mig_enabled, handle)
            static[uuid] = GpuStatic(
                pci_bus_id=text(pci.busId) if pci is not None else "",
                vbios_version=text(r.call(nvml.nvmlDeviceGetVbiosVersion, handle) or ""),
                mig_mode=("" if mode is None else "enabled" if mig_enabled else "disabled"),
                virtualization_mode=_VIRT.get(virt, str(virt)) if virt is not None else "",
                memory_bytes=int(mem.total) if mem is not None else None,
            )
            gpus.append(gpu)
            if mig_enabled:
                migs.extend(_discover_migs(nvml, r, gpu))
        except GpuLost:
            old = known.get(index)
            if old is not None:
                gpus.append(old)
                static[old.uuid] = old_static.get(old.uuid, GpuStatic())
                migs.extend(m for m in (previous.migs if previous else ()) if m.parent == old)
            else:
                log.warning("GPU %d is lost and was never seen healthy; it is not listed", index)
    return Inventory(
        driver_version=text(r.call(nvml.nvmlSystemGetDriverVersion) or ""),
        cuda_version=cuda_version_text(r.call(nvml.nvmlSystemGetCudaDriverVersion)),
        gpus=tuple(gpus), migs=tuple(migs), static=static,
    )


def _discover_migs(nvml: NvmlApi, r: Reader, gpu: GpuRef) -> list[MigRef]:
    parent_slices = DEFAULT_PARENT_SLICES
    info = r.call(nvml.nvmlDeviceGetGpuInstanceProfileInfo, gpu.handle, _PROFILE_7_SLICE)
    if info is not None and int(getattr(info, "sliceCount", 0)):
        parent_slices = int(info.sliceCount)
    out: list[MigRef] = []
    for slot in range(r.call(nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0):
        handle = r.call(nvml.nvmlDeviceGetMigDeviceHandleByIndex, gpu.handle, slot)
        if handle is None:
            continue  # empty slot
        attrs = r.call(nvml.nvmlDeviceGetAttributes, handle)
        name = text(r.call(nvml.nvmlDeviceGetName, handle) or "")
        match = _PROFILE_IN_NAME.search(name)
        if match:
            profile = match.group(1)
        elif attrs is not None:
            profile = f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
        else:
            profile = ""
        slices = int(attrs.computeInstanceSliceCount) if attrs is not None else 0
        out.append(MigRef(
            parent=gpu,
            uuid=text(r.call(nvml.nvmlDeviceGetUUID, handle) or ""),
            gpu_instance_id=int(r.call(nvml.nvmlDeviceGetGpuInstanceId, handle) or 0),
            compute_instance_id=int(r.call(nvml.nvmlDeviceGetComputeInstanceId, handle) or 0),
            profile=profile, slices=slices, parent_slices=parent_slices, handle=handle,
            slot=slot,
        ))
    return out
