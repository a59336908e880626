"""Types shared by the sampler and the collectors: what a sample cycle sees and produces."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# The device types are the backend contract's; re-exported here for the collectors' imports.
from exporter.device.contract import (
    DeviceReader,
    GpuRef,
    GpuStatic,
    MigRef,
    ProcessSample,
    Vendor,
)
from exporter.metrics import BY_NAME
from gpu_ledger.sharing import SharingMode

__all__ = ["GpuRef", "GpuStatic", "MigRef", "ProcessSample"]

Labels = tuple[str, ...]
# Allow-listed pod labels, (name, value) pairs sorted by name; rendered as label_<name>.
PodLabels = tuple[tuple[str, str], ...]
_SURROGATE = re.compile("[\ud800-\udfff]")  # the only str characters UTF-8 cannot encode


@dataclass(frozen=True)
class SourceStatus:
    up: bool
    reason: str = ""


@dataclass(frozen=True)
class ExporterOptions:
    node: str = ""
    interval: float = 5.0
    process_metrics: bool = False
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    proc_root: str = "/proc"
    sysfs_root: str = "/sys"  # PCI functions: the GPUs the node has, without NVML
    kubeconfig: str | None = None
    kubernetes: bool = True
    pod_label_allowlist: tuple[str, ...] = ()
    # resource name -> sharing mode override (exclusive | mig | time-slicing | mps)
    sharing_modes: tuple[tuple[str, SharingMode], ...] = ()
    rpc_timeout: float = 2.0


class SampleSink:
    """Collects samples for one cycle, grouped by family, in insertion order.

    Label values that are not valid Unicode (lone surrogates, which a broken or hostile API
    server can send in a pod label) cannot be encoded as UTF-8: they are replaced here, each
    bad character by U+FFFD, and counted in `replaced`, so rendering never fails on them."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[Labels, float, PodLabels]]] = {}
        self.replaced = 0  # label values repaired this cycle

    def add(self, family: str, labels: Labels, value: float, pod_labels: PodLabels = ()) -> None:
        fam = BY_NAME[family]  # KeyError here means an undeclared family: a bug, not bad input
        if len(labels) != len(fam.labels):
            raise ValueError(f"{family}: expected labels {fam.labels}, got {labels}")
        # One join and an isascii() per sample (~0.1 us): all-ASCII, the common case, needs
        # no further look (docs/performance.md, "Hostile clients").
        if not "".join(labels).isascii():
            labels = tuple(map(self._valid, labels))
        if pod_labels and not all(v.isascii() for _, v in pod_labels):
            pod_labels = tuple((k, self._valid(v)) for k, v in pod_labels)
        self.samples.setdefault(family, []).append((labels, float(value), pod_labels))

    def _valid(self, value: str) -> str:
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            self.replaced += 1
            return _SURROGATE.sub("\ufffd", value)


@dataclass
class CycleContext:
    """What one sample cycle knows. The sampler fills it in stages before any collector runs
    (inventory, then the process list when a collector reads it); collectors only read it,
    except `lost` (a GPU found lost mid-cycle) and `sources` (status of non-NVML sources).
    Devices are read only through `backend` (the typed contract; every vendor's devices of
    the node: exporter/device/backends.py), never through a vendor library."""

    options: ExporterOptions
    now: float
    gpus: list[GpuRef] = field(default_factory=list)  # every backend's, in backend order
    migs: list[MigRef] = field(default_factory=list)
    static: dict[str, GpuStatic] = field(default_factory=dict)  # uuid -> identity
    # vendor -> (driver version, CUDA version: NVIDIA only, "" elsewhere)
    versions: dict[Vendor, tuple[str, str]] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)  # uuids of GPUs that fell off the bus
    processes: list[ProcessSample] = field(default_factory=list)
    # NVML calls that failed while listing processes: the list may be incomplete.
    process_failures: int = 0
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    backend: DeviceReader | None = None

    @property
    def node(self) -> str:
        return self.options.node

    def driver_of(self, gpu: GpuRef) -> tuple[str, str]:
        """(driver version, CUDA version) of the backend that made the GPU."""
        return self.versions.get(gpu.vendor, ("", ""))


class Collector(Protocol):
    """What the sampler reads from a collector, and nothing else."""

    name: str
    needs_nvml: bool  # skipped (success 0) while the device backend is down
    reads_processes: bool  # the sampler lists GPU processes into ctx.processes first

    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        """Emit this cycle's samples; return how many NVML calls failed unexpectedly (0 is
        success; a value that is merely absent, NOT_SUPPORTED, is not a failure)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CollectorDeps:
    """Everything a collector factory may need."""

    options: ExporterOptions
    backend: DeviceReader  # the node's backends (one per vendor present)
    clock: Callable[[], float] = time.time
    threaded: bool = True  # False under a simulated clock: no background threads


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    default_enabled: bool
    help: str
    factory: Callable[[CollectorDeps], Collector]
