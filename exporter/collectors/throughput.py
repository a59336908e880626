"""PCIe and scale-up link throughput per GPU, and per MIG instance where NVML gives it.

Other vendors (AMD XGMI, Intel PCIe through Level Zero) give byte counters through the device
contract (`DeviceReader.interconnect`): differenced between cycles, over the device's own
timestamps where it gives them, into bytes per second; a counter that went back (driver
reload) starts afresh, and the first cycle emits nothing. A rate the driver measured itself
(AMD's PCIe estimate) is emitted as read.

NVIDIA's source is chosen per GPU. With GPM (Hopper and later): NVML's PCIe and NVLink (all links)
rates, the mean between this cycle's GPM sample and the previous one (MiB/s; the first cycle
emits nothing). Without GPM: PCIe from nvmlDeviceGetPcieThroughput, which the driver measures
over 20 ms (KB/s: a spot reading, not a mean), and NVLink from each link's data byte counter
(field values NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB) differenced between cycles and
summed over the links. Emitted in bytes per second. NVLink goes to its own family and, as
link_type "nvlink", to the vendor-neutral link family."""

from __future__ import annotations

import time

from exporter.collectors.base import GpuCollector, nvlink_count
from exporter.collectors.gpm import NO_MIG
from exporter.collectors.gpmsample import GpmPairs
from exporter.core import CollectorDeps, CycleContext, GpuRef, Labels, SampleSink
from exporter.device.contract import Interconnect, Tally
from exporter.device.nvmlapi import NvmlApi
from exporter.nvmlcall import Reader, field_value

MIB = 1 << 20
KIB = 1 << 10
PCIE = "gpu_pcie_throughput_bytes_per_second"
NVLINK = "gpu_nvlink_throughput_bytes_per_second"
LINK = "gpu_link_throughput_bytes_per_second"
TX, RX = "tx", "rx"  # tx: sent by the GPU, rx: received by it

# (family, direction) -> NVML_GPM_METRIC_* id (nvml.h), in MiB/s
_GPM = {
    (PCIE, TX): 20,  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    (PCIE, RX): 21,  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    (NVLINK, TX): 61,  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    (NVLINK, RX): 60,  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
}
_GPM_IDS = tuple(_GPM.values())
# direction -> NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* field id (KiB since the driver loaded)
_NVLINK_FIELDS = {TX: 138, RX: 139}
# direction -> nvmlPcieUtilCounter_t (NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES)
_PCIE_COUNTERS = {TX: 0, RX: 1}

# (link, direction) -> (KiB, seconds) of a link's data counter at the last cycle
Counters = dict[tuple[int, str], tuple[float, float]]
# (family, link type, link, direction) -> (bytes, seconds) of a contract counter
ByteCounters = dict[tuple[str, str, int, str], tuple[float, float]]


def _add(sink: SampleSink, family: str, labels: Labels, direction: str, value: float) -> None:
    """One rate; NVLink's also in the vendor-neutral link family."""
    sink.add(family, (*labels, direction), value)
    if family == NVLINK:
        sink.add(LINK, (*labels, "nvlink", direction), value)


class ThroughputCollector(GpuCollector):
    name = "throughput"

    def __init__(self, deps: CollectorDeps) -> None:
        super().__init__(deps)
        self._nvml = deps.backend.nvml
        self._bytes: dict[str, ByteCounters] = {}  # uuid -> last contract counters
        self._gpm = GpmPairs(deps.backend.nvml)
        self._links: dict[str, int] = {}  # uuid -> NVLink links (probed once)
        self._counters: dict[str, Counters] = {}  # uuid -> last link counters
        # GPU instances whose GPM samples gave none of these metrics: not asked again
        self._no_mig: set[tuple[str, int]] = set()

    @property
    def nvml(self) -> NvmlApi:
        assert self._nvml is not None, "read_nvml runs only on an NVML backend"
        return self._nvml

    def read_gpu(self, ctx: CycleContext, sink: SampleSink, tally: Tally, gpu: GpuRef) -> None:
        if gpu.vendor == "nvidia":
            if self._nvml is not None:
                self.read_nvml(ctx, sink, Reader(self._nvml, tally), gpu)
            return
        self._emit_counters(sink, gpu, (*gpu.labels(ctx.node), *NO_MIG),
                            self.backend.interconnect(gpu, tally))

    def _emit_counters(self, sink: SampleSink, gpu: GpuRef, labels: Labels,
                       ic: Interconnect) -> None:
        """Rates from the contract's byte counters, summed over the links of a type."""
        now = ic.timestamp_seconds if ic.timestamp_seconds is not None else time.monotonic()
        cur: ByteCounters = {}
        for direction, value in ((TX, ic.pcie_tx_bytes), (RX, ic.pcie_rx_bytes)):
            if value is not None:
                cur[(PCIE, "", 0, direction)] = (float(value), now)
        for link in ic.links:
            at = now if link.timestamp_seconds is None else link.timestamp_seconds
            for direction, value in ((TX, link.tx_bytes), (RX, link.rx_bytes)):
                if value is not None:
                    cur[(LINK, link.link_type, link.link, direction)] = (float(value), at)
        prev = self._bytes.get(gpu.uuid, {})
        self._bytes[gpu.uuid] = cur
        rates: dict[tuple[str, str, str], float] = {}
        for key, (count, t) in cur.items():
            old = prev.get(key)
            if old is None or t <= old[1] or count < old[0]:
                continue  # first sight, no time passed, or the counter went back
            family, link_type, _, direction = key
            k = (family, link_type, direction)
            rates[k] = rates.get(k, 0.0) + (count - old[0]) / (t - old[1])
        for direction, rate in ((TX, ic.pcie_tx_bytes_per_second),
                                (RX, ic.pcie_rx_bytes_per_second)):
            if rate is not None:  # the driver's own rate (AMD): as read
                rates[(PCIE, "", direction)] = rate
        for (family, link_type, direction), rate in sorted(rates.items()):
            extra = (link_type,) if family == LINK else ()
            sink.add(family, (*labels, *extra, direction), rate)

    def read_nvml(self, ctx: CycleContext, sink: SampleSink, r: Reader, gpu: GpuRef) -> None:
        labels = (*gpu.labels(ctx.node), *NO_MIG)
        if not self._gpm.supported(r, gpu):
            self._pcie_spot(sink, r, gpu, labels)
            self._nvlink_counters(sink, r, gpu, labels)
            return
        self._emit_gpm(sink, self._gpm.metrics(r, gpu, None, _GPM_IDS), labels)
        for mig in ctx.migs:
            key = (gpu.uuid, mig.gpu_instance_id)
            if mig.parent.uuid != gpu.uuid or key in self._no_mig:
                continue
            values = self._gpm.metrics(r, gpu, mig.gpu_instance_id, _GPM_IDS)
            if values == {}:
                self._no_mig.add(key)
            self._emit_gpm(sink, values, mig.labels(ctx.node))

    def on_gpu(self, ctx: CycleContext, sink: SampleSink, gpu: GpuRef, up: bool) -> None:
        if not up:  # counters and samples of a lost GPU are stale
            self._gpm.forget(gpu.uuid)
            self._counters.pop(gpu.uuid, None)
            self._bytes.pop(gpu.uuid, None)

    @staticmethod
    def _emit_gpm(sink: SampleSink, values: dict[int, float] | None, labels: Labels) -> None:
        for (family, direction), metric in _GPM.items():
            if values and metric in values:
                _add(sink, family, labels, direction, max(0.0, values[metric]) * MIB)

    def _pcie_spot(self, sink: SampleSink, r: Reader, gpu: GpuRef, labels: Labels) -> None:
        for direction, counter in _PCIE_COUNTERS.items():
            kb = r.call(self.nvml.nvmlDeviceGetPcieThroughput, gpu.handle, counter)
            if kb is not None:
                sink.add(PCIE, (*labels, direction), kb * KIB)

    def _nvlink_counters(self, sink: SampleSink, r: Reader, gpu: GpuRef,
                         labels: Labels) -> None:
        if gpu.uuid not in self._links:
            self._links[gpu.uuid] = nvlink_count(r, gpu.handle)
        ids = [(_NVLINK_FIELDS[d], link) for link in range(self._links[gpu.uuid])
               for d in (TX, RX)]
        if not ids:
            return
        values = r.call(self.nvml.nvmlDeviceGetFieldValues, gpu.handle, ids)
        if values is None:
            return
        prev = self._counters.get(gpu.uuid, {})
        cur: Counters = {}
        rates: dict[str, float] = {}
        for i, (fid, link) in enumerate(ids):
            fv = values[i]
            if not r.check(int(fv.nvmlReturn), "nvmlDeviceGetFieldValues(NVLink data)"):
                continue
            direction = TX if fid == _NVLINK_FIELDS[TX] else RX
            now = (field_value(fv), int(fv.timestamp) / 1e6)
            cur[(link, direction)] = now
            old = prev.get((link, direction))
            # a counter that went back (driver reloaded) starts afresh
            if old is not None and now[1] > old[1] and now[0] >= old[0]:
                rate = (now[0] - old[0]) * KIB / (now[1] - old[1])
                rates[direction] = rates.get(direction, 0.0) + rate
        self._counters[gpu.uuid] = cur
        for direction in (TX, RX):
            if direction in rates:
                _add(sink, NVLINK, labels, direction, rates[direction])

    def close(self) -> None:
        self._gpm.close()
