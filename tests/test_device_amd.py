"""The AMD backend (exporter/device/amd.py) through the device contract, over the simulated
amdsmi (gpusim/amdsmi_sim.py): an MI300X node in CPX/NPS4 and an MxGPU host; units normalised
in the backend; errors classified as amdsmi raises them; the library missing is one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exporter.collectors import REGISTRY
from exporter.core import ExporterOptions
from exporter.device.amd import AmdBackend, amd_gpu_functions
from exporter.device.amd_processes import partition_busy
from exporter.device.amdsmiapi import AmdSmiApi, AmdSmiUnavailable, load_amdsmi
from exporter.device.contract import DeviceBackend, DeviceLost, Tally
from exporter.sampler import Sampler
from gpusim.amdsmi_sim import (
    ENERGY_RESOLUTION_UJ,
    SimAmdProcess,
    SimAmdSmi,
    SimAmdVf,
    mi300x_cpx_nps4,
    mxgpu_host,
)
from gpusim.cluster import ManualClock
from tests.exporter_helpers import values

ROOT = Path(__file__).parent.parent
T0 = 1_790_000_000.0
GIB = 1 << 30


class NsClock:
    """The process reader's monotonic clock, driven by the simulation's seconds."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def __call__(self) -> int:
        return int(self.clock.now * 1e9)


def _cpx(clock: ManualClock, processes: list[SimAmdProcess] | None = None
         ) -> tuple[AmdBackend, SimAmdSmi]:
    sim = mi300x_cpx_nps4(processes=processes or [], clock=clock, start=T0)
    backend = AmdBackend(sim.as_api(), clock_ns=NsClock(clock))
    backend.open()
    return backend, sim


def test_cpx_nps4_node_is_8_gpus_of_8_partitions_priced_as_eighths() -> None:
    backend, sim = _cpx(ManualClock(T0 + 60))
    inv = backend.inventory(None)
    assert len(sim.amdsmi_get_processor_handles()) == 64  # amdsmi: one handle per partition
    assert len(inv.gpus) == 8 and len(inv.migs) == 64
    gpu = inv.gpus[0]
    st = inv.static[gpu.uuid]
    assert (st.vendor, st.pci_bdf, st.mig_mode, st.virtualization_mode) == \
        ("amd", "0000:0c:00.0", "enabled", "none")
    assert st.memory_bytes == 192 * GIB  # eight 24 GiB shares
    assert gpu.model == "AMD Instinct MI300X" and gpu.mig_enabled
    parts = [m for m in inv.migs if m.parent == gpu]
    assert {(m.kind, m.profile, m.slices, m.parent_slices) for m in parts} == \
        {("amd_partition", "cpx_nps4", 1, 8)}
    assert [m.gpu_instance_id for m in parts] == list(range(8))
    # the render node each partition is named by (device plugin amdgpu_xcp_N, DRA gpu-c-r)
    assert [m.compute_instance_id for m in parts] == list(range(128, 136))
    assert len({m.uuid for m in inv.migs} | {g.uuid for g in inv.gpus}) == 64 + 8
    assert inv.driver_version == "6.10.5"


def test_units_are_normalised_from_amdsmi_units() -> None:
    clock = ManualClock(T0 + 1000)
    backend, sim = _cpx(clock, [SimAmdProcess(100, gpu=0, partition=0, vram_bytes=3 * GIB,
                                              gfx_busy=0.8)])
    gpu = backend.inventory(None).gpus[0]
    tally = Tally()
    t = backend.telemetry(gpu, tally)
    assert tally.failures == 0  # MI300's missing edge sensor is absent, not a failure
    raw = sim.amdsmi_get_energy_count(gpu.handle.primary)
    joules = raw["energy_accumulator"] * raw["counter_resolution"] / 1e6  # µJ -> J
    assert t.energy_joules == pytest.approx(joules)
    assert t.energy_joules == pytest.approx(350.0 * 1000, rel=1e-3)  # 350 W for 1000 s
    assert raw["counter_resolution"] == ENERGY_RESOLUTION_UJ
    assert (t.power_watts, t.power_limit_watts) == (350.0, 750.0)
    assert t.temperature_celsius == 52 and t.memory_temperature_celsius == 44
    assert t.sm_clock_hertz == 2100e6 and t.memory_clock_hertz == 1300e6
    # device-wide activity, reported on partition 0: one of eight partitions 80 % busy
    assert t.utilization == pytest.approx(0.10) and t.memory_utilization == pytest.approx(0.04)
    assert t.memory is not None
    assert (t.memory.total_bytes, t.memory.used_bytes) == (192 * GIB, 3 * GIB)
    part = backend.inventory(None).migs[0]
    mem = backend.partition_memory(part, tally)
    assert mem is not None and (mem.total_bytes, mem.used_bytes) == (24 * GIB, 3 * GIB)


def test_per_process_gfx_share_gives_per_partition_usage() -> None:
    clock = ManualClock(T0 + 100)
    procs = [SimAmdProcess(100, gpu=1, partition=3, vram_bytes=2 * GIB, gfx_busy=0.5),
             SimAmdProcess(101, gpu=1, partition=3, vram_bytes=GIB, gfx_busy=0.25),
             SimAmdProcess(200, gpu=1, partition=6, vram_bytes=GIB, gfx_busy=1.0)]
    backend, sim = _cpx(clock, procs)
    inv = backend.inventory(None)
    gpu = inv.gpus[1]
    reader = backend.process_reader()
    first = reader.read(gpu, inv.migs, Tally())
    assert all(s.sm_util is None for s in first)  # a counter needs two reads
    clock.now += 30
    samples = reader.read(gpu, inv.migs, Tally())
    parts = {m.gpu_instance_id: m.uuid for m in inv.migs if m.parent == gpu}
    got = {(s.pid, s.mig_uuid, s.memory_bytes): s.sm_util for s in samples}
    assert got == {(100, parts[3], 2 * GIB): pytest.approx(0.5),
                   (101, parts[3], GIB): pytest.approx(0.25),
                   (200, parts[6], GIB): pytest.approx(1.0)}
    assert partition_busy(samples) == {parts[3]: pytest.approx(0.75),
                                       parts[6]: pytest.approx(1.0)}
    # amdsmi's own view: activity only on partition 0, "N/A" on the others
    handles = gpu.handle.members
    assert sim.amdsmi_get_gpu_activity(handles[3])["gfx_activity"] == "N/A"


def test_errors_and_retired_pages() -> None:
    clock = ManualClock(T0 + 10)
    backend, sim = _cpx(clock)
    sim.gpus[2].ecc_correctable, sim.gpus[2].ecc_uncorrectable = 7, 1
    sim.gpus[2].bad_pages = ["RESERVED", "RESERVED", "PENDING"]
    sim.gpus[2].pcie_replays = 4
    sim.gpus[2].ras = {"UMC": (7, 1, 2), "XGMI_WAFL": (3, 0, 0)}
    gpu = backend.inventory(None).gpus[2]
    rel = backend.reliability(gpu, Tally())
    assert sorted((e.block, e.severity, e.count) for e in rel.ras_errors) == [
        ("umc", "correctable", 7), ("umc", "deferred", 2), ("umc", "uncorrectable", 1),
        ("xgmi_wafl", "correctable", 3), ("xgmi_wafl", "deferred", 0),
        ("xgmi_wafl", "uncorrectable", 0)]  # disabled blocks are not read
    assert (rel.ecc_corrected, rel.ecc_uncorrected, rel.pcie_replays) == (7, 1, 4)
    assert rel.row_remapping is not None
    assert (rel.row_remapping.uncorrectable, rel.row_remapping.pending,
            rel.row_remapping.failed) == (2, True, False)
    link = backend.interconnect(gpu, Tally())
    # 7 links; the eighth reads N/A (not supported): no counter. read is rx, write tx.
    assert [(x.link_type, x.link) for x in link.links] == [("xgmi", i) for i in range(7)]
    assert link.links[0].rx_bytes == 10_000 * 1024 and link.links[0].tx_bytes == 70_000 * 1024
    assert (link.pcie_tx_bytes, link.pcie_rx_bytes) == (None, None)  # no directional counter
    assert link.timestamp_seconds is not None


def test_a_lost_gpu_raises_device_lost_and_keeps_its_identity() -> None:
    clock = ManualClock(T0 + 10)
    backend, sim = _cpx(clock)
    inv = backend.inventory(None)
    sim.gpus[5].lost = True
    with pytest.raises(DeviceLost):
        backend.telemetry(inv.gpus[5], Tally())
    again = backend.inventory(inv)
    # every GPU keeps its index: GPU 6 does not become GPU 5 when GPU 5 drops out
    assert sorted((g.index, g.uuid) for g in again.gpus) == \
        sorted((g.index, g.uuid) for g in inv.gpus)
    assert len(again.migs) == 64


def test_unexpected_status_is_a_counted_failure() -> None:
    clock = ManualClock(T0 + 10)
    backend, sim = _cpx(clock)
    gpu = backend.inventory(None).gpus[0]

    def busy(h: object) -> dict[str, object]:
        raise sim.AmdSmiLibraryException(30)  # AMDSMI_STATUS_BUSY

    sim.amdsmi_get_power_info = busy  # type: ignore[method-assign]
    sim.amdsmi_get_power_cap_info = busy  # type: ignore[method-assign]
    tally = Tally()
    t = backend.telemetry(gpu, tally)
    assert t.power_watts is None and t.power_limit_watts is None
    assert tally.failures == 2
    assert t.temperature_celsius == 52  # the rest of the reading stands


def test_mxgpu_host_lists_vfs_as_sriov_virtual_functions() -> None:
    vfs = [SimAmdVf(fb_mb=49_152, guest_fb_usage_mb=10_240, vm="vm-a"),
           SimAmdVf(fb_mb=49_152), SimAmdVf(fb_mb=98_304, guest_fb_usage_mb=1024, vm="vm-b")]
    sim = mxgpu_host(gpus=2, vfs=vfs, clock=ManualClock(T0), start=T0)
    backend = AmdBackend(sim.as_api())
    backend.open()
    inv = backend.inventory(None)
    assert [inv.static[g.uuid].virtualization_mode for g in inv.gpus] == ["host", "host"]
    assert not inv.migs
    got = backend.virtual_functions(inv.gpus[1], Tally())
    assert [(v.id, v.kind, v.framebuffer_bytes, v.memory_used_bytes) for v in got] == [
        ("0000:45:02.0", "sriov_vf", 48 * GIB, 10 * GIB),
        ("0000:45:02.1", "sriov_vf", 48 * GIB, 0),
        ("0000:45:02.2", "sriov_vf", 96 * GIB, GIB)]
    assert got[0].type_name == "MxGPU 48GB"
    # bare metal: no VFs, and asking is no failure
    bare, _ = _cpx(ManualClock(T0 + 1))
    tally = Tally()
    assert bare.virtual_functions(bare.inventory(None).gpus[0], tally) == []
    assert tally.failures == 0


def test_expected_devices_are_amd_physical_functions(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    for name, vendor, klass, vf in [("0000:0c:00.0", "0x1002", "0x120000", False),  # MI300X
                                    ("0000:0c:02.0", "0x1002", "0x120000", True),  # its VF
                                    ("0000:2c:00.0", "0x10de", "0x030200", False),  # NVIDIA
                                    ("0000:03:00.0", "0x1002", "0x030000", False)]:  # Radeon
        d = devices / name
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
        if vf:
            (d / "physfn").symlink_to(devices / "0000:0c:00.0")
    assert amd_gpu_functions(str(tmp_path)) == ["0000:03:00.0", "0000:0c:00.0"]
    assert amd_gpu_functions(str(tmp_path / "absent")) is None


def test_the_amd_backend_plugs_into_the_sampler() -> None:
    """The vendor-neutral collectors read AMD through the contract alone."""
    clock = ManualClock(T0 + 500)
    backend, _ = _cpx(clock)
    typed: DeviceBackend = backend
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(typed, ExporterOptions(node="n"), specs, threaded=False)
    body = sampler.cycle().body(False, False)
    uuid = backend.inventory(None).gpus[0].uuid
    assert values(body, "gpu_exporter_source_up", source="amdsmi") == [1]
    assert values(body, "gpu_power_watts", uuid=uuid) == [350.0]
    assert values(body, "gpu_energy_joules_total", uuid=uuid) == \
        [pytest.approx(350.0 * 500, rel=1e-3)]
    for name in ("clocks", "nvlink", "gpm", "throughput"):  # NVIDIA-only ones quiet
        assert values(body, "gpu_exporter_collector_success", collector=name) == [1], name
    assert values(body, "gpu_info", uuid=uuid, pci_bus_id="0000:0c:00.0", mig_mode="enabled",
                  virtualization_mode="none") == [1]
    assert values(body, "gpu_mig_info", uuid=uuid, profile="cpx_nps4", slices="1",
                  parent_slices="8") == [1] * 8
    assert values(body, "gpu_mig_memory_total_bytes", uuid=uuid) == [24 * GIB] * 8
    assert values(body, "gpu_memory_total_bytes", uuid=uuid) == [192 * GIB]
    assert not values(body, "gpu_encoder_utilization_ratio")  # absent on AMD, not 0
    # XGMI: counters, so rates from the second cycle; the simulator's link i carries
    # 1000 x (i + 1) KB/s read (rx) and 1000 x (7 - i) KB/s written (tx): 28000 KB/s each way
    link = "gpu_link_throughput_bytes_per_second"
    assert not values(body, link)
    clock.now += 10
    body = sampler.cycle().body(False, False)
    for d in ("tx", "rx"):
        assert values(body, link, uuid=uuid, link_type="xgmi", direction=d) == \
            [pytest.approx(28_000 * 1024)]
    # PCIe: the driver's one-second estimate, one GPU per cycle at most (each read blocks 1 s):
    # GPU 0 read in the first cycle and given again, GPU 1 in the second, the others not yet
    pcie = "gpu_pcie_throughput_bytes_per_second"
    assert values(body, pcie, uuid=uuid, direction="rx") == [40_000_000 * 256]
    assert values(body, pcie, uuid=uuid, direction="tx") == [10_000_000 * 256]
    assert len(values(body, pcie, direction="rx")) == 2
    assert values(body, "gpu_exporter_collector_success", collector="throughput") == [1]


def test_simulator_satisfies_the_api_protocol() -> None:
    """Every member the backend may call exists on the simulator (mypy checks signatures)."""
    api: AmdSmiApi = mi300x_cpx_nps4(gpus=1).as_api()
    members = [n for n in dir(AmdSmiApi) if n.startswith(("amdsmi_", "AmdSmi"))]
    assert members and all(hasattr(api, n) for n in members)


def test_missing_amdsmi_package_is_one_line() -> None:
    with pytest.raises(AmdSmiUnavailable) as err:
        load_amdsmi("gpu_ledger_no_such_amdsmi")
    assert str(err.value).startswith("amdsmi: ") and "\n" not in str(err.value)


def test_missing_libamd_smi_so_is_one_line_without_the_wrappers_prints(tmp_path: Path
                                                                        ) -> None:
    """The real package prints the OSError and raises KeyError('libamd_smi.so') when the
    library is missing (amdsmi_wrapper.py); a stand-in package that does the same."""
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        import ctypes
        _libraries = {}
        try:
            _libraries['libamd_smi.so'] = ctypes.CDLL('/nonexistent/libamd_smi.so')
        except OSError as error:
            print(error)
            print("Unable to find amdsmi library try installing amd-smi-lib")
        amdsmi_init = _libraries['libamd_smi.so'].amdsmi_init
        """))
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from exporter.device.amdsmiapi import load_amdsmi, AmdSmiUnavailable\n"
            "try:\n    load_amdsmi()\nexcept AmdSmiUnavailable as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, check=True)
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("amdsmi: libamd_smi.so not found"), lines


def _amd_sysfs(root: Path) -> Path:
    dev = root / "bus" / "pci" / "devices" / "0000:0c:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (dev / "class").write_text("0x120000\n")
    return root


def _stand_in_amdsmi(root: Path) -> Path:
    """A package that behaves as the real amdsmi does without libamd_smi.so (amdsmi_wrapper.py:
    prints the OSError, then `_libraries['libamd_smi.so']` raises KeyError)."""
    pkg = root / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        import ctypes
        _libraries = {}
        try:
            _libraries['libamd_smi.so'] = ctypes.CDLL('/nonexistent/libamd_smi.so')
        except OSError as error:
            print(error)
            print("Unable to find amdsmi library try installing amd-smi-lib")
        amdsmi_init = _libraries['libamd_smi.so'].amdsmi_init
        """))
    return root


@pytest.mark.parametrize("stand_in", [False, True])
def test_doctor_on_an_amd_node_without_amdsmi_is_one_line(tmp_path: Path, stand_in: bool
                                                          ) -> None:
    sys_root = _amd_sysfs(tmp_path / "sys")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if stand_in:
        env["PYTHONPATH"] = str(_stand_in_amdsmi(tmp_path / "site"))
    scenario = ROOT / "gpusim" / "scenarios" / "h100-mig.yaml"
    code = "import sys; from gpu_ledger import cli; sys.exit(cli.main(sys.argv[1:]))"
    out = subprocess.run(
        [sys.executable, "-c", code, "doctor", "--nvml", f"sim:{scenario}",
         "--pod-resources-socket", str(tmp_path / "none.sock"), "--sys-root", str(sys_root),
         "--proc-root", str(tmp_path / "proc"), "--timeout", "1s"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert "Traceback" not in out.stdout + out.stderr
    amd = [line for line in out.stdout.splitlines() if "amdsmi" in line]
    want = "libamd_smi.so not found" if stand_in else "Python package not installed"
    assert len(amd) == 1 and amd[0].startswith("FAIL  amd ") and want in amd[0], amd
    assert "amdsmi init failed: amdsmi: " in amd[0]
    assert out.returncode == 1


def test_missing_amdsmi_fails_open_as_one_line_and_the_sampler_retries(
        caplog: pytest.LogCaptureFixture) -> None:
    """The exporter path: the backend imports amdsmi in open(); the sampler reports the
    source down with that one line and no traceback."""
    backend = AmdBackend(loader=lambda: load_amdsmi("gpu_ledger_no_such_amdsmi"))
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(backend, ExporterOptions(node="n"), specs, threaded=False)
    with caplog.at_level("WARNING"):
        body = sampler.cycle().body(False, False)
    assert values(body, "gpu_exporter_source_up", source="amdsmi") == [0]
    lines = [r.getMessage() for r in caplog.records if "amdsmi" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("amdsmi init failed: amdsmi: "), lines
    assert all(r.exc_info is None for r in caplog.records)


def test_mxgpu_vfs_reach_the_vgpu_families() -> None:
    sim = mxgpu_host(gpus=1, vfs=[SimAmdVf(fb_mb=49_152, guest_fb_usage_mb=2048, vm="vm-a")],
                     clock=ManualClock(T0 + 5), start=T0)
    backend = AmdBackend(sim.as_api())
    specs = [s for s in REGISTRY if s.name != "attribution"]
    body = Sampler(backend, ExporterOptions(node="n"), specs, threaded=False) \
        .cycle().body(False, False)
    assert values(body, "gpu_vgpu_framebuffer_bytes", vgpu_uuid="0000:05:02.0") == [48 * GIB]
    assert values(body, "gpu_vgpu_memory_used_bytes", vgpu_uuid="0000:05:02.0") == [2 * GIB]


def test_loader_gives_the_amd_backend() -> None:
    from exporter.errors import ConfigError
    from exporter.nvml_loader import load_amd_backend

    sim = load_amd_backend("sim:mi300x-cpx-nps4", clock=ManualClock(T0))
    sim.open()
    assert sim.vendor == "amd" and len(sim.inventory(None).migs) == 64
    host = load_amd_backend("sim:mxgpu-host", clock=ManualClock(T0))
    host.open()
    gpu = host.inventory(None).gpus[0]
    assert len(host.virtual_functions(gpu, Tally())) == 4
    real = load_amd_backend("real")
    assert isinstance(real, AmdBackend) and real.nvml is None  # amdsmi not imported yet
    with pytest.raises(ConfigError, match="mi300x-cpx-nps4"):
        load_amd_backend("sim:nope")


def test_probe_is_present_with_amd_gpus_in_sysfs_and_never_imports_amdsmi(tmp_path: Path
                                                                           ) -> None:
    from exporter.device.amd import probe
    from exporter.device.registry import BackendAbsent, LoadSpec

    with pytest.raises(BackendAbsent, match="no AMD GPU"):
        probe(LoadSpec(sysfs_root=str(tmp_path / "empty")), True)
    found = probe(LoadSpec(sysfs_root=str(_amd_sysfs(tmp_path / "sys"))), True)
    assert isinstance(found, AmdBackend) and "amdsmi" not in sys.modules
    with pytest.raises(BackendAbsent, match="no AMD GPU"):  # named and absent: an error
        probe(LoadSpec(sysfs_root=str(tmp_path / "empty")), False)


def test_a_node_with_nvidia_and_amd_gpus_reads_both() -> None:
    from exporter.device.registry import LoadSpec, load_backends

    scenario = ROOT / "gpusim" / "scenarios" / "mixed.yaml"
    backends = load_backends("nvml,amd", LoadSpec(
        nvml=f"sim:{scenario}", amdsmi="sim:mi300x-cpx-nps4", clock=ManualClock(T0 + 60)))
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(backends, ExporterOptions(node="n"), specs, threaded=False)
    try:
        body = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(body, "gpu_exporter_source_up", source="amdsmi") == [1]
    assert values(body, "gpu_exporter_source_up", source="nvml") == [1]
    assert len(values(body, "gpu_up", vendor="amd")) == 8
    assert values(body, "gpu_up", vendor="nvidia")
    assert len(values(body, "gpu_mig_info", vendor="amd", profile="cpx_nps4")) == 64


def test_exporter_without_amdsmi_logs_one_line_and_serves_the_rest(tmp_path: Path) -> None:
    """`gpu-ledger exporter` on a node whose sysfs has an AMD GPU but no amdsmi: the AMD
    source is down with a one-line reason, NVIDIA's GPUs are served, no traceback."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    scenario = ROOT / "gpusim" / "scenarios" / "mixed.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_ledger.cli", "exporter", "--nvml", f"sim:{scenario}",
         "--device-backend", "auto", "--sysfs-root", str(_amd_sysfs(tmp_path / "sys")),
         "--web.listen-address", f"127.0.0.1:{port}", "--interval", "1s", "--no-kubernetes",
         "--pod-resources-socket", str(tmp_path / "absent.sock"), "--node-name", "n1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert 'gpu_exporter_source_up{source="amdsmi"} 0' in text
    assert 'gpu_exporter_source_up{source="nvml"} 1' in text
    assert "Traceback" not in err
    # lines about amdsmi (the tmp path in other backends' lines also spells "amdsmi")
    amd = [line for line in err.splitlines() if "amdsmi" in line.replace(str(tmp_path), "")]
    assert amd and all("amdsmi init failed: amdsmi: Python package not installed" in line
                       for line in amd), amd


def test_ras_events_carry_their_afids_and_skip_what_came_before() -> None:
    clock = ManualClock(T0 + 10)
    sim = mi300x_cpx_nps4(gpus=2, clock=clock, start=T0)
    sim.gpus[1].cper = [("fatal", [99])] * 25  # before the exporter: more than one read
    backend = AmdBackend(sim.as_api(), event_interval=0)
    backend.open()
    inv = backend.inventory(None)
    events = backend.error_events()
    events.register(list(inv.gpus))
    assert events.wait(0) is None  # history is not counted
    sim.gpus[1].cper += [("fatal", [17, 30]), ("non_fatal_corrected", [])]
    sim.gpus[0].cper += [("non_fatal_uncorrected", [5])]
    got = events.wait(0)
    assert got is not None
    assert sorted((e.uuid, e.kind, e.code, e.severity) for e in got) == sorted([
        (inv.gpus[1].uuid, "afid", 17, "fatal"), (inv.gpus[1].uuid, "afid", 30, "fatal"),
        (inv.gpus[1].uuid, "ras", 0, "correctable"),
        (inv.gpus[0].uuid, "afid", 5, "uncorrectable")])
    assert events.wait(0) is None  # each record once
    events.close()


def test_ras_events_reach_gpu_error_events_total() -> None:
    clock = ManualClock(T0 + 10)
    sim = mi300x_cpx_nps4(gpus=1, clock=clock, start=T0)
    backend = AmdBackend(sim.as_api(), event_interval=0)
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(backend, ExporterOptions(node="n"), specs, threaded=False)
    try:
        sampler.cycle()
        sim.gpus[0].cper.append(("fatal", [17]))
        body = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(body, "gpu_error_events_total", kind="afid", code="17",
                  error_severity="fatal") == [1]
    assert not values(body, "gpu_xid_errors_total")


# The MxGPU host library's Python package (amd/MxGPU-Virtualization smi-lib/py/interface,
# __init__.py at 695afe2) lacks these functions of ROCm's, which the backend also calls.
NOT_ON_THE_HOST = {"amdsmi_get_energy_count", "amdsmi_get_gpu_compute_partition",
                   "amdsmi_get_gpu_kfd_info", "amdsmi_get_gpu_metrics_info",
                   "amdsmi_get_gpu_pci_replay_counter", "amdsmi_get_gpu_process_list",
                   "amdsmi_get_gpu_vram_usage", "amdsmi_get_gpu_enumeration_info",
                   "amdsmi_get_gpu_virtualization_mode", "amdsmi_get_gpu_cper_entries",
                   "amdsmi_get_afids_from_cper", "amdsmi_get_gpu_memory_partition",
                   "amdsmi_get_gpu_ras_block_features_enabled"}


class _HostFlavour:
    """The simulator with only the host library's functions, as a module would be."""

    def __init__(self, sim: SimAmdSmi) -> None:
        self._sim = sim

    def __getattr__(self, name: str) -> object:
        if name in NOT_ON_THE_HOST:
            raise AttributeError(name)
        return getattr(self._sim, name)


def test_a_function_the_library_flavour_lacks_is_absent_not_a_failure() -> None:
    from exporter.device.amdsmiapi import Flavour

    sim = mxgpu_host(gpus=1, vfs=[SimAmdVf(fb_mb=49_152, guest_fb_usage_mb=1024, vm="a")],
                     clock=ManualClock(T0 + 5), start=T0)
    api: AmdSmiApi = Flavour(_HostFlavour(sim))  # type: ignore[assignment]
    backend = AmdBackend(api)
    backend.open()
    inv = backend.inventory(None)
    gpu = inv.gpus[0]
    tally = Tally()
    t = backend.telemetry(gpu, tally)
    assert tally.failures == 0
    assert t.energy_joules is None and t.memory is None  # the host library has neither
    assert t.power_watts == 350.0 and t.temperature_celsius == 52
    procs = backend.process_reader().read(gpu, inv.migs, tally)
    assert procs == [] and tally.failures == 0
    # without the mode call the VFs are still asked for, and the host library answers
    assert [v.id for v in backend.virtual_functions(gpu, tally)] == ["0000:05:02.0"]
    events = backend.error_events()
    events.register(list(inv.gpus))
    assert events.wait(0) is None
    with pytest.raises(AttributeError):
        Flavour(object()).amdsmi_init()  # not an amdsmi module: no pretending


def test_without_amdsmi_process_list_processes_come_from_drm_fdinfo(tmp_path: Path) -> None:
    """The host package has no process list: the backend falls back to DRM fdinfo
    (exporter/device/fdinfo.py) for the GPU's PCI address, in the kernel's amdgpu format."""
    import os

    from exporter.device.amdsmiapi import Flavour

    proc = tmp_path / "proc"
    for pid, pdev, vram_kib in ((4242, "0000:05:00.0", 2048), (4343, "0000:99:00.0", 1024),
                                (4444, "0000:0c:00.0", 512)):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fdinfo").mkdir(parents=True)
        os.symlink("/dev/dri/renderD128", proc / str(pid) / "fd" / "5")
        (proc / str(pid) / "fdinfo" / "5").write_text(
            f"pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t{pdev}\n"
            f"drm-client-id:\t{pid}\ndrm-memory-vram:\t{vram_kib} KiB\n"
            "drm-engine-gfx:\t1000 ns\n")
    sim = mxgpu_host(gpus=1, clock=ManualClock(T0 + 5), start=T0)
    api: AmdSmiApi = Flavour(_HostFlavour(sim))  # type: ignore[assignment]
    backend = AmdBackend(api, proc_root=str(proc))
    backend.open()
    inv = backend.inventory(None)
    tally = Tally()
    got = backend.process_reader().read(inv.gpus[0], inv.migs, tally)
    assert [(p.pid, p.uuid, p.memory_bytes) for p in got] == [(4242, inv.gpus[0].uuid,
                                                                2048 * 1024)]
    assert tally.failures == 0
    # where amdsmi lists processes (none here), fdinfo is not read: pid 4444 is not taken
    cpx = AmdBackend(mi300x_cpx_nps4(gpus=1, clock=ManualClock(T0 + 5), start=T0).as_api(),
                     proc_root=str(proc))
    cpx.open()
    inv = cpx.inventory(None)
    assert cpx.process_reader().read(inv.gpus[0], inv.migs, Tally()) == []


def test_pcie_estimate_is_the_drivers_messages_times_payload_read_sparingly() -> None:
    """amdsmi_get_gpu_pci_throughput blocks one second in the driver: one GPU at most every
    `pcie_spacing`, each GPU at most every `pcie_period`, the last estimate given in between.
    Its keys are swapped against the driver's pcie_bw (rocm_smi parses "<received> <sent>"
    into sent, received): rx is the `sent` key."""
    clock = ManualClock(T0 + 10)
    sim = mi300x_cpx_nps4(gpus=2, clock=clock, start=T0)
    sim.gpus[1].pcie_rx_msgs, sim.gpus[1].pcie_tx_msgs, sim.gpus[1].pcie_mps = 1000, 3000, 512
    backend = AmdBackend(sim.as_api(), clock_ns=NsClock(clock), pcie_period=60,
                         pcie_spacing=5)
    backend.open()
    g0, g1 = backend.inventory(None).gpus
    first = backend.interconnect(g0, Tally())
    assert (first.pcie_rx_bytes_per_second, first.pcie_tx_bytes_per_second) == \
        (40_000_000 * 256, 10_000_000 * 256)
    assert backend.interconnect(g1, Tally()).pcie_rx_bytes_per_second is None  # spacing
    assert sim.pci_throughput_calls == 1
    clock.now += 5
    assert backend.interconnect(g0, Tally()).pcie_rx_bytes_per_second == 40_000_000 * 256
    second = backend.interconnect(g1, Tally())
    assert (second.pcie_rx_bytes_per_second, second.pcie_tx_bytes_per_second) == \
        (1000 * 512, 3000 * 512)
    assert sim.pci_throughput_calls == 2  # GPU 0's estimate was given again, not read
    sim.gpus[0].pcie_rx_msgs = 0
    clock.now += 56  # 61 s after GPU 0's reading: due again
    assert backend.interconnect(g0, Tally()).pcie_rx_bytes_per_second == 0
    assert sim.pci_throughput_calls == 3


def test_pcie_estimate_absent_where_the_library_has_none() -> None:
    """The MxGPU host package (and an APU's driver) has no pcie_bw: absent, not 0."""
    clock = ManualClock(T0 + 10)
    sim = mi300x_cpx_nps4(gpus=1, clock=clock, start=T0)

    def unsupported(handle: object) -> dict[str, object]:
        raise sim.AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED

    sim.amdsmi_get_gpu_pci_throughput = unsupported  # type: ignore[method-assign]
    backend = AmdBackend(sim.as_api(), clock_ns=NsClock(clock))
    backend.open()
    tally = Tally()
    link = backend.interconnect(backend.inventory(None).gpus[0], tally)
    assert (link.pcie_tx_bytes_per_second, link.pcie_rx_bytes_per_second) == (None, None)
    assert tally.failures == 0
