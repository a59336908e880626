"""DRM fdinfo (exporter/device/fdinfo.py) on /proc trees written in the kernel's documented
format: the examples of Documentation/gpu/drm-usage-stats.rst's drivers (amdgpu_fdinfo.c's
seq_printf lines, i915's documented example, xe_drm_client.c's documented example), two reads
for utilisation, clients shared between fds and processes, hostile files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.device import fdinfo
from exporter.device.contract import ProcessSample
from exporter.device.fdinfo import DrmFdinfo, parse_fdinfo, read_fdinfo_processes, scan_clients

MI300X = "0000:0c:00.0"
ARC = "0000:03:00.0"
IGPU = "0000:00:02.0"
KIB, MIB = 1024, 1024 * 1024


def amdgpu(client: int, vram_kib: int, gfx_ns: int, compute_ns: int = 0) -> str:
    # amdgpu_show_fdinfo: pasid, drm-driver, drm-pdev, drm-client-id, drm-memory-{vram,gtt,cpu}
    # (gtt and cpu with a space before the tab), amd-* keys, drm-engine-<ip> in ns for the
    # engines used
    text = (f"pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1086\npasid:\t32770\n"
            f"drm-driver:\tamdgpu\ndrm-pdev:\t{MI300X}\ndrm-client-id:\t{client}\n"
            f"drm-memory-vram:\t{vram_kib} KiB\ndrm-memory-gtt: \t2048 KiB\n"
            f"drm-memory-cpu: \t0 KiB\namd-memory-visible-vram:\t{vram_kib} KiB\n"
            f"amd-evicted-vram:\t0 KiB\namd-requested-vram:\t{vram_kib} KiB\n"
            f"drm-engine-gfx:\t{gfx_ns} ns\n")
    return text + (f"drm-engine-compute:\t{compute_ns} ns\n" if compute_ns else "")


def i915(client: int, render_ns: int, local: str = "") -> str:
    # Documentation/gpu/i915.rst's example (pdev 0000:00:02.0, an integrated GPU), with the
    # memory regions drm_print_memory_stats prints
    return (f"pos:    0\nflags:  0100002\nmnt_id: 21\ndrm-driver: i915\ndrm-pdev:   {IGPU}\n"
            f"drm-client-id:      {client}\ndrm-engine-render:  {render_ns} ns\n"
            "drm-engine-copy:    2035071108 ns\ndrm-engine-video:   0 ns\n"
            "drm-engine-capacity-video:   2\ndrm-engine-video-enhance:   0 ns\n"
            "drm-total-system0:\t232411136\ndrm-resident-system0:\t122638336\n"
            "drm-resident-stolen-system0:\t8 MiB\n" + local)


def xe(client: int, rcs: int, ccs: int, stamp: int) -> str:
    # xe_drm_client.c's documented example, cycles varied
    return (f"pos:    0\nflags:  0100002\nmnt_id: 26\nino:    685\ndrm-driver:     xe\n"
            f"drm-client-id:  {client}\ndrm-pdev:       {ARC}\n"
            "drm-total-system:       0\ndrm-resident-system:    0\n"
            "drm-total-gtt:  192 KiB\ndrm-resident-gtt:       192 KiB\n"
            "drm-total-vram0:        23992 KiB\ndrm-shared-vram0:       16 MiB\n"
            "drm-resident-vram0:     23992 KiB\ndrm-total-stolen:       0\n"
            f"drm-cycles-rcs: {rcs}\ndrm-total-cycles-rcs:   {stamp}\n"
            f"drm-cycles-bcs: 0\ndrm-total-cycles-bcs:   {stamp}\n"
            f"drm-cycles-ccs: {ccs}\ndrm-total-cycles-ccs:   {stamp}\n"
            "drm-engine-capacity-ccs:        4\n")


class Proc:
    """A /proc tree: /proc/<pid>/fd/<n> -> the node, /proc/<pid>/fdinfo/<n>."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, pid: int, fd: int, text: str, target: str = "/dev/dri/renderD128") -> None:
        (self.root / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "fdinfo").mkdir(parents=True, exist_ok=True)
        link = self.root / str(pid) / "fd" / str(fd)
        if link.is_symlink():
            link.unlink()
        os.symlink(target, link)
        (self.root / str(pid) / "fdinfo" / str(fd)).write_text(text)


@pytest.fixture
def proc(tmp_path: Path) -> Proc:
    return Proc(tmp_path / "proc")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_amdgpu_file() -> None:
    c = parse_fdinfo(amdgpu(7, 4 * 1024 * 1024, 123456789, 5), pid=42, fd=5)
    assert c is not None
    assert (c.driver, c.pdev, c.client_id) == ("amdgpu", MI300X, 7)
    assert c.engine_ns == {"gfx": 123456789, "compute": 5}
    assert c.resident == {"vram": 4 << 30, "gtt": 2 * MIB, "cpu": 0}  # memory- = resident-
    assert c.memory_bytes == 4 << 30  # vram only: gtt and cpu are system memory


def test_i915_file_integrated() -> None:
    c = parse_fdinfo(i915(7, 9288864723))
    assert c is not None and (c.driver, c.pdev, c.client_id) == ("i915", IGPU, 7)
    assert c.engine_ns["render"] == 9288864723 and c.engine_ns["video-enhance"] == 0
    assert c.capacity == {"video": 2}  # not an engine named "capacity-video"
    # no local memory: the GPU's buffers in system memory are its memory
    assert c.memory_bytes == 122638336 + 8 * MIB
    assert c.total == {"system0": 232411136}


def test_i915_discrete_counts_local_memory() -> None:
    c = parse_fdinfo(i915(7, 1, local="drm-resident-local0:\t512 MiB\n"))
    assert c is not None and c.memory_bytes == 512 * MIB


def test_xe_file() -> None:
    c = parse_fdinfo(xe(3, 28257900, 0, 7655183225))
    assert c is not None and (c.driver, c.pdev, c.client_id) == ("xe", ARC, 3)
    assert c.cycles == {"rcs": 28257900, "bcs": 0, "ccs": 0}
    assert c.total_cycles == {"rcs": 7655183225, "bcs": 7655183225, "ccs": 7655183225}
    assert c.capacity == {"ccs": 4}
    assert c.resident["vram0"] == 23992 * KIB and c.total["gtt"] == 192 * KIB
    assert c.memory_bytes == 23992 * KIB


@pytest.mark.parametrize("line", [
    "drm-engine-gfx:\t-5 ns",  # not unsigned
    "drm-engine-gfx:\t١٢٣ ns",  # Unicode digits
    "drm-engine-gfx:\t123 ms",  # a unit the specification does not have
    "drm-engine-gfx:\t" + "9" * 21 + " ns",  # past 2**64
    "drm-engine-gfx:\t12 ns extra",
    "drm-memory-vram:\t2 GiB",  # KiB and MiB only
    "drm-engine-gfx",  # no colon
    "drm-engine-GFX:\t5 ns",  # keys are lower case
    "drm-engine-gf x:\t5 ns",  # no whitespace in keys
])
def test_malformed_lines_are_ignored(line: str) -> None:
    c = parse_fdinfo(f"drm-driver:\tamdgpu\n{line}\ndrm-engine-dma:\t10 ns\n")
    assert c is not None
    assert c.engine_ns == {"dma": 10} and c.resident == {}


def test_not_a_drm_file() -> None:
    assert parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t24\n") is None
    assert parse_fdinfo("drm-pdev:\t0000:0c:00.0\ndrm-engine-gfx:\t5 ns\n") is None


def test_bad_pdev_is_no_address() -> None:
    c = parse_fdinfo("drm-driver:\tamdgpu\ndrm-pdev:\tcard0\n")
    assert c is not None and c.pdev == ""


def test_fds_of_one_client_count_once(proc: Proc) -> None:
    """Two fds of one client (dup) and the same client in a forked child count once, for the
    lowest pid; another client of the same process adds up."""
    proc.open(100, 5, amdgpu(7, 1024, 0))
    proc.open(100, 6, amdgpu(7, 1024, 0))  # dup of fd 5
    proc.open(101, 3, amdgpu(7, 1024, 0))  # inherited by a child
    proc.open(100, 9, amdgpu(8, 2048, 0))  # a second client of pid 100
    proc.open(102, 4, "pos:\t0\nflags:\t02\n", target="/dev/null")  # not a DRM fd
    reader = DrmFdinfo(str(proc.root), Clock())
    [u] = reader.usage(MI300X)
    assert (u.pid, u.memory_bytes) == (100, 3 * MIB)
    assert u.utilization is None  # one read: no difference yet


def test_amdgpu_utilisation_between_two_reads(proc: Proc) -> None:
    clock = Clock()
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=1_000_000_000, compute_ns=10))
    proc.open(200, 5, amdgpu(9, 2048, gfx_ns=0, compute_ns=10))
    reader = DrmFdinfo(str(proc.root), clock)
    reader.usage(MI300X)
    clock.now += 2.0
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=1_500_000_000, compute_ns=10))  # 0.5 s of 2 s
    proc.open(200, 5, amdgpu(9, 2048, gfx_ns=0, compute_ns=10 + 1_500_000_000))  # 0.75
    got = {u.pid: u for u in reader.usage(MI300X)}
    assert got[100].utilization == pytest.approx(0.25)
    assert got[200].utilization == pytest.approx(0.75)
    assert got[200].engines == {"gfx": 0.0, "compute": pytest.approx(0.75)}


def test_i915_capacity_divides_the_engine_class(proc: Proc) -> None:
    clock = Clock()
    video = "drm-engine-video:   {} ns\n"
    base = i915(7, 0).replace("drm-engine-video:   0 ns\n", "")
    proc.open(300, 4, base + video.format(0))
    reader = DrmFdinfo(str(proc.root), clock)
    reader.usage(IGPU)
    clock.now += 1.0
    proc.open(300, 4, base + video.format(1_000_000_000))  # one of the two video engines
    [u] = reader.usage(IGPU)
    assert u.engines["video"] == pytest.approx(0.5)
    assert u.utilization == 0.0  # render did nothing; video is not compute


def test_xe_cycles_over_total_cycles(proc: Proc) -> None:
    """xe: busy cycles over the GPU timestamp's cycles, whatever the wall clock did; ccs
    summed over its 4 engines."""
    clock = Clock()
    proc.open(400, 3, xe(3, rcs=100, ccs=0, stamp=1_000_000))
    reader = DrmFdinfo(str(proc.root), clock)
    reader.usage(ARC)
    clock.now += 7.0  # the wall clock does not matter for cycles
    proc.open(400, 3, xe(3, rcs=100 + 300_000, ccs=2_000_000, stamp=2_000_000))
    [u] = reader.usage(ARC)
    assert u.engines["rcs"] == pytest.approx(0.3)
    assert u.engines["ccs"] == pytest.approx(0.5)  # 2e6 of 1e6 x 4
    assert u.utilization == pytest.approx(0.5)


def test_counter_that_steps_back_keeps_the_larger_value(proc: Proc) -> None:
    clock = Clock()
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=5_000_000_000))
    reader = DrmFdinfo(str(proc.root), clock)
    reader.usage(MI300X)
    clock.now += 1.0
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=4_000_000_000))  # stepped back
    assert reader.usage(MI300X)[0].utilization == 0.0
    clock.now += 1.0
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=5_500_000_000))  # 0.5 s past the larger value
    assert reader.usage(MI300X)[0].utilization == pytest.approx(0.5)


def test_oversized_file_is_skipped_and_counted(proc: Proc) -> None:
    proc.open(100, 5, amdgpu(7, 1024, 0) + "x" * fdinfo.MAX_FDINFO_BYTES)
    proc.open(101, 5, amdgpu(8, 1024, 0))
    clients, stats = scan_clients(str(proc.root))
    assert [c.pid for c in clients] == [101] and stats.oversized == 1


def test_scan_bounds(proc: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fdinfo, "MAX_FDS_PER_PID", 2)
    monkeypatch.setattr(fdinfo, "MAX_DRM_FILES", 3)
    for fd in range(4):
        proc.open(100, fd, amdgpu(fd, 1024, 0))
    proc.open(101, 0, amdgpu(50, 1024, 0))
    proc.open(102, 0, amdgpu(51, 1024, 0))
    clients, stats = scan_clients(str(proc.root))
    assert stats.truncated_pids == 1 and stats.truncated
    assert len(clients) == 3


def test_unreadable_proc_is_empty(tmp_path: Path) -> None:
    assert scan_clients(str(tmp_path / "nothing")) == ([], fdinfo.ScanStats())


def test_contract_process_samples(proc: Proc) -> None:
    """What an AMD or Intel ProcessReader returns: host pid, the device's UUID, bytes, the
    busiest compute engine's share; devices of other addresses left out."""
    clock = Clock()
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=0))
    proc.open(300, 4, i915(7, 0))
    reader = DrmFdinfo(str(proc.root), clock)
    # NVML's spelling of the address finds the same device
    first = read_fdinfo_processes(reader, {"00000000:0C:00.0": "GPU-mi300x"})
    assert first == [ProcessSample(100, "GPU-mi300x", "", float(MIB), None)]
    clock.now += 1.0
    proc.open(100, 5, amdgpu(7, 1024, gfx_ns=250_000_000))
    assert read_fdinfo_processes(reader, {MI300X: "GPU-mi300x"}) == [
        ProcessSample(100, "GPU-mi300x", "", float(MIB), pytest.approx(0.25))]
