"""Simulated NVML: vGPU. On a vGPU host (`virtualization_mode: host_vgpu`) the active vGPU
instances of a GPU (type, framebuffer, use, the VM each serves); in a vGPU guest
(`virtualization_mode: vgpu`) the licence of the guest's GPU."""

from __future__ import annotations

from typing import Any

import pynvml

from gpusim.model import VIRTUALIZATION_MODES, GpuSpec, VgpuSpec
from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error

HOST_VGPU = VIRTUALIZATION_MODES["host_vgpu"]
GUEST_VGPU = VIRTUALIZATION_MODES["vgpu"]
# licence feature name in a scenario -> NVML feature code
FEATURE_CODES = {"vgpu": 1, "nvidia_rtx": 2, "gaming": 3, "compute": 4}
_INSTANCE_BASE = 1000  # instance id = (gpu index + 1) * 1000 + place in the GPU's vgpus


class VgpuQueries(NvmlCore):
    """vGPU host instances and guest licences."""

    def _type_ids(self) -> dict[str, int]:
        names = sorted({v.type_name for g in self.scenario.gpus for v in g.vgpus})
        return {name: 100 + k for k, name in enumerate(names)}

    def _instance(self, instance: object) -> tuple[GpuSpec, VgpuSpec, float]:
        if not isinstance(instance, int) or instance < _INSTANCE_BASE:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g, i = divmod(instance, _INSTANCE_BASE)
        if not 1 <= g <= len(self.scenario.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, _, t = self._dev(SimDevice(g - 1))
        if i >= len(gpu.vgpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gpu.vgpus[i], t

    def _host(self, handle: SimDevice) -> tuple[GpuSpec, float]:
        gpu, _, t = self._dev(handle)
        if gpu.virtualization_mode != HOST_VGPU:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, t

    def nvmlDeviceGetActiveVgpus(self, handle: SimDevice) -> list[int]:
        gpu, _ = self._host(handle)
        return [(gpu.index + 1) * _INSTANCE_BASE + v.index for v in gpu.vgpus]

    def nvmlVgpuInstanceGetType(self, instance: int) -> int:
        _, v, _ = self._instance(instance)
        return self._type_ids()[v.type_name]

    def _type(self, type_id: int) -> VgpuSpec:
        self._check_init()
        for g in self.scenario.gpus:
            for v in g.vgpus:
                if self._type_ids()[v.type_name] == type_id:
                    return v
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlVgpuTypeGetName(self, type_id: int) -> str:
        return self._type(type_id).type_name

    def nvmlVgpuTypeGetFramebufferSize(self, type_id: int) -> int:
        return self._type(type_id).framebuffer

    def nvmlVgpuInstanceGetUUID(self, instance: int) -> str:
        return self._instance(instance)[1].uuid

    def nvmlVgpuInstanceGetMdevUUID(self, instance: int) -> str:
        return self._instance(instance)[1].uuid

    def nvmlVgpuInstanceGetVmID(self, instance: int) -> tuple[str, int]:
        return self._instance(instance)[1].vm, pynvml.NVML_VGPU_VM_ID_UUID

    def nvmlVgpuInstanceGetFbUsage(self, instance: int) -> int:
        _, v, t = self._instance(instance)
        return max(0, min(int(v.memory.at(t)), v.framebuffer))

    def nvmlDeviceGetVgpuUtilization(self, handle: SimDevice, last_seen: int) -> list[Any]:
        """One sample per active instance, stamped now (µs of the clock), newer than
        `last_seen`; SM, memory, encoder, decoder utilisation in percent."""
        gpu, t = self._host(handle)
        stamp = int(self._clock() * 1e6)
        out = []
        for v in gpu.vgpus:
            if stamp <= last_seen:
                continue
            s = pynvml.c_nvmlVgpuInstanceUtilizationSample_t()
            s.vgpuInstance = (gpu.index + 1) * _INSTANCE_BASE + v.index
            s.timeStamp = stamp
            sm = max(0.0, min(1.0, v.sm_util.at(t)))
            s.smUtil.uiVal = round(sm * 100)
            s.memUtil.uiVal = round(sm * 60)
            out.append(s)
        return out

    def nvmlDeviceGetGridLicensableFeatures(self, handle: SimDevice) -> Any:
        """A vGPU guest's licence: one feature, licensed until `license.lapses_at`. Elsewhere
        licensing is not supported (isGridLicenseSupported 0, no features)."""
        gpu, _, t = self._dev(handle)
        feats = pynvml.c_nvmlGridLicensableFeatures_v4_t()
        lic = gpu.license
        if gpu.virtualization_mode != GUEST_VGPU or lic is None:
            feats.isGridLicenseSupported = 0
            feats.licensableFeaturesCount = 0
            return feats
        feats.isGridLicenseSupported = 1
        feats.licensableFeaturesCount = 1
        f = feats.gridLicensableFeatures[0]
        f.featureCode = FEATURE_CODES[lic.feature]
        f.featureState = 0 if lic.lapses_at is not None and t >= lic.lapses_at else 1
        f.productName = lic.product.encode()
        f.featureEnabled = 1
        return feats

    nvmlDeviceGetGridLicensableFeatures_v4 = nvmlDeviceGetGridLicensableFeatures
