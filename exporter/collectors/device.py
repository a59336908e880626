"""Per-GPU identity, health, temperature, power, energy, utilisation, memory and clocks."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import NvmlCollector
from exporter.core import CycleContext, GpuRef, GpuStatic, SampleSink
from exporter.nvmlcall import Reader, field_value

MHZ = 1_000_000.0


class DeviceCollector(NvmlCollector):
    name = "device"

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        labels = gpu.labels(ctx.node)
        st = ctx.static.get(gpu.uuid, GpuStatic())
        sink.add("gpu_info", (*labels, st.pci_bus_id, ctx.driver_version, ctx.cuda_version,
                              st.vbios_version, st.mig_mode, st.virtualization_mode), 1)
        sink.add("gpu_up", labels, 1 if up else 0)

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        self._read(sink, r, gpu.handle, gpu.labels(ctx.node), gpu.mig_enabled)

    def _read(self, sink: SampleSink, r: Reader, h: Any,
              labels: tuple[str, ...], mig_enabled: bool) -> None:
        nv = self.nvml
        # Temperature first: it is the cheapest call and tells us quickly if the GPU is lost.
        temp = r.call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            sink.add("gpu_temperature_celsius", labels, temp)
        fields = r.call(nv.nvmlDeviceGetFieldValues, h, [nv.NVML_FI_DEV_MEMORY_TEMP])
        if fields:
            fv = fields[0]
            if getattr(fv, "nvmlReturn", 1) == 0:
                sink.add("gpu_memory_temperature_celsius", labels, field_value(fv))
        power = r.call(nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            sink.add("gpu_power_watts", labels, power / 1000.0)
        limit = r.call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            sink.add("gpu_power_limit_watts", labels, limit / 1000.0)
        energy = r.call(nv.nvmlDeviceGetTotalEnergyConsumption, h)
        if energy is not None:
            sink.add("gpu_energy_joules_total", labels, energy / 1000.0)
        if not mig_enabled:  # NVML has no device utilisation on MIG-enabled GPUs
            util = r.call(nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                sink.add("gpu_utilization_ratio", labels, util.gpu / 100.0)
                sink.add("gpu_memory_utilization_ratio", labels, util.memory / 100.0)
            enc = r.call(nv.nvmlDeviceGetEncoderUtilization, h)
            if enc is not None:
                sink.add("gpu_encoder_utilization_ratio", labels, enc[0] / 100.0)
            dec = r.call(nv.nvmlDeviceGetDecoderUtilization, h)
            if dec is not None:
                sink.add("gpu_decoder_utilization_ratio", labels, dec[0] / 100.0)
        mem = r.call(nv.nvmlDeviceGetMemoryInfo, h, version=nv.nvmlMemory_v2)
        if mem is None:
            mem = r.call(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            sink.add("gpu_memory_total_bytes", labels, mem.total)
            sink.add("gpu_memory_used_bytes", labels, mem.used)
            sink.add("gpu_memory_free_bytes", labels, mem.free)
            reserved = getattr(mem, "reserved", None)
            if reserved is not None:
                sink.add("gpu_memory_reserved_bytes", labels, reserved)
        sm = r.call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        if sm is not None:
            sink.add("gpu_sm_clock_hertz", labels, sm * MHZ)
        memclk = r.call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        if memclk is not None:
            sink.add("gpu_memory_clock_hertz", labels, memclk * MHZ)

