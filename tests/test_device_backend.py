"""The device backend contract (exporter/device/contract.py) and its NVML implementation, run
over the simulator's NVML module: identity, units normalised in the backend, partitions,
error events, lost devices; and the boundary (only the NVML backend calls NVML)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import pynvml
import pytest

from exporter.collectors import REGISTRY
from exporter.core import ExporterOptions
from exporter.device.contract import (
    DeviceBackend,
    DeviceLost,
    ErrorEvent,
    EventSource,
    GpuRef,
    GpuStatic,
    GuestLicence,
    Interconnect,
    Inventory,
    MemoryUsage,
    MigRef,
    ProcessReader,
    Reliability,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
    pci_bdf,
)
from exporter.device.nvml import NvmlBackend
from exporter.device.nvmlapi import NvmlApi
from exporter.nvml_loader import load_backend
from exporter.sampler import Sampler
from gpusim.cluster import ManualClock
from gpusim.node import write_sysfs_tree
from gpusim.nvml import SimNVML
from gpusim.scenario import loads_scenario
from tests.exporter_helpers import values

ROOT = Path(__file__).parent.parent
T0 = 1_790_000_000.0
NODE = """
node: node-a
gpus:
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    power_limit_watts: 700
    mig: [{profile: 3g.40gb}, {profile: 2g.20gb}]
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
pods:
  - namespace: ml
    name: infer
    containers:
      - name: main
        gpus: [{gpu: 1}]
        processes: [{memory: 4GiB, sm_util: 0.25}]
faults:
  - {gpu: 1, at: 1h, kind: lost}
xids:
  - {gpu: 0, at: 10m, xid: 79}
"""


@pytest.fixture
def sim() -> tuple[NvmlBackend, SimNVML, ManualClock]:
    clock = ManualClock(T0 + 600)
    nvml = SimNVML(loads_scenario(NODE, "node.yaml"), clock=clock, start=T0)
    backend = NvmlBackend(nvml)
    backend.open()
    return backend, nvml, clock


def _api_members() -> list[str]:
    return [n for n in dir(NvmlApi) if not n.startswith("_")] + \
        list(inspect.get_annotations(NvmlApi))


def test_real_pynvml_has_every_call_the_backend_makes() -> None:
    """pynvml is untyped: this is the check that casting it to NvmlApi is true."""
    missing = [n for n in _api_members() if not hasattr(pynvml, n)]
    assert not missing


def test_inventory_identity_and_partitions(sim: tuple[NvmlBackend, SimNVML, ManualClock]) -> None:
    backend, nvml, _ = sim
    inv = backend.inventory(None)
    assert [g.model for g in inv.gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    h100 = inv.gpus[0]
    st = inv.static[h100.uuid]
    assert st.vendor == "nvidia" and st.memory_bytes == 80 << 30
    bus_id = nvml.as_api().nvmlDeviceGetPciInfo(h100.handle).busId
    assert st.pci_bus_id and st.pci_bus_id == (bus_id.decode() if isinstance(bus_id, bytes)
                                               else bus_id)
    assert h100.mig_enabled and not inv.gpus[1].mig_enabled
    assert [(m.profile, m.kind, m.parent_slices) for m in inv.migs] == \
        [("3g.40gb", "mig", 7), ("2g.20gb", "mig", 7)]


@pytest.mark.parametrize(("spelling", "bdf"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML
    ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs, amdsmi, Intel
    ("3B:00.1", "0000:3b:00.1"),  # no domain
    ("0001:C1:00.0", "0001:c1:00.0"),
    ("", ""),
    ("not-an-address", "not-an-address"),
])
def test_pci_bdf_is_one_spelling(spelling: str, bdf: str) -> None:
    assert pci_bdf(spelling) == bdf


def test_inventory_bdf_joins_the_sysfs_functions(
        sim: tuple[NvmlBackend, SimNVML, ManualClock], tmp_path: Path) -> None:
    """The PCI address is a join key: NVML's spelling of each GPU matches its sysfs function."""
    backend, nvml, _ = sim
    write_sysfs_tree(nvml.scenario, tmp_path)
    inv = backend.inventory(None)
    bdfs = sorted(inv.static[g.uuid].pci_bdf for g in inv.gpus)
    assert bdfs and all(bdfs)
    assert backend.expected_devices(str(tmp_path)) == bdfs


def test_units_are_normalised_in_the_backend(sim: tuple[NvmlBackend, SimNVML, ManualClock]
                                             ) -> None:
    backend, nvml, _ = sim
    gpu = backend.inventory(None).gpus[1]
    tally = Tally()
    t = backend.telemetry(gpu, tally)
    assert tally.failures == 0
    api = nvml.as_api()
    assert t.energy_joules == api.nvmlDeviceGetTotalEnergyConsumption(gpu.handle) / 1000  # mJ
    assert t.power_limit_watts == 400.0  # NVML: mW
    assert t.sm_clock_hertz == api.nvmlDeviceGetClockInfo(gpu.handle, 1) * 1e6  # MHz
    assert t.utilization is not None and 0 <= t.utilization <= 1
    assert t.memory is not None and t.memory.total_bytes == 80 << 30
    mig_gpu = backend.inventory(None).gpus[0]
    assert backend.telemetry(mig_gpu, tally).utilization is None  # partitioned: absent


def test_processes_and_partition_memory(sim: tuple[NvmlBackend, SimNVML, ManualClock]) -> None:
    backend, _, _ = sim
    inv = backend.inventory(None)
    procs = backend.process_reader().read(inv.gpus[1], inv.migs, Tally())
    assert [(p.uuid, p.memory_bytes) for p in procs] == [(inv.gpus[1].uuid, 4 << 30)]
    mem = backend.partition_memory(inv.migs[0], Tally())
    assert mem is not None and mem.total_bytes > 0


def test_error_events_name_the_device(sim: tuple[NvmlBackend, SimNVML, ManualClock]) -> None:
    backend, _, clock = sim
    inv = backend.inventory(None)
    events = backend.error_events()
    events.register(list(inv.gpus))
    clock.now += 1
    got = []
    while (batch := events.wait(0)) is not None:
        got += batch
    events.close()
    assert [(e.uuid, e.code, e.kind) for e in got] == [(inv.gpus[0].uuid, 79, "xid")]


def test_a_lost_device_raises_device_lost(sim: tuple[NvmlBackend, SimNVML, ManualClock]
                                          ) -> None:
    backend, _, clock = sim
    inv = backend.inventory(None)
    clock.now = T0 + 2 * 3600
    with pytest.raises(DeviceLost):
        backend.telemetry(inv.gpus[1], Tally())
    again = backend.inventory(inv)  # keeps the lost GPU's identity
    assert [g.uuid for g in again.gpus] == [g.uuid for g in inv.gpus]


def test_loader_gives_the_nvml_backend_over_the_simulator() -> None:
    scenario = ROOT / "gpusim" / "scenarios"
    path = next(p for p in sorted(scenario.glob("*.yaml")))
    backend = load_backend(f"sim:{path}")
    assert backend.vendor == "nvidia" and backend.source == "nvml"
    assert backend.nvml is not None


def test_only_the_nvml_backend_calls_nvml() -> None:
    """The sampler, the process stage and the vendor-neutral collectors read the contract."""
    for rel in ("exporter/sampler.py", "exporter/processes.py", "exporter/collectors/device.py",
                "exporter/collectors/mig.py", "exporter/collectors/vgpu.py",
                "exporter/collectors/xid.py", "exporter/device/backends.py",
                "exporter/attribution/vgpu.py", "exporter/attribution/collector.py"):
        text = (ROOT / rel).read_text()
        assert "nvmlDevice" not in text and "nvmlVgpu" not in text and "nvmlEvent" not in text, \
            rel
        assert "import pynvml" not in text, rel


class _OtherVendor:
    """A backend without NVML, as an AMD or Intel one will be: the contract is all it offers."""

    vendor: Vendor = "amd"
    source = "fake"
    library = "FakeSMI"
    nvml: NvmlApi | None = None

    def __init__(self) -> None:
        self.gpu = GpuRef(0, "GPU-fake-0", "Fake MI300X", False, handle=object(), vendor="amd")

    def open(self) -> None: ...
    def close(self) -> None: ...

    def inventory(self, previous: Inventory | None) -> Inventory:
        return Inventory(driver_version="6.8", gpus=(self.gpu,), static={
            self.gpu.uuid: GpuStatic(pci_bus_id="0000:0c:00.0", vendor="amd")})

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return ["0000:0c:00.0"]

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        return Telemetry(power_watts=350.0, energy_joules=1234.5, utilization=0.5)

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        return Reliability(ecc_corrected=3)

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        return None

    def process_reader(self) -> ProcessReader:
        raise AssertionError("no collector here reads processes")

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        return []

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        return None

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        return Interconnect()

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        return []

    def error_events(self) -> EventSource:
        return _NoEvents()


class _NoEvents:
    def register(self, gpus: Sequence[GpuRef]) -> None: ...
    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None:
        return None
    def close(self) -> None: ...


def test_a_backend_without_nvml_plugs_into_the_sampler() -> None:
    backend: DeviceBackend = _OtherVendor()
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(backend, ExporterOptions(node="n"), specs, threaded=False)
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="fake") == [1]
    assert values(body, "gpu_power_watts", uuid="GPU-fake-0") == [350.0]
    assert values(body, "gpu_energy_joules_total", uuid="GPU-fake-0") == [1234.5]
    assert values(body, "gpu_ecc_errors_total", uuid="GPU-fake-0", type="corrected") == [3]
    assert not values(body, "gpu_temperature_celsius")  # absent, not 0
    # The NVIDIA-only collectors read nothing and do not fail.
    for name in ("clocks", "nvlink", "gpm", "throughput"):
        assert values(body, "gpu_exporter_collector_success", collector=name) == [1], name
    assert values(body, "gpu_expected_devices", source="pci") == [1]
    sampler.close()
