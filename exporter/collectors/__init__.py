"""The collector table: one row per collector (name, default on/off, help, factory).
Command-line flags (--collector.NAME / --no-collector.NAME) are derived from it. No collector
reads what another wrote: the order only fixes the order of the exposition."""

from __future__ import annotations

from exporter.collectors.clocks import ClocksCollector
from exporter.collectors.device import DeviceCollector
from exporter.collectors.gpm import GpmCollector
from exporter.collectors.mig import MigCollector
from exporter.collectors.reliability import EccCollector, NvlinkCollector
from exporter.collectors.throughput import ThroughputCollector
from exporter.collectors.vgpu import VgpuCollector
from exporter.collectors.xid import XidCollector
from exporter.core import Collector, CollectorDeps, CollectorSpec


def _attribution(deps: CollectorDeps) -> Collector:
    # Imported lazily: only what attribution needs is loaded when it is enabled.
    from exporter.attribution.collector import AttributionCollector

    return AttributionCollector(deps.options)


REGISTRY: tuple[CollectorSpec, ...] = (
    CollectorSpec("device", True, "identity, health, temperature, power, energy, utilisation, "
                  "memory, clocks", DeviceCollector),
    CollectorSpec("clocks", True, "clock event (throttle) reasons and violation time",
                  ClocksCollector),
    CollectorSpec("ecc", True, "ECC errors, remapped rows, PCIe replays", EccCollector),
    CollectorSpec("nvlink", True, "NVLink error counters", NvlinkCollector),
    CollectorSpec("gpm", True, "GPM SM/tensor/DRAM activity (Hopper+), per GPU and MIG",
                  GpmCollector),
    CollectorSpec("throughput", True, "PCIe and scale-up link throughput (NVIDIA: GPM on "
                  "Hopper+, NVML counters elsewhere, per GPU and MIG where NVML gives it; AMD "
                  "XGMI and Intel PCIe from the backend's byte counters)",
                  ThroughputCollector),
    CollectorSpec("mig", True, "MIG instances and their memory", MigCollector),
    CollectorSpec("xid", True, "XID error events from the NVML event set", XidCollector),
    CollectorSpec("vgpu", True, "NVIDIA vGPU: a guest's licence state, a host's vGPU "
                  "instances", VgpuCollector),
    CollectorSpec("attribution", True, "pod attribution: GPU allocations (kubelet PodResources) "
                  "and GPU process usage (NVML process list, cgroups, the pod watch)",
                  _attribution),
)

BY_NAME = {spec.name: spec for spec in REGISTRY}
