"""A simulated `amdsmi`: the functions the AMD backend calls (exporter.device.amdsmiapi
`AmdSmiApi`), answered from a small description of a node, the way the real package answers
(ROCm/amdsmi py-interface and the MxGPU host library, versions in docs/backends.md):

- one processor handle per partition; a partitioned GPU's handles share its PCI address and
  differ in `current_partition_id` and DRM render node;
- device-wide activity on partition 0 only (the other partitions answer "N/A");
- VRAM in MB, power in W, the power cap in µW, energy as a counter in units of
  `counter_resolution` µJ, clocks in MHz, process GFX time in ns;
- errors as `AmdSmiLibraryException` with an amdsmi_status_t: NOT_SUPPORTED (2) for what the
  device lacks (MI300's edge sensor; VF functions off a GIM host), NOT_FOUND (31) for every call
  on a GPU that is lost.

Scenarios: `mi300x_cpx_nps4()` (8 MI300X in CPX/NPS4: 64 partitions) and `mxgpu_host()`
(MI300X PFs on a GIM host with SR-IOV VFs lent to VMs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporter.device.amdsmiapi import AmdSmiApi

STATUS_NOT_SUPPORTED = 2
STATUS_NOT_FOUND = 31
ENERGY_RESOLUTION_UJ = 15.259  # the simulated counter_resolution (µJ per tick)
NA = "N/A"


class AmdSmiLibraryException(Exception):
    """amdsmi_exception.AmdSmiLibraryException: `err_code`, `get_error_code()`."""

    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code

    def __str__(self) -> str:  # upstream's own two-line text
        return f"Error code:\n\t{self.err_code} | AMDSMI_STATUS_{self.err_code}"


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiGpuBlock(IntEnum):  # amdsmi.h amdsmi_gpu_block_t (bits)
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


@dataclass
class SimAmdProcess:
    pid: int
    gpu: int
    partition: int = 0
    vram_bytes: int = 0
    gfx_busy: float = 0.0  # share of its partition's GFX engine (0-1)
    name: str = "python3"


@dataclass
class SimAmdVf:
    fb_mb: int
    guest_fb_usage_mb: int = 0
    vm: str = ""


@dataclass
class SimAmdGpu:
    bdf: str
    uuid: str
    model: str = "AMD Instinct MI300X"
    vram_mb: int = 196_608  # 192 GiB
    compute: str = "SPX"
    memory: str = "NPS1"
    power_watts: float = 350.0
    power_cap_watts: float = 750.0
    hotspot_c: int = 52
    vram_c: int = 44
    gfx_mhz: int = 2100
    mem_mhz: int = 1300
    ecc_correctable: int = 0
    ecc_uncorrectable: int = 0
    pcie_replays: int = 0
    # PCIe messages per second the GPU receives and sends, and its max payload size (bytes)
    pcie_rx_msgs: int = 40_000_000
    pcie_tx_msgs: int = 10_000_000
    pcie_mps: int = 256
    bad_pages: list[str] = field(default_factory=list)  # statuses: RESERVED, PENDING, ...
    # RAS block name -> (correctable, uncorrectable, deferred); every block listed is enabled
    ras: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    render_base: int = 128  # renderD of partition 0
    # CPER records the driver holds, oldest first: (severity as amdsmi spells it, AFIDs)
    cper: list[tuple[str, list[int]]] = field(default_factory=list)
    vfs: list[SimAmdVf] = field(default_factory=list)
    lost: bool = False

    @property
    def partitions(self) -> int:
        return {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}[self.compute]


@dataclass(frozen=True)
class SimHandle:
    gpu: int
    partition: int


@dataclass(frozen=True)
class SimVfHandle:
    gpu: int
    vf: int


class SimAmdSmi:
    """Implements AmdSmiApi over `gpus` and `processes`; time from `clock` (seconds)."""

    AmdSmiLibraryException: type[Exception] = AmdSmiLibraryException
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType
    AmdSmiGpuBlock = AmdSmiGpuBlock

    def __init__(self, gpus: Sequence[SimAmdGpu], processes: Sequence[SimAmdProcess] = (),
                 *, host: bool = False, clock: Callable[[], float] = time.time,
                 start: float | None = None, driver_version: str = "6.10.5") -> None:
        self.gpus = list(gpus)
        self.processes = list(processes)
        self.host = host
        self.clock = clock
        self.start = clock() if start is None else start
        self.driver_version = driver_version
        self.initialised = False
        self.pci_throughput_calls = 0  # each costs a real driver one second

    def as_api(self) -> AmdSmiApi:
        return self

    # --- helpers ---
    def _gpu(self, h: SimHandle) -> SimAmdGpu:
        if not self.initialised:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        gpu = self.gpus[h.gpu]
        if gpu.lost:
            raise AmdSmiLibraryException(STATUS_NOT_FOUND)
        return gpu

    def _elapsed(self) -> float:
        return max(0.0, self.clock() - self.start)

    def _procs(self, h: SimHandle) -> list[SimAmdProcess]:
        return [p for p in self.processes if p.gpu == h.gpu and p.partition == h.partition]

    def _busy(self, gpu: int, partition: int) -> float:
        return min(1.0, sum(p.gfx_busy for p in self.processes
                            if p.gpu == gpu and p.partition == partition))

    # --- library, identity ---
    def amdsmi_init(self) -> None:
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[Any]:
        if not self.initialised:
            raise AmdSmiLibraryException(32)
        return [SimHandle(i, p) for i, g in enumerate(self.gpus) for p in range(g.partitions)]

    def amdsmi_get_gpu_device_bdf(self, h: SimHandle) -> str:
        return self._gpu(h).bdf

    def amdsmi_get_gpu_device_uuid(self, h: SimHandle) -> str:
        uuid = self._gpu(h).uuid
        return uuid if h.partition == 0 else f"{uuid[:-2]}{h.partition:02x}"

    def amdsmi_get_gpu_asic_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        return {"market_name": g.model, "vendor_id": "0x1002", "vendor_name": "AMD",
                "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": "0x" + g.uuid[-8:],
                "oam_id": h.gpu, "num_of_compute_units": 304 // g.partitions}

    def amdsmi_get_gpu_vbios_info(self, h: SimHandle) -> dict[str, Any]:
        self._gpu(h)
        return {"name": "AMD MI300X", "build_date": "2024/05/03 16:20", "part_number":
                "113-M3000100-102", "version": "022.040.003.043.000001"}

    def amdsmi_get_gpu_driver_info(self, h: SimHandle) -> dict[str, Any]:
        self._gpu(h)
        return {"driver_name": "amdgpu", "driver_version": self.driver_version,
                "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_gpu_kfd_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        return {"kfd_id": 1000 + h.gpu, "node_id": 2 + h.gpu * g.partitions + h.partition,
                "current_partition_id": h.partition if g.partitions > 1 else NA}

    def amdsmi_get_gpu_enumeration_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        return {"drm_render": g.render_base + h.partition, "drm_card": g.render_base - 128
                + h.partition, "hsa_id": h.gpu, "hip_id": h.gpu, "hip_uuid": "GPU-" + g.uuid}

    def amdsmi_get_gpu_compute_partition(self, h: SimHandle) -> str:
        return self._gpu(h).compute

    def amdsmi_get_gpu_memory_partition(self, h: SimHandle) -> str:
        return self._gpu(h).memory

    def amdsmi_get_gpu_virtualization_mode(self, h: SimHandle) -> dict[str, Any]:
        self._gpu(h)
        return {"mode": 2 if self.host else 1}  # HOST, BAREMETAL

    # --- telemetry ---
    def amdsmi_get_gpu_activity(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        if h.partition != 0:  # device-wide activity is reported on partition 0 only
            return {"gfx_activity": NA, "umc_activity": NA, "mm_activity": NA}
        gfx = sum(self._busy(h.gpu, p) for p in range(g.partitions)) / g.partitions
        return {"gfx_activity": round(gfx * 100), "umc_activity": round(gfx * 40),
                "mm_activity": 0}

    def amdsmi_get_gpu_vram_usage(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        used = sum(p.vram_bytes for p in self._procs(h)) >> 20
        return {"vram_total": g.vram_mb // g.partitions, "vram_used": used}

    def amdsmi_get_power_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        if h.partition != 0:
            return {"socket_power": NA, "current_socket_power": NA,
                    "average_socket_power": NA, "power_limit": NA}
        return {"socket_power": round(g.power_watts), "current_socket_power":
                round(g.power_watts), "average_socket_power": NA, "gfx_voltage": NA,
                "soc_voltage": NA, "mem_voltage": NA, "power_limit": round(g.power_cap_watts)}

    def amdsmi_get_power_cap_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        cap = int(g.power_cap_watts * 1_000_000)
        return {"power_cap": cap, "default_power_cap": cap, "dpm_cap": 2100,
                "min_power_cap": 0, "max_power_cap": cap}

    def amdsmi_get_energy_count(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        if h.partition != 0:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        ticks = int(g.power_watts * self._elapsed() * 1e6 / ENERGY_RESOLUTION_UJ)
        return {"power": ticks, "energy_accumulator": ticks,
                "counter_resolution": ENERGY_RESOLUTION_UJ,
                "timestamp": int(self.clock() * 1e9)}

    def amdsmi_get_temp_metric(self, h: SimHandle, sensor: Any, metric: Any) -> int:
        g = self._gpu(h)
        if not isinstance(sensor, AmdSmiTemperatureType) or \
                not isinstance(metric, AmdSmiTemperatureMetric):
            raise TypeError("AmdSmiParameterException")  # the real checks isinstance too
        if sensor == AmdSmiTemperatureType.EDGE:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)  # MI300 has no edge sensor
        return g.hotspot_c if sensor == AmdSmiTemperatureType.HOTSPOT else g.vram_c

    def amdsmi_get_clock_info(self, h: SimHandle, clock: Any) -> dict[str, Any]:
        g = self._gpu(h)
        if not isinstance(clock, AmdSmiClkType):
            raise TypeError("AmdSmiParameterException")
        mhz = g.gfx_mhz if clock == AmdSmiClkType.GFX else g.mem_mhz
        return {"clk": mhz, "min_clk": 500, "max_clk": mhz, "clk_locked": NA,
                "clk_deep_sleep": 0}

    def amdsmi_get_gpu_metrics_info(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        t = self._elapsed()
        # 7 XGMI links on an 8-GPU hive; KB transferred since the driver loaded
        links = [int(t * 1000) * (i + 1) for i in range(7)] + [NA]
        return {"xgmi_read_data_acc": links, "xgmi_write_data_acc": [*links[::-1][1:], NA],
                "pcie_bandwidth_acc": int(t * 10), "pcie_replay_count_acc": g.pcie_replays,
                "energy_accumulator": NA, "system_clock_counter": int(self.clock() * 1e9)}

    def amdsmi_get_gpu_pci_throughput(self, h: SimHandle) -> dict[str, Any]:
        """As ROCm's library reads the amdgpu `pcie_bw` file ("<received> <sent> <mps>", the
        driver's perf counters over one second): rocm_smi parses its first number into `sent`
        and its second into `received`, so the keys are swapped against the driver's."""
        g = self._gpu(h)
        self.pci_throughput_calls += 1
        return {"sent": g.pcie_rx_msgs, "received": g.pcie_tx_msgs, "max_pkt_sz": g.pcie_mps}

    # --- reliability ---
    def amdsmi_get_gpu_total_ecc_count(self, h: SimHandle) -> dict[str, Any]:
        g = self._gpu(h)
        return {"correctable_count": g.ecc_correctable,
                "uncorrectable_count": g.ecc_uncorrectable, "deferred_count": 0}

    def amdsmi_get_gpu_ras_block_features_enabled(self, h: SimHandle) -> list[dict[str, Any]]:
        g = self._gpu(h)
        return [{"block": b.name, "status": "ENABLED" if b.name in g.ras else "DISABLED"}
                for b in AmdSmiGpuBlock if b.name != "INVALID"]

    def amdsmi_get_gpu_ecc_count(self, h: SimHandle, block: Any) -> dict[str, Any]:
        g = self._gpu(h)
        if not isinstance(block, AmdSmiGpuBlock):
            raise TypeError("AmdSmiParameterException")
        if block.name not in g.ras:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        c, u, d = g.ras[block.name]
        return {"correctable_count": c, "uncorrectable_count": u, "deferred_count": d}

    def amdsmi_get_gpu_pci_replay_counter(self, h: SimHandle) -> int:
        return self._gpu(h).pcie_replays

    def amdsmi_get_gpu_bad_page_info(self, h: SimHandle) -> list[dict[str, Any]]:
        g = self._gpu(h)
        return [{"value": i, "page_address": 0x1000 * (i + 1), "page_size": 4096,
                 "status": s} for i, s in enumerate(g.bad_pages)]

    # --- RAS events ---
    def amdsmi_get_gpu_cper_entries(self, h: SimHandle, severity_mask: int, buffer_size: int,
                                    cursor: int) -> tuple[dict[int, dict[str, Any]], int,
                                                          list[dict[str, Any]], int]:
        """Up to 20 records from `cursor` (amdsmi reads at most 20 headers a call)."""
        g = self._gpu(h)
        picked = [(sev, afids) for sev, afids in g.cper[cursor:cursor + 20]
                  if severity_mask & {"non_fatal_uncorrected": 1, "fatal": 2,
                                      "non_fatal_corrected": 4}.get(sev, 0)]
        entries = {i: {"error_severity": sev, "signature": b"CPER", "record_length":
                       _CPER_HEADER + 8 * len(afids)} for i, (sev, afids) in enumerate(picked)}
        records = [{"bytes": list(_cper_bytes(afids)), "size": _CPER_HEADER + 8 * len(afids)}
                   for _, afids in picked]
        end = min(len(g.cper), cursor + 20)
        return entries, end, records, 0

    def amdsmi_get_afids_from_cper(self, records: list[Any]) -> tuple[list[int], int]:
        out: list[int] = []
        for r in records:
            raw = bytes(r["bytes"])
            if raw[:4] != b"CPER":
                raise AmdSmiLibraryException(43)  # AMDSMI_STATUS_UNEXPECTED_DATA
            body = raw[_CPER_HEADER:r["size"]]
            out += [int.from_bytes(body[i:i + 8], "little") for i in range(0, len(body), 8)]
        return out, len(out)

    # --- processes ---
    def amdsmi_get_gpu_process_list(self, h: SimHandle) -> list[dict[str, Any]]:
        self._gpu(h)
        t = self._elapsed()
        return [{"name": p.name, "pid": p.pid, "mem": p.vram_bytes,
                 "engine_usage": {"gfx": int(p.gfx_busy * t * 1e9), "enc": 0},
                 "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": p.vram_bytes},
                 "cu_occupancy": NA, "evicted_time": 0}
                for p in self._procs(h)]

    # --- MxGPU host ---
    def _host_gpu(self, h: SimHandle) -> SimAmdGpu:
        g = self._gpu(h)
        if not self.host:
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        return g

    def amdsmi_get_num_vf(self, h: SimHandle) -> dict[str, Any]:
        g = self._host_gpu(h)
        return {"num_vf_enabled": len(g.vfs), "num_vf_supported": 8}

    def amdsmi_get_vf_partition_info(self, h: SimHandle) -> list[dict[str, Any]]:
        g = self._host_gpu(h)
        out, offset = [], 0
        for i, vf in enumerate(g.vfs):
            out.append({"vf_id": i, "fb": {"fb_offset": offset, "fb_size": vf.fb_mb}})
            offset += vf.fb_mb
        return out

    def amdsmi_get_vf_handle_from_vf_index(self, h: SimHandle, index: int) -> Any:
        g = self._host_gpu(h)
        if not 0 <= index < len(g.vfs):
            raise AmdSmiLibraryException(1)  # AMDSMI_STATUS_INVAL
        return SimVfHandle(h.gpu, index)

    def _vf(self, vf: SimVfHandle) -> SimAmdVf:
        return self._host_gpu(SimHandle(vf.gpu, 0)).vfs[vf.vf]

    def amdsmi_get_vf_bdf(self, vf: SimVfHandle) -> str:
        self._vf(vf)
        bus = self.gpus[vf.gpu].bdf.split(":")[1]
        return f"0000:{bus}:02.{vf.vf}"

    def amdsmi_get_vf_uuid(self, vf: SimVfHandle) -> str:
        self._vf(vf)
        return f"{self.gpus[vf.gpu].uuid[:-4]}f{vf.vf:03x}"

    def amdsmi_get_vf_data(self, vf: SimVfHandle) -> dict[str, Any]:
        v = self._vf(vf)
        return {"sched": {"state": 2 if v.vm else 1, "flr_count": 0},
                "guard": {"enabled": False, "guard": {}}}

    def amdsmi_get_guest_data(self, vf: SimVfHandle) -> dict[str, Any]:
        v = self._vf(vf)
        return {"driver_version": "6.10.5" if v.vm else "", "fb_usage": v.guest_fb_usage_mb}


_CPER_HEADER = 128  # the simulated record: "CPER", padding, then the AFIDs as u64


def _cper_bytes(afids: list[int]) -> bytes:
    return b"CPER".ljust(_CPER_HEADER, b"\0") + b"".join(a.to_bytes(8, "little")
                                                          for a in afids)


def _uuid(i: int, salt: int) -> str:
    return f"{salt:08x}-0000-1000-80{i:02x}-0000000000{i:02x}"


def mi300x_cpx_nps4(gpus: int = 8, processes: Sequence[SimAmdProcess] = (),
                    **kw: Any) -> SimAmdSmi:
    """An MI300X node in CPX/NPS4: `gpus` GPUs x 8 partitions of 24 GiB each."""
    devs = [SimAmdGpu(bdf=f"0000:{0x0c + 0x20 * i:02x}:00.0", uuid=_uuid(i, 0x7ea1_0000),
                      compute="CPX", memory="NPS4", render_base=128 + 8 * i)
            for i in range(gpus)]
    return SimAmdSmi(devs, processes, **kw)


def mxgpu_host(gpus: int = 2, vfs: Sequence[SimAmdVf] = (), **kw: Any) -> SimAmdSmi:
    """A GIM (MxGPU) host: MI300X PFs in host mode, each with the given VFs."""
    devs = [SimAmdGpu(bdf=f"0000:{0x05 + 0x40 * i:02x}:00.0", uuid=_uuid(i, 0x4a1f_0000),
                      vfs=list(vfs), render_base=128 + i) for i in range(gpus)]
    return SimAmdSmi(devs, host=True, **kw)
