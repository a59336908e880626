"""Several device backends on one node (exporter/device/backends.py, exporter/sampler.py):
NVIDIA GPUs through the NVML backend over the simulator beside another vendor's backend, each
read going to the backend that made the device; each backend up or down on its own; and the
choice of backends at start-up (`--device-backend`, exporter/device/registry.py)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import pytest

from exporter.collectors import REGISTRY
from exporter.core import ExporterOptions
from exporter.device.backends import Backends
from exporter.device.contract import (
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
    ProcessSample,
    RasErrorCount,
    Reliability,
    Tally,
    Telemetry,
    Vendor,
    VirtualFunction,
)
from exporter.device.nvml import NvmlBackend
from exporter.device.nvmlapi import NvmlApi
from exporter.device.registry import LoadSpec, load_backends, parse_choice
from exporter.errors import ConfigError
from exporter.sampler import Sampler
from gpusim.cluster import ManualClock
from gpusim.nvml import SimNVML
from gpusim.scenario import loads_scenario
from tests.exporter_helpers import values

T0 = 1_790_000_000.0
NVIDIA_NODE = """
node: node-a
gpus:
  - model: NVIDIA L4
    memory: 24GiB
    power_limit_watts: 72
pods:
  - namespace: ml
    name: infer
    containers:
      - name: main
        gpus: [{gpu: 0}]
        processes: [{memory: 4GiB, sm_util: 0.25}]
xids:
  - {gpu: 0, at: 3m, xid: 79}
"""


class _Amd:
    """Another vendor's backend: one GPU at index 0, like the NVIDIA GPU beside it."""

    vendor: Vendor = "amd"
    source = "fakesmi"
    library = "FakeSMI"
    nvml: NvmlApi | None = None

    def __init__(self) -> None:
        self.gpu = GpuRef(0, "GPU-amd-0", "AMD Instinct MI300X", False, object(), vendor="amd")
        self.fail_open: str = ""
        self.events: list[list[ErrorEvent]] = []

    def open(self) -> None:
        if self.fail_open:
            raise OSError(self.fail_open)

    def close(self) -> None: ...

    def inventory(self, previous: Inventory | None) -> Inventory:
        return Inventory(driver_version="6.10.5", gpus=(self.gpu,), static={
            self.gpu.uuid: GpuStatic(pci_bus_id="0000:0c:00.0", vendor="amd",
                                     memory_bytes=192 << 30)})

    def expected_devices(self, sysfs_root: str) -> list[str] | None:
        return ["0000:0c:00.0"]

    def telemetry(self, gpu: GpuRef, tally: Tally) -> Telemetry:
        assert gpu.vendor == "amd", "an NVIDIA GPU was read through the AMD backend"
        return Telemetry(power_watts=550.0, energy_joules=10.0, utilization=0.75)

    def reliability(self, gpu: GpuRef, tally: Tally) -> Reliability:
        assert gpu.vendor == "amd"
        return Reliability(ecc_corrected=2, ras_errors=(
            RasErrorCount("umc", "uncorrectable", 1), RasErrorCount("gfx", "correctable", 7)))

    def partition_memory(self, partition: MigRef, tally: Tally) -> MemoryUsage | None:
        return None

    def process_reader(self) -> ProcessReader:
        return _AmdProcesses()

    def virtual_functions(self, gpu: GpuRef, tally: Tally) -> list[VirtualFunction]:
        assert gpu.vendor == "amd"
        return []

    def partition_utilization(self, partition: MigRef, tally: Tally) -> float | None:
        return None

    def interconnect(self, gpu: GpuRef, tally: Tally) -> Interconnect:
        return Interconnect()

    def guest_licences(self, gpu: GpuRef, tally: Tally) -> list[GuestLicence]:
        assert gpu.vendor == "amd"
        return []

    def error_events(self) -> EventSource:
        return _Events(self.events)


class _AmdProcesses:
    def read(self, gpu: GpuRef, partitions: Sequence[MigRef], tally: Tally
             ) -> list[ProcessSample]:
        assert gpu.vendor == "amd" and all(p.parent.vendor == "amd" for p in partitions)
        return [ProcessSample(4242, gpu.uuid, "", 8 << 30, 0.5)]


class _Events:
    def __init__(self, queue: list[list[ErrorEvent]]) -> None:
        self.queue = queue
        self.registered: list[str] = []

    def register(self, gpus: Sequence[GpuRef]) -> None:
        self.registered += [g.uuid for g in gpus]

    def wait(self, timeout_ms: int) -> list[ErrorEvent] | None:
        return self.queue.pop(0) if self.queue else None

    def close(self) -> None: ...


def _node(amd: _Amd) -> tuple[Sampler, ManualClock]:
    clock = ManualClock(T0 + 120)
    nvml = SimNVML(loads_scenario(NVIDIA_NODE, "node.yaml"), clock=clock, start=T0)
    specs = [s for s in REGISTRY if s.name != "attribution"]
    backends = Backends([NvmlBackend(nvml.as_api()), amd])
    return Sampler(backends, ExporterOptions(node="node-a"), specs, clock=clock,
                   threaded=False), clock


def test_two_vendors_one_exposition() -> None:
    amd = _Amd()
    sampler, _ = _node(amd)
    body = sampler.cycle().body(False, False)
    assert sorted(values(body, "gpu_up")) == [1, 1]
    assert values(body, "gpu_power_watts", vendor="amd") == [550.0]
    assert values(body, "gpu_power_watts", vendor="nvidia", model="NVIDIA L4")
    # each GPU's gpu_info carries its own vendor's driver; CUDA only on the NVIDIA one
    assert values(body, "gpu_info", vendor="amd", driver_version="6.10.5")
    assert not values(body, "gpu_info", vendor="amd", cuda_version="12.4")
    assert values(body, "gpu_info", vendor="nvidia", driver_version="550.54.15",
                  cuda_version="12.4")
    # NVIDIA-only collectors read only the NVIDIA GPU (the AMD handle never reaches NVML)
    for name in ("clocks", "nvlink", "gpm", "throughput", "device", "ecc", "xid", "vgpu"):
        assert values(body, "gpu_exporter_collector_success", collector=name) == [1], name
    assert not values(body, "gpu_clock_event_active", vendor="amd")
    assert values(body, "gpu_clock_event_active", vendor="nvidia")
    assert values(body, "gpu_exporter_source_up", source="nvml") == [1]
    assert values(body, "gpu_exporter_source_up", source="fakesmi") == [1]
    assert values(body, "gpu_answering_devices") == [2]
    assert values(body, "gpu_ras_errors_total", vendor="amd", block="umc",
                  type="uncorrectable") == [1]
    assert values(body, "gpu_ras_errors_total", block="gfx", type="correctable") == [7]
    sampler.close()


def test_one_backend_down_leaves_the_other_vendor_up() -> None:
    amd = _Amd()
    amd.fail_open = "libfakesmi.so: cannot open shared object file"
    sampler, clock = _node(amd)
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="fakesmi") == [0]
    assert values(body, "gpu_exporter_source_error_info", source="fakesmi",
                  reason="FakeSMI init failed: libfakesmi.so: cannot open shared object file")
    assert values(body, "gpu_up", vendor="nvidia") == [1] and not values(body, "gpu_up",
                                                                         vendor="amd")
    assert sampler.health() == (True, "ok")  # NVML answers: the exporter is alive
    amd.fail_open = ""
    clock.now += 5  # past the first retry backoff (1 s)
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="fakesmi") == [1]
    assert values(body, "gpu_up", vendor="amd") == [1]
    sampler.close()


def test_every_backend_down_is_unhealthy_with_each_reason() -> None:
    amd = _Amd()
    amd.fail_open = "no amd"
    clock = ManualClock(T0)
    nvml = SimNVML(loads_scenario(NVIDIA_NODE, "node.yaml"), clock=clock, start=T0)
    nvml.nvmlInit = _raise  # type: ignore[method-assign]
    sampler = Sampler(Backends([NvmlBackend(nvml.as_api()), amd]), ExporterOptions(node="n"),
                      [], clock=clock, threaded=False)
    sampler.cycle()
    ok, reason = sampler.health()
    assert not ok and "NVML init failed: driver not loaded" in reason and "no amd" in reason


def _raise() -> None:
    raise OSError("driver not loaded")


def test_processes_go_to_their_vendor() -> None:
    sampler, _ = _node(_Amd())
    sampler.cycle()
    by_vendor = {g.vendor: g for inv in sampler.inventories() for g in inv.gpus}
    reader = sampler.backend.process_reader()
    assert reader.read(by_vendor["amd"], [], Tally()) == [
        ProcessSample(4242, "GPU-amd-0", "", 8 << 30, 0.5)]
    assert [p.memory_bytes for p in reader.read(by_vendor["nvidia"], [], Tally())] == [4 << 30]
    sampler.close()


def test_error_events_of_both_vendors() -> None:
    """An NVIDIA XID and an AMD AFID event in one cycle: the XID is in gpu_xid_errors_total,
    the AFID in gpu_error_events_total with its kind and severity (never counted as an XID)."""
    amd = _Amd()
    amd.events.append([ErrorEvent("GPU-amd-0", 0x1234, kind="afid", severity="fatal")])
    sampler, clock = _node(amd)
    sampler.cycle()  # registers both vendors' GPUs; the AFID comes in this cycle
    clock.now += 120  # past the XID at 3m
    body = sampler.cycle().body(False, False)
    assert values(body, "gpu_xid_errors_total", vendor="nvidia", xid="79") == [1]
    assert not values(body, "gpu_xid_errors_total", vendor="amd")
    assert values(body, "gpu_error_events_total", vendor="amd", kind="afid", code="4660",
                  error_severity="fatal") == [1]
    assert values(body, "gpu_error_event_last_timestamp_seconds", vendor="amd", kind="afid",
                  code="4660", error_severity="fatal") == [T0 + 120]
    sampler.close()


def test_backends_refuse_two_of_one_vendor() -> None:
    with pytest.raises(ValueError, match="two amd backends"):
        Backends([_Amd(), _Amd()])


@pytest.mark.parametrize(("text", "names"), [
    ("auto", ("auto",)), ("nvml", ("nvml",)), ("nvml, intel", ("nvml", "intel")),
    ("amd,amd", ("amd",))])
def test_choice_parses(text: str, names: tuple[str, ...]) -> None:
    assert parse_choice(text) == names


@pytest.mark.parametrize("text", ["", "cuda", "auto,nvml", "nvml,,rocm"])
def test_bad_choice_is_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_backends(text, LoadSpec())
    assert "\n" not in str(err.value) and str(err.value).startswith("--device-backend: expected")


def test_auto_runs_what_answers_and_names_what_is_absent(
        tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    """No AMD or Intel backend in this build: auto runs the simulated NVML and logs one line
    for each absent one; named explicitly, an absent backend is a one-line error."""
    path = f"{tmp_path}/node.yaml"
    with open(path, "w") as f:
        f.write(NVIDIA_NODE)
    spec = LoadSpec(nvml=f"sim:{path}")
    with caplog.at_level(logging.INFO, logger="exporter.device.registry"):
        backends = load_backends("auto", spec)
    assert [b.vendor for b in backends] == ["nvidia"]
    absent = [r.getMessage() for r in caplog.records if "absent" in r.getMessage()]
    if len(absent) == 2:  # neither vendor module exists yet in this build
        assert all("\n" not in m for m in absent)
    with pytest.raises(ConfigError) as err:
        load_backends("nvml,amd", spec)
    assert "\n" not in str(err.value) and str(err.value).startswith("--device-backend amd: ")


def test_auto_without_any_backend_keeps_nvml_retrying(tmp_path: object) -> None:
    """A node where nothing answers (no driver yet, no GPU function in sysfs) runs NVML, which
    reports itself down and retries, as before backends were chosen."""
    spec = LoadSpec(nvml="real", sysfs_root=f"{tmp_path}/no-sys")
    backends = load_backends("auto", spec)
    assert [b.source for b in backends] == ["nvml"]


def test_without_pynvml_every_path_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: object) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now fails
    spec = LoadSpec(nvml="real", sysfs_root=f"{tmp_path}/no-sys")
    with pytest.raises(ConfigError) as err:
        load_backends("auto", spec)
    assert str(err.value).startswith("--device-backend auto: no device backend on this node "
                                     "(pynvml is not installed")
    with pytest.raises(ConfigError) as err:
        load_backends("nvml", spec)
    assert str(err.value).startswith("--device-backend nvml: pynvml is not installed")
