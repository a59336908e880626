"""NVIDIA vGPU instances on a vGPU host, for attributing them to the pods that hold them.

KubeVirt's device plugin hands a virt-launcher pod a vGPU as a device of resource
`nvidia.com/<vGPU type>` whose ID is the instance's mdev UUID. NVML lists the GPU's active
instances (nvmlDeviceGetActiveVgpus) with that UUID and the type's framebuffer, so the ID
resolves to the physical GPU and the instance's share of it (framebuffer over the GPU's).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.core import CycleContext
from exporter.device.contract import DeviceLost, Tally
from exporter.nvmlcall import GpuLost, Reader, text


@dataclass(frozen=True)
class VgpuInstance:
    gpu_uuid: str  # the physical GPU
    framebuffer_fraction: float | None  # the type's framebuffer / the GPU's; None: unknown
    sm_util: float | None = None  # its SM utilisation, 0-1 of the GPU; None: no sample
    memory_used: int | None = None  # framebuffer the VM uses, bytes; None: unknown


def vgpu_instances(ctx: CycleContext) -> dict[str, VgpuInstance]:
    """mdev UUID (lower case) -> instance, for every GPU of the node in host_vgpu mode; empty
    elsewhere (no NVML call is made for other GPUs)."""
    out: dict[str, VgpuInstance] = {}
    nv = ctx.nvml
    if nv is None:
        return out
    r = Reader(nv)
    for gpu in ctx.gpus:
        static = ctx.static.get(gpu.uuid)
        if static is None or static.virtualization_mode != "host_vgpu" or gpu.uuid in ctx.lost:
            continue
        try:
            memory = r.call(nv.nvmlDeviceGetMemoryInfo, gpu.handle)
            total = int(memory.total) if memory is not None else 0
            # The VM's use, which the host sees only per instance (no guest processes).
            util = {int(u.vgpuInstance): int(u.smUtil.uiVal) / 100
                    for u in r.call(nv.nvmlDeviceGetVgpuUtilization, gpu.handle, 0) or []}
            for inst in r.call(nv.nvmlDeviceGetActiveVgpus, gpu.handle) or []:
                mdev = r.call(nv.nvmlVgpuInstanceGetMdevUUID, inst)
                if not mdev:
                    continue
                type_id = r.call(nv.nvmlVgpuInstanceGetType, inst)
                fb = r.call(nv.nvmlVgpuTypeGetFramebufferSize, type_id) \
                    if type_id is not None else None
                frac = min(int(fb) / total, 1.0) if fb is not None and total else None
                used = r.call(nv.nvmlVgpuInstanceGetFbUsage, inst)
                out[text(mdev).strip().lower()] = VgpuInstance(
                    gpu.uuid, frac, util.get(int(inst)), None if used is None else int(used))
        except GpuLost:
            continue  # the device collector reports the lost GPU
    return out


def virtual_instances(ctx: CycleContext) -> dict[str, VgpuInstance]:
    """Instance id (lower case) -> instance for the VFs and mediated devices of the node's
    non-NVIDIA GPUs, read through the device backend (`VirtualFunction`): an Intel GVT-g
    mdev by its UUID (what KubeVirt's mediated device plugin hands a virt-launcher pod), an
    SR-IOV VF by its PCI address. Its `share` is the fraction it is priced as."""
    out: dict[str, VgpuInstance] = {}
    backend = ctx.backend
    if backend is None:
        return out
    for gpu in ctx.gpus:
        static = ctx.static.get(gpu.uuid)
        if static is None or static.vendor == "nvidia" or gpu.uuid in ctx.lost:
            continue  # NVIDIA vGPUs: vgpu_instances
        try:
            for vf in backend.virtual_functions(gpu, Tally()):
                if vf.kind in ("mdev", "sriov_vf"):
                    out[vf.id.strip().lower()] = VgpuInstance(
                        gpu.uuid, vf.share, vf.utilization, vf.memory_used_bytes)
        except DeviceLost:
            continue  # the device collector reports the lost GPU
    return out
