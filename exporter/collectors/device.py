"""Per-GPU identity, health, temperature, power, energy, utilisation, memory and clocks: the
backend's Telemetry, already in the families' units."""

from __future__ import annotations

from exporter.collectors.base import GpuCollector
from exporter.core import CycleContext, GpuRef, GpuStatic, SampleSink
from exporter.device.contract import Tally


class DeviceCollector(GpuCollector):
    name = "device"

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        labels = gpu.labels(ctx.node)
        st = ctx.static.get(gpu.uuid, GpuStatic())
        driver, cuda = ctx.driver_of(gpu)
        sink.add("gpu_info", (*labels, st.pci_bus_id, driver, cuda, st.vbios_version,
                              st.mig_mode, st.virtualization_mode), 1)
        sink.add("gpu_up", labels, 1 if up else 0)

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        t = self.backend.telemetry(gpu, tally)
        labels = gpu.labels(ctx.node)
        for family, value in (("gpu_temperature_celsius", t.temperature_celsius),
                              ("gpu_memory_temperature_celsius", t.memory_temperature_celsius),
                              ("gpu_power_watts", t.power_watts),
                              ("gpu_power_limit_watts", t.power_limit_watts),
                              ("gpu_energy_joules_total", t.energy_joules),
                              ("gpu_utilization_ratio", t.utilization),
                              ("gpu_memory_utilization_ratio", t.memory_utilization),
                              ("gpu_encoder_utilization_ratio", t.encoder_utilization),
                              ("gpu_decoder_utilization_ratio", t.decoder_utilization)):
            if value is not None:
                sink.add(family, labels, value)
        if t.memory is not None:
            sink.add("gpu_memory_total_bytes", labels, t.memory.total_bytes)
            sink.add("gpu_memory_used_bytes", labels, t.memory.used_bytes)
            if t.memory.free_bytes is not None:
                sink.add("gpu_memory_free_bytes", labels, t.memory.free_bytes)
            if t.memory.reserved_bytes is not None:
                sink.add("gpu_memory_reserved_bytes", labels, t.memory.reserved_bytes)
        if t.sm_clock_hertz is not None:
            sink.add("gpu_sm_clock_hertz", labels, t.sm_clock_hertz)
        if t.memory_clock_hertz is not None:
            sink.add("gpu_memory_clock_hertz", labels, t.memory_clock_hertz)
        if t.partition_energy_joules:
            parts = {m.uuid: m for m in ctx.migs if m.parent.uuid == gpu.uuid}
            for uuid, joules in t.partition_energy_joules:
                if uuid in parts:  # its own family: metering sums gpu_energy_joules_total only
                    sink.add("gpu_partition_energy_joules_total", parts[uuid].labels(ctx.node),
                             joules)
