"""The Intel backend over sysfs trees in the kernel's layout and formats (gpusim/intel_sysfs.py):
an xe Data Center GPU Flex with SR-IOV VFs, and an i915 integrated GPU that is a GVT-g host."""

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exporter.collectors import REGISTRY
from exporter.core import ExporterOptions
from exporter.device.contract import DeviceBackend, DeviceLost, MemoryUsage, Tally
from exporter.device.intel import IntelBackend, probe
from exporter.device.intel_sysfs import gvt_share, intel_cards, mdev_types, read_int
from exporter.device.registry import BackendAbsent, LoadSpec
from exporter.sampler import Sampler
from gpusim.intel_sysfs import GVT_MDEVS, IntelGpu, flex_host, gvt_host, write_gpu
from gpusim.levelzero import ZES_MEM_LOC_SYSTEM, SimZes, SimZesDevice, SimZesMemory
from tests.exporter_helpers import values
from tests.test_exporter_cli import SCENARIO, free_port
from tests.test_fdinfo import ARC, Proc, xe

GiB = 1 << 30
FLEX = "0000:4d:00.0"
IGPU = "0000:00:02.0"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def backend(root: Path, clock: Clock | None = None) -> IntelBackend:
    (root / "proc").mkdir(exist_ok=True)  # no DRM clients
    b = IntelBackend(sysfs_root=str(root), proc_root=str(root / "proc"), clock=clock or Clock())
    b.open()
    return b


def test_is_a_device_backend() -> None:
    b: DeviceBackend = IntelBackend()  # mypy checks the Protocol; this checks the names
    assert (b.vendor, b.source, b.nvml) == ("intel", "intel", None)


def test_files_are_written_as_the_kernel_writes_them(tmp_path: Path) -> None:
    flex_host(str(tmp_path))
    hwmon = tmp_path / "devices/pci0000:00" / FLEX / "hwmon/hwmon2"
    assert (hwmon / "energy1_input").read_bytes() == b"1234000000\n"
    # class/drm/card0 -> ../../devices/.../drm/card0, and card0/device -> ../../../<bdf>
    assert os.readlink(tmp_path / "class/drm/card0") == \
        f"../../devices/pci0000:00/{FLEX}/drm/card0"
    assert os.readlink(tmp_path / "devices/pci0000:00" / FLEX / "drm/card0/device") == \
        f"../../../{FLEX}"
    assert os.readlink(tmp_path / "devices/pci0000:00" / FLEX / "virtfn0") == "../0000:4d:00.1"


def test_flex_inventory_vfs_are_not_devices(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=4)
    b = backend(tmp_path)
    inv = b.inventory(None)
    assert [(g.index, g.uuid, g.model) for g in inv.gpus] == [(0, FLEX, "Intel ATS-M150")]
    s = inv.static[FLEX]
    assert (s.vendor, s.pci_bdf, s.memory_bytes, s.virtualization_mode) == \
        ("intel", FLEX, 16 * GiB, "host")
    assert inv.driver_version == "xe"
    assert b.expected_devices(str(tmp_path)) == [FLEX]
    # the VFs bound to xe are cards 1..4 of their own, each with its PF
    cards = intel_cards(str(tmp_path)) or []
    assert [(c.card, c.bdf, c.physfn) for c in cards[1:]] == [
        (f"card{i}", f"0000:4d:00.{i}", FLEX) for i in range(1, 5)]


def test_flex_vfs_are_priced_as_an_even_share(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=4)
    b = backend(tmp_path)
    gpu = b.inventory(None).gpus[0]
    vfs = b.virtual_functions(gpu, Tally())
    assert [(v.id, v.kind, v.type_name, v.share) for v in vfs] == [
        (f"0000:4d:00.{i + 1}", "sriov_vf", f"VF{i}", 0.25) for i in range(4)]


def test_flex_telemetry_units(tmp_path: Path) -> None:
    flex_host(str(tmp_path))
    clock = Clock()
    b = backend(tmp_path, clock)
    gpu = b.inventory(None).gpus[0]
    t = b.telemetry(gpu, Tally())
    assert t.energy_joules == 1234.0  # energy1_input is µJ
    assert t.power_limit_watts == 150.0  # power1_max is µW
    assert t.temperature_celsius == 48.0  # temp2_input is m°C
    assert t.sm_clock_hertz == 2050e6  # tile0/gt0/freq0/act_freq is MHz
    assert t.power_watts is None  # no power file, one energy reading: no power yet
    # lending VFs: the VMs' work is in no fdinfo here, so no device utilisation
    assert t.utilization is None
    # no Level Zero: sysfs's VRAM, in use what the host's processes hold (none)
    assert t.memory == MemoryUsage(16 * GiB, 0.0, 16 * GiB)
    energy = tmp_path / "devices/pci0000:00" / FLEX / "hwmon/hwmon2/energy1_input"
    energy.write_text("1384000000\n")  # +150 J
    clock.now += 2.0
    assert b.telemetry(gpu, Tally()).power_watts == pytest.approx(75.0)
    energy.write_text("1000\n")  # the counter went back (driver reload): no power
    clock.now += 2.0
    assert b.telemetry(gpu, Tally()).power_watts is None


def test_power_file_wins_and_a_zero_limit_is_no_limit(tmp_path: Path) -> None:
    flex_host(str(tmp_path))
    hwmon = tmp_path / "devices/pci0000:00" / FLEX / "hwmon/hwmon2"
    (hwmon / "power1_average").write_text("87500000\n")
    (hwmon / "power1_max").write_text("0\n")
    b = backend(tmp_path)
    t = b.telemetry(b.inventory(None).gpus[0], Tally())
    assert (t.power_watts, t.power_limit_watts) == (87.5, None)


def test_gvt_host_inventory_and_mdevs(tmp_path: Path) -> None:
    gvt_host(str(tmp_path))
    b = backend(tmp_path)
    inv = b.inventory(None)
    gpu = inv.gpus[0]
    assert (gpu.uuid, gpu.model) == (IGPU, "Intel GPU 0x3e92")
    s = inv.static[IGPU]
    assert (s.virtualization_mode, s.memory_bytes) == ("host", None)
    vfs = b.virtual_functions(gpu, Tally())
    assert sorted((v.id, v.kind, v.type_name, v.share) for v in vfs) == sorted(
        (u, "mdev", f"i915-GVTg_V5_{n}", 1 / n) for u, n in GVT_MDEVS.items())
    pci = str(tmp_path / "devices/pci0000:00" / IGPU)
    # 1/4 + 1/8 used: what is left of each type
    assert {t.name: t.available_instances for t in mdev_types(pci)} == {
        "i915-GVTg_V5_1": 0, "i915-GVTg_V5_2": 1, "i915-GVTg_V5_4": 2, "i915-GVTg_V5_8": 5}
    assert "weight: 2" in next(t.description for t in mdev_types(pci)
                               if t.name == "i915-GVTg_V5_8")


def test_i915_reads_the_device_hwmon_and_rc6_frequency(tmp_path: Path) -> None:
    gvt_host(str(tmp_path))
    b = backend(tmp_path)
    t = b.telemetry(b.inventory(None).gpus[0], Tally())
    assert t.energy_joules == 55.0  # "i915", not the gt-level "i915_gt0" (27.5 J)
    assert t.sm_clock_hertz == 0.0  # gt_act_freq_mhz 0 in RC6 is a value, not absent
    assert t.power_limit_watts is None and t.temperature_celsius is None


@pytest.mark.parametrize(("name", "share"), [
    ("i915-GVTg_V5_8", 1 / 8), ("i915-GVTg_V5_1", 1.0), ("i915-GVTg_V4_2", 0.5),
    ("GVTg_V5_4", 0.25), ("i915-GVTg_V5_0", None), ("i915-GVTg_V5_32", None),
    ("nvidia-256", None), ("", None)])
def test_gvt_share_is_one_over_the_type_suffix(name: str, share: float | None) -> None:
    assert gvt_share(name) == share


def test_lost_device_raises_and_keeps_its_identity(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=0)
    b = backend(tmp_path)
    first = b.inventory(None)
    shutil.rmtree(tmp_path / "devices/pci0000:00" / FLEX)
    with pytest.raises(DeviceLost):
        b.telemetry(first.gpus[0], Tally())
    again = b.inventory(first)
    assert [g.uuid for g in again.gpus] == [FLEX]
    assert again.static[FLEX].vendor == "intel"


def test_other_vendors_and_unbound_cards_are_skipped(tmp_path: Path) -> None:
    write_gpu(str(tmp_path), IntelGpu("0000:01:00.0", 2, "0x56c1", "xe"))
    write_gpu(str(tmp_path), IntelGpu("0000:02:00.0", 10, "0x56c0", "vfio-pci"))
    write_gpu(str(tmp_path), IntelGpu("0000:03:00.0", 3, "0x2684", "xe"))
    (tmp_path / "devices/pci0000:00/0000:03:00.0/vendor").write_text("0x10de\n")
    b = backend(tmp_path)
    assert [(g.uuid, g.model) for g in b.inventory(None).gpus] == [
        ("0000:01:00.0", "Intel ATS-M75")]


def test_cards_sort_by_number(tmp_path: Path) -> None:
    for n in (10, 2):
        write_gpu(str(tmp_path), IntelGpu(f"0000:{n:02x}:00.0", n, "0x56c0", "xe"))
    assert [c.card for c in intel_cards(str(tmp_path)) or []] == ["card2", "card10"]


@pytest.mark.parametrize(("text", "value"), [
    ("42\n", 42), ("42", 42), ("", None), ("N/A\n", None), ("-1\n", None), ("٣\n", None),
    ("9" * 30 + "\n", None)])
def test_read_int_is_strict(tmp_path: Path, text: str, value: int | None) -> None:
    (tmp_path / "f").write_text(text)
    assert read_int(str(tmp_path / "f")) == value


def test_expected_devices_count_functions_without_a_driver(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=2)
    write_gpu(str(tmp_path), IntelGpu("0000:9a:00.0", 5, "0x56c0", "vfio-pci"))
    bridge = tmp_path / "devices/pci0000:00/0000:00:1f.0"  # an Intel ISA bridge: not a GPU
    bridge.mkdir(parents=True)
    (bridge / "vendor").write_text("0x8086\n")
    (bridge / "class").write_text("0x060100\n")
    (tmp_path / "bus/pci/devices/0000:00:1f.0").symlink_to(
        "../../../devices/pci0000:00/0000:00:1f.0")
    b = backend(tmp_path)
    # the VFs are not GPUs of their own; the card held by vfio-pci is (it answers nothing)
    assert b.expected_devices(str(tmp_path)) == [FLEX, "0000:9a:00.0"]
    assert [g.uuid for g in b.inventory(None).gpus] == [FLEX]


def test_no_drm_sysfs_fails_open_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="no DRM sysfs under"):
        IntelBackend(sysfs_root=str(tmp_path)).open()
    assert IntelBackend(sysfs_root=str(tmp_path)).expected_devices(str(tmp_path)) is None


def test_level_zero_absent_is_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    flex_host(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="exporter.device.intel"):
        b = backend(tmp_path)
    assert b.level_zero is None  # pyzes is not a dependency
    assert [r.getMessage() for r in caplog.records] == [
        "intel: Level Zero Sysman (pyzes) absent (ModuleNotFoundError: No module named "
        "'pyzes'); reading sysfs and hwmon only"]


def test_level_zero_names_the_model_and_gives_memory_in_use(tmp_path: Path) -> None:
    flex_host(str(tmp_path), vfs=0)
    gvt_host(str(tmp_path / "other"))  # a second tree: its iGPU is not on this node
    zes = SimZes([
        SimZesDevice((0, 0x4d, 0, 0), "Intel(R) Data Center GPU Flex 170",
                     [SimZesMemory(16 * GiB, 12 * GiB),
                      SimZesMemory(64 * GiB, 60 * GiB, location=ZES_MEM_LOC_SYSTEM)]),
        SimZesDevice((0, 0, 2, 0), "Intel(R) UHD Graphics 630")])
    b = IntelBackend(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "no-proc"),
                     sysman=lambda: (zes, ""))
    b.open()
    inv = b.inventory(None)
    assert [(g.uuid, g.model) for g in inv.gpus] == [
        (FLEX, "Intel(R) Data Center GPU Flex 170")]
    assert inv.static[FLEX].memory_bytes == 16 * GiB  # sysfs's VRAM; Sysman agrees
    mem = b.telemetry(inv.gpus[0], Tally()).memory
    # device-local modules only: the system memory module is not the GPU's
    assert mem is not None and (mem.total_bytes, mem.used_bytes, mem.free_bytes) == (
        16 * GiB, 4 * GiB, 12 * GiB)


def test_level_zero_failing_init_is_absent(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    flex_host(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="exporter.device.intel"):
        b = IntelBackend(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "no-proc"),
                         sysman=lambda: (None, "zesInit returned 1"))
        b.open()
    assert b.level_zero is None
    assert "(zesInit returned 1)" in caplog.records[0].getMessage()
    t = b.telemetry(b.inventory(None).gpus[0], Tally())
    assert t.energy_joules == 1234.0 and t.memory == MemoryUsage(16 * GiB, 0.0, 16 * GiB)


@pytest.mark.parametrize("host", ["flex", "gvt"])
def test_the_sampler_serves_an_intel_node(tmp_path: Path, host: str) -> None:
    (flex_host if host == "flex" else gvt_host)(str(tmp_path))
    bdf = FLEX if host == "flex" else IGPU
    specs = [s for s in REGISTRY if s.name != "attribution"]
    sampler = Sampler(IntelBackend(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "proc")),
                      ExporterOptions(node="n", sysfs_root=str(tmp_path)), specs, threaded=False)
    try:
        body = sampler.cycle().body(False, False)
    finally:
        sampler.close()
    assert values(body, "gpu_exporter_source_up", source="intel") == [1]
    assert values(body, "gpu_info", uuid=bdf, pci_bus_id=bdf, virtualization_mode="host") == [1]
    assert values(body, "gpu_energy_joules_total", uuid=bdf) == [
        1234.0 if host == "flex" else 55.0]
    assert values(body, "gpu_expected_devices", source="pci") == [1]
    assert values(body, "gpu_utilization_ratio") == []  # no PMU reading: absent, not 0
    for collector in ("device", "ecc", "xid", "vgpu", "clocks", "mig"):
        assert values(body, "gpu_exporter_collector_success", collector=collector) == [1]
    # the VFs and mdevs it lends, by the id a device plugin hands out
    info = values(body, "gpu_vgpu_info", uuid=bdf)
    if host == "flex":
        assert values(body, "gpu_vgpu_info", vgpu_uuid="0000:4d:00.1", vgpu_type="VF0") == [1]
        assert len(info) == 4
    else:
        assert sorted(values(body, "gpu_vgpu_info", vgpu_type="i915-GVTg_V5_4")) == [1]
        assert len(info) == len(GVT_MDEVS)


def test_processes_and_engine_busy_from_fdinfo(tmp_path: Path) -> None:
    """xe clients on the Flex (VFs off): each process's busiest compute engine and resident
    VRAM, the device's busiest engine class summed over its clients, memory in use."""
    flex_host(str(tmp_path), vfs=0)
    proc = Proc(tmp_path / "proc")
    clock = Clock()
    b = backend(tmp_path, clock)
    gpu = b.inventory(None).gpus[0]
    reader = b.process_reader()

    def clients(rcs_a: int, ccs_a: int, ccs_b: int, stamp: int) -> None:
        proc.open(400, 3, xe(3, rcs=rcs_a, ccs=ccs_a, stamp=stamp).replace(ARC, FLEX))
        proc.open(500, 4, xe(7, rcs=0, ccs=ccs_b, stamp=stamp).replace(ARC, FLEX))

    clients(0, 0, 0, 1_000_000)
    first = reader.read(gpu, [], Tally())
    assert [(p.pid, p.uuid, p.sm_util) for p in first] == [(400, FLEX, None), (500, FLEX, None)]
    assert b.telemetry(gpu, Tally()).utilization is None  # no baseline yet
    clients(300_000, 2_000_000, 1_000_000, 2_000_000)
    clock.now += 1.0
    procs = {p.pid: p for p in reader.read(gpu, [], Tally())}
    assert procs[400].sm_util == pytest.approx(0.5)  # ccs 2e6 of 1e6 cycles x 4 engines
    assert procs[500].sm_util == pytest.approx(0.25)
    assert procs[400].memory_bytes == 23992 * 1024  # drm-resident-vram0
    t = b.telemetry(gpu, Tally())
    assert t.utilization == pytest.approx(0.75)  # ccs: 0.5 + 0.25 (rcs 0.3 is less busy)
    assert t.memory == MemoryUsage(16 * GiB, 2 * 23992 * 1024, 16 * GiB - 2 * 23992 * 1024)


def test_probe_finds_intel_gpus_only_when_sysfs_has_one(tmp_path: Path) -> None:
    spec = LoadSpec(sysfs_root=str(tmp_path), proc_root=str(tmp_path / "proc"))
    with pytest.raises(BackendAbsent, match="lists no Intel GPU bound to i915 or xe"):
        probe(spec, True)
    assert isinstance(probe(spec, False), IntelBackend)  # named: it runs, and retries
    flex_host(str(tmp_path))
    b = probe(spec, True)
    assert b.sysfs_root == str(tmp_path) and b.proc_root == str(tmp_path / "proc")


def test_exporter_serves_nvidia_and_intel_side_by_side(tmp_path: Path) -> None:
    """The exporter process with `--device-backend nvml,intel`: a simulated NVIDIA node and an
    Intel Flex sysfs tree in one exposition, each GPU with its vendor."""
    flex_host(str(tmp_path / "sys"), vfs=0)
    (tmp_path / "proc").mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_ledger.cli", "exporter", "--nvml", f"sim:{SCENARIO}",
         "--device-backend", "nvml,intel", "--sysfs-root", str(tmp_path / "sys"),
         "--proc-root", str(tmp_path / "proc"), "--web.listen-address", f"127.0.0.1:{port}",
         "--interval", "1s", "--no-kubernetes", "--pod-resources-socket",
         str(tmp_path / "absent.sock"), "--node-name", "n1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read()
                if values(body, "gpu_up", vendor="intel"):
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError("no Intel GPU served")
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # no Level Zero here: the uuid is node-qualified (exporter/device/identity.py)
    flex = f"{FLEX}@n1"
    assert values(body, "gpu_up", uuid=flex, vendor="intel", model="Intel ATS-M150") == [1]
    assert values(body, "gpu_energy_joules_total", uuid=flex) == [1234.0]
    assert values(body, "gpu_exporter_source_up", source="intel") == [1]
    assert values(body, "gpu_exporter_source_up", source="nvml") == [1]
    assert values(body, "gpu_up", vendor="nvidia")  # the simulated node's GPUs beside it
    assert values(body, "gpu_info", uuid=flex, pci_bus_id=FLEX, driver_version="xe") == [1]
