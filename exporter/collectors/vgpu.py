"""GPUs lent to VMs, from both sides (NVIDIA vGPU now). In a vGPU guest (`virtualization_mode`
vgpu) the GPU's licence per licensable feature; on a vGPU host (host_vgpu) every active vGPU
instance: its type, framebuffer, memory in use, SM utilisation and the VM it serves."""

from __future__ import annotations

from exporter.collectors.base import GpuCollector
from exporter.core import CycleContext, GpuRef, GpuStatic, SampleSink
from exporter.device.contract import Tally

_NO_STATIC = GpuStatic()


class VgpuCollector(GpuCollector):
    name = "vgpu"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        mode = ctx.static.get(gpu.uuid, _NO_STATIC).virtualization_mode
        labels = gpu.labels(ctx.node)
        if mode == "vgpu":
            for lic in self.backend.guest_licences(gpu, tally):
                sink.add("gpu_vgpu_license_state", (*labels, lic.feature, lic.product),
                         1 if lic.licensed else 0)
        elif mode in ("host_vgpu", "host"):  # NVIDIA vGPU host, AMD MxGPU (GIM) host
            for vf in self.backend.virtual_functions(gpu, tally):
                sink.add("gpu_vgpu_info", (*labels, vf.id, vf.type_name, vf.vm), 1)
                if vf.framebuffer_bytes is not None:
                    sink.add("gpu_vgpu_framebuffer_bytes", (*labels, vf.id),
                             vf.framebuffer_bytes)
                if vf.memory_used_bytes is not None:
                    sink.add("gpu_vgpu_memory_used_bytes", (*labels, vf.id),
                             vf.memory_used_bytes)
                if vf.utilization is not None:
                    sink.add("gpu_vgpu_utilization_ratio", (*labels, vf.id), vf.utilization)
