"""Simulated NVML: MIG mode, MIG device handles, GPU/compute instance ids and profiles."""

from __future__ import annotations

from typing import Any

import pynvml

from gpusim.nvml_core import NvmlCore, SimDevice, nvml_error

# GPU instance profile constant -> (compute slices, memory slices relative to the smallest)
_GI_PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (1, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (2, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (3, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (4, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (7, 8),
}


class MigQueries(NvmlCore):
    """MIG instances of a GPU as NVML reports them."""

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: SimDevice) -> int:
        gpu, _, _ = self._dev(handle)
        return gpu.mig_family.parent_slices if gpu.mig_family else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: SimDevice,
                                            index: int) -> SimDevice:
        gpu, _, _ = self._dev(handle)
        if gpu.mig_family is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < gpu.mig_family.parent_slices:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig is None or index >= len(gpu.mig):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return SimDevice(gpu.index, index)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self,
                                                     handle: SimDevice) -> SimDevice:
        gpu, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimDevice(gpu.index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: SimDevice) -> bool:
        _, mig, _ = self._dev(handle, mig_ok=True)
        return mig is not None

    def nvmlDeviceGetGpuInstanceId(self, handle: SimDevice) -> int:
        _, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: SimDevice) -> int:
        _, mig, _ = self._dev(handle, mig_ok=True)
        if mig is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance_id

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: SimDevice, profile: int,
                                            version: int = 2) -> Any:
        gpu, _, _ = self._dev(handle)
        fam = gpu.mig_family
        if fam is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        shape = _GI_PROFILES.get(profile)
        if shape is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g, mem = shape
        mem = min(mem, fam.memory_slices)
        if g not in fam.sms or mem not in fam.labels:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2
                else pynvml.c_nvmlGpuInstanceProfileInfo_t())
        info.id = profile
        info.isP2pSupported = 0
        info.sliceCount = g
        info.instanceCount = fam.parent_slices // g
        info.multiprocessorCount = fam.sms[g]
        info.copyEngineCount = g
        info.decoderCount = g // 2
        info.encoderCount = 0
        info.memorySizeMB = (gpu.memory_bytes * mem // fam.memory_slices) >> 20
        if version == 2:
            info.name = f"MIG {g}g.{fam.labels[mem]}"
        return info
