"""NVIDIA vGPU, from both sides. In a vGPU guest (`virtualization_mode` vgpu) the GPU's licence
per licensable feature; on a vGPU host (host_vgpu) every active vGPU instance: its type,
framebuffer, memory in use, SM utilisation and the VM it serves."""

from __future__ import annotations

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, GpuRef, GpuStatic, SampleSink
from exporter.nvmlcall import Reader, text

# NVML licence feature codes (nvmlGridLicenseFeatureCode_t)
FEATURES = {1: "vgpu", 2: "nvidia_rtx", 3: "gaming", 4: "compute"}
_NO_STATIC = GpuStatic()


class VgpuCollector(NvmlCollector):
    name = "vgpu"

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        mode = ctx.static.get(gpu.uuid, _NO_STATIC).virtualization_mode
        if mode == "vgpu":
            self._license(ctx, sink, r, gpu)
        elif mode == "host_vgpu":
            self._instances(ctx, sink, r, gpu)

    def _license(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        feats = r.call(self.nvml.nvmlDeviceGetGridLicensableFeatures, gpu.handle)
        if feats is None or not feats.isGridLicenseSupported:
            return
        count = min(int(feats.licensableFeaturesCount), len(feats.gridLicensableFeatures))
        for i in range(count):
            f = feats.gridLicensableFeatures[i]
            feature = FEATURES.get(int(f.featureCode), str(int(f.featureCode)))
            sink.add("gpu_vgpu_license_state",
                     (*gpu.labels(ctx.node), feature, text(f.productName)),
                     1 if int(f.featureState) == 1 else 0)

    def _instances(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        nv = self.nvml
        instances = r.call(nv.nvmlDeviceGetActiveVgpus, gpu.handle) or []
        util: dict[int, float] = {}
        for s in r.call(nv.nvmlDeviceGetVgpuUtilization, gpu.handle, 0) or []:
            util[int(s.vgpuInstance)] = int(s.smUtil.uiVal) / 100
        labels = gpu.labels(ctx.node)
        for inst in instances:
            uuid = r.call(nv.nvmlVgpuInstanceGetMdevUUID, inst) or \
                r.call(nv.nvmlVgpuInstanceGetUUID, inst)
            if not uuid:
                continue  # nothing to name its series by
            vgpu = text(uuid)
            type_id = r.call(nv.nvmlVgpuInstanceGetType, inst)
            name = r.call(nv.nvmlVgpuTypeGetName, type_id) if type_id is not None else None
            vm = r.call(nv.nvmlVgpuInstanceGetVmID, inst)
            sink.add("gpu_vgpu_info", (*labels, vgpu, text(name or ""),
                                       text(vm[0]) if vm else ""), 1)
            fb = r.call(nv.nvmlVgpuTypeGetFramebufferSize, type_id) \
                if type_id is not None else None
            if fb is not None:
                sink.add("gpu_vgpu_framebuffer_bytes", (*labels, vgpu), int(fb))
            used = r.call(nv.nvmlVgpuInstanceGetFbUsage, inst)
            if used is not None:
                sink.add("gpu_vgpu_memory_used_bytes", (*labels, vgpu), int(used))
            if int(inst) in util:
                sink.add("gpu_vgpu_utilization_ratio", (*labels, vgpu), util[int(inst)])
