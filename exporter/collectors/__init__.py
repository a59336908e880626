"""The collector table: one row per collector (name, default on/off, help, factory).
Command-line flags (--collector.NAME / --no-collector.NAME) are derived from it, and the
sampler runs the enabled ones in this order (processes before attribution)."""

from __future__ import annotations

from typing import Any

from exporter.collectors.clocks import ClocksCollector
from exporter.collectors.device import DeviceCollector
from exporter.collectors.gpm import GpmCollector
from exporter.collectors.mig import MigCollector
from exporter.collectors.processes import ProcessesCollector
from exporter.collectors.reliability import EccCollector, NvlinkCollector
from exporter.collectors.xid import XidCollector
from exporter.core import Collector, CollectorSpec, ExporterOptions


def _attribution(options: ExporterOptions, nvml: Any) -> Collector:
    # Imported lazily: it pulls in grpc and protobuf (~19 MiB of RSS).
    from exporter.attribution.collector import AttributionCollector

    return AttributionCollector(options, nvml)


REGISTRY: tuple[CollectorSpec, ...] = (
    CollectorSpec("device", True, "identity, health, temperature, power, energy, utilisation, "
                  "memory, clocks", DeviceCollector),
    CollectorSpec("clocks", True, "clock event (throttle) reasons and violation time",
                  ClocksCollector),
    CollectorSpec("ecc", True, "ECC errors, remapped rows, PCIe replays", EccCollector),
    CollectorSpec("nvlink", True, "NVLink error counters", NvlinkCollector),
    CollectorSpec("gpm", True, "GPM SM/tensor/DRAM activity (Hopper+), per GPU and MIG",
                  GpmCollector),
    CollectorSpec("mig", True, "MIG instances and their memory", MigCollector),
    CollectorSpec("xid", True, "XID error events from the NVML event set", XidCollector),
    CollectorSpec("processes", True, "GPU processes (feeds attribution)", ProcessesCollector),
    CollectorSpec("attribution", True, "pod attribution via kubelet PodResources, cgroups and "
                  "the pod watch", _attribution),
)

BY_NAME = {spec.name: spec for spec in REGISTRY}
