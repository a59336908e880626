"""Virtual functions on a host (NVIDIA vGPU instances now; AMD MxGPU VFs and Intel GVT-g mdevs
through their backends), for attributing them to the pods that hold them.

KubeVirt's device plugin hands a virt-launcher pod a vGPU as a device of resource
`nvidia.com/<vGPU type>` whose ID is the instance's mdev UUID (an Intel GVT-g mdev the same
way, under the resource name KubeVirt's CR gives it). The backend lists the GPU's
active instances (`DeviceReader.virtual_functions`) with that UUID and the type's framebuffer,
so the ID resolves to the physical GPU and the instance's share of it (framebuffer over the
GPU's memory, `GpuStatic.memory_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.core import CycleContext
from exporter.device.contract import DeviceLost, Tally

# The virtualization modes of a GPU that lends VFs to VMs: NVIDIA's vGPU host; "host" is what
# the AMD (MxGPU) and Intel (SR-IOV, GVT-g) backends say of theirs.
HOST_MODES = frozenset({"host_vgpu", "host"})


@dataclass(frozen=True)
class VgpuInstance:
    gpu_uuid: str  # the physical GPU
    framebuffer_fraction: float | None  # the type's framebuffer / the GPU's; None: unknown
    sm_util: float | None = None  # its SM utilisation, 0-1 of the GPU; None: no sample
    memory_used: int | None = None  # framebuffer the VM uses, bytes; None: unknown


def vgpu_instances(ctx: CycleContext) -> dict[str, VgpuInstance]:
    """VF id (an mdev UUID, lower case) -> instance, for every GPU of the node in a host mode;
    empty elsewhere (no device call is made for other GPUs)."""
    out: dict[str, VgpuInstance] = {}
    backend = ctx.backend
    if backend is None:
        return out
    for gpu in ctx.gpus:
        static = ctx.static.get(gpu.uuid)
        if static is None or static.virtualization_mode not in HOST_MODES \
                or gpu.uuid in ctx.lost:
            continue
        total = static.memory_bytes or 0
        try:
            functions = backend.virtual_functions(gpu, Tally())
        except DeviceLost:
            continue  # the device collector reports the lost GPU
        for vf in functions:
            fb = vf.framebuffer_bytes
            # the share the backend prices it as (a GVT-g type's 1/N, a VF's 1/VFs), else
            # the type's framebuffer over the GPU's
            frac = vf.share if vf.share is not None else \
                min(fb / total, 1.0) if fb is not None and total else None
            # The VM's use, which the host sees only per instance (no guest processes).
            out[vf.id.strip().lower()] = VgpuInstance(gpu.uuid, frac, vf.utilization,
                                                      vf.memory_used_bytes)
    return out

