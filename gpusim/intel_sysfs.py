"""Simulated Intel GPU sysfs trees, in the kernel's layout and formats, for the Intel backend
(exporter/device/intel_sysfs.py says where each file comes from): each attribute is one value
and a newline, links are relative as sysfs makes them.

Three hosts: an Intel Data Center GPU Flex (ATS-M150, xe) with SR-IOV VFs bound to the host's
driver, an integrated GPU (i915) that is a GVT-g host with mediated devices, and a Data Center
GPU Max 1550 (PVC, two tiles; xe, or Intel's out-of-tree i915).

    python -m gpusim.intel_sysfs ROOT flex|gvt|max
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

# i915 gvt/vgpu.c intel_vgpu_configs: N -> (low_gm MB, high_gm MB, fence, weight, resolution)
GVT_CONFIGS = {8: (64, 384, 4, 2, "1024x768"), 4: (128, 512, 4, 4, "1920x1200"),
               2: (256, 1024, 4, 8, "1920x1200"), 1: (512, 2048, 4, 16, "1920x1200")}


@dataclass
class IntelGpu:
    bdf: str
    card: int
    device_id: str
    driver: str  # "i915" | "xe"
    energy_uj: int = 0
    power_max_uw: int = 0
    act_freq_mhz: int = 0
    cur_freq_mhz: int = 0
    temp_mc: int | None = None
    vram_per_tile: tuple[int, ...] = ()  # xe: one tile<i>/gt<i> per entry
    gts: int = 1  # i915: card<N>/gt/gt<i> directories (tiles on PVC)
    total_vfs: int | None = None  # SR-IOV capable PF
    vfs: tuple[tuple[str, int], ...] = ()  # (VF BDF, its card number) enabled
    gvt: bool = False  # GVT-g host: lists mdev_supported_types
    mdevs: dict[str, int] = field(default_factory=dict)  # uuid -> GVTg_V5_N


def _write(path: str, value: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        f.write(f"{value}\n")


def _link(path: str, target: str) -> None:
    """A relative link at `path` to the absolute `target`, as sysfs writes them."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(os.path.relpath(target, os.path.dirname(path)), path)


def _function(root: str, bdf: str, device_id: str, driver: str, card: int | None) -> str:
    pci = os.path.join(root, "devices", "pci0000:00", bdf)
    _write(os.path.join(pci, "vendor"), "0x8086")
    _write(os.path.join(pci, "device"), device_id)
    _write(os.path.join(pci, "class"), "0x030000")
    drivers = os.path.join(root, "bus", "pci", "drivers", driver)
    os.makedirs(drivers, exist_ok=True)
    _link(os.path.join(pci, "driver"), drivers)
    _link(os.path.join(root, "bus", "pci", "devices", bdf), pci)
    if card is not None:
        card_dir = os.path.join(pci, "drm", f"card{card}")
        os.makedirs(card_dir, exist_ok=True)
        os.symlink(f"../../../{bdf}", os.path.join(card_dir, "device"))  # as sysfs spells it
        _link(os.path.join(root, "class", "drm", f"card{card}"), card_dir)
    return pci


def write_gpu(root: str, gpu: IntelGpu) -> None:
    pci = _function(root, gpu.bdf, gpu.device_id, gpu.driver, gpu.card)
    card_dir = os.path.join(pci, "drm", f"card{gpu.card}")
    hwmon = os.path.join(pci, "hwmon", "hwmon2")
    _write(os.path.join(hwmon, "name"), gpu.driver)
    _write(os.path.join(hwmon, "energy1_input"), gpu.energy_uj)
    _write(os.path.join(hwmon, "power1_max"), gpu.power_max_uw)
    if gpu.driver == "i915":  # i915 also registers gt-level hwmons, which are not the device's
        for i in range(max(1, gpu.gts)):  # each GT's energy a part of the device's
            gt = os.path.join(pci, "hwmon", f"hwmon{3 + i}")
            _write(os.path.join(gt, "name"), f"i915_gt{i}")
            _write(os.path.join(gt, "energy1_input"), gpu.energy_uj // (max(1, gpu.gts) + 1))
        _write(os.path.join(card_dir, "gt_act_freq_mhz"), gpu.act_freq_mhz)
        _write(os.path.join(card_dir, "gt_cur_freq_mhz"), gpu.cur_freq_mhz)
        for i in range(gpu.gts):  # gt/intel_gt_sysfs.c: gt/gt<id> with its id
            gt = os.path.join(card_dir, "gt", f"gt{i}")
            _write(os.path.join(gt, "id"), i)
            _write(os.path.join(gt, "rps_act_freq_mhz"), gpu.act_freq_mhz)
            _write(os.path.join(gt, "rps_cur_freq_mhz"), gpu.cur_freq_mhz)
    else:
        if gpu.temp_mc is not None:
            _write(os.path.join(hwmon, "temp2_input"), gpu.temp_mc)
        # a PVC's tile<i> holds gt<i> (no media GT); a single-tile GPU tile0/gt0
        for i in range(max(1, len(gpu.vram_per_tile))):
            freq = os.path.join(pci, f"tile{i}", f"gt{i}", "freq0")
            _write(os.path.join(freq, "act_freq"), gpu.act_freq_mhz)
            _write(os.path.join(freq, "cur_freq"), gpu.cur_freq_mhz)
        for i, size in enumerate(gpu.vram_per_tile):
            _write(os.path.join(pci, f"tile{i}", "physical_vram_size_bytes"), size)
    if gpu.total_vfs is not None:
        _write(os.path.join(pci, "sriov_totalvfs"), gpu.total_vfs)
        _write(os.path.join(pci, "sriov_numvfs"), len(gpu.vfs))
        for n, (vf_bdf, vf_card) in enumerate(gpu.vfs):
            vf = _function(root, vf_bdf, gpu.device_id, gpu.driver, vf_card)
            _link(os.path.join(vf, "physfn"), pci)
            _link(os.path.join(pci, f"virtfn{n}"), vf)
    if gpu.gvt:
        used = sum(1 / n for n in gpu.mdevs.values())
        types = os.path.join(pci, "mdev_supported_types")
        for n, (low, high, fence, weight, res) in GVT_CONFIGS.items():
            t = os.path.join(types, f"i915-GVTg_V5_{n}")
            _write(os.path.join(t, "name"), f"GVTg_V5_{n}")
            _write(os.path.join(t, "device_api"), "vfio-pci")
            _write(os.path.join(t, "available_instances"), max(0, int((1 - used) * n + 1e-9)))
            _write(os.path.join(t, "description"),
                   f"low_gm_size: {low}MB\nhigh_gm_size: {high}MB\nfence: {fence}\n"
                   f"resolution: {res}\nweight: {weight}")
            os.makedirs(os.path.join(t, "devices"), exist_ok=True)
        for uuid, n in gpu.mdevs.items():
            mdev = os.path.join(pci, uuid)
            os.makedirs(mdev, exist_ok=True)
            t = os.path.join(types, f"i915-GVTg_V5_{n}")
            _link(os.path.join(mdev, "mdev_type"), t)
            _link(os.path.join(t, "devices", uuid), mdev)
            _link(os.path.join(root, "bus", "mdev", "devices", uuid), mdev)


def flex_host(root: str, vfs: int = 4) -> IntelGpu:
    """A Data Center GPU Flex 170-class card (ATS-M150, 16 GiB, xe) with `vfs` VFs enabled,
    each bound to xe on the host (cards 1..vfs)."""
    gpu = IntelGpu(
        "0000:4d:00.0", 0, "0x56c0", "xe", energy_uj=1_234_000_000, power_max_uw=150_000_000,
        act_freq_mhz=2050, cur_freq_mhz=2050, temp_mc=48_000, vram_per_tile=(16 << 30,),
        total_vfs=31, vfs=tuple((f"0000:4d:00.{i + 1}", i + 1) for i in range(vfs)))
    write_gpu(root, gpu)
    return gpu


MAX1550_BDF = "0000:29:00.0"
MAX1550_ID = "0x0bd5"  # pciids.h INTEL_PVC_IDS


def max1550_host(root: str, driver: str = "xe", card: int = 0,
                 bdf: str = MAX1550_BDF) -> IntelGpu:
    """A Data Center GPU Max 1550: two tiles of 64 GiB HBM2e each, 600 W."""
    gpu = IntelGpu(bdf, card, MAX1550_ID, driver, energy_uj=9_876_000_000,
                   power_max_uw=600_000_000, act_freq_mhz=1600, cur_freq_mhz=1600,
                   temp_mc=52_000, vram_per_tile=(64 << 30, 64 << 30) if driver == "xe" else (),
                   gts=2)
    write_gpu(root, gpu)
    return gpu


GVT_MDEVS = {"5b4b2a0c-7c1e-4d5f-9a0b-2f6e8d1c3a01": 4,
             "9e1d7f3a-2b4c-4e6d-8f0a-1c2b3d4e5f60": 8}


def gvt_host(root: str, mdevs: dict[str, int] | None = None) -> IntelGpu:
    """An integrated UHD 630-class GPU (i915, 00:02.0) with GVT-g on and mediated devices."""
    gpu = IntelGpu("0000:00:02.0", 0, "0x3e92", "i915", energy_uj=55_000_000,
                   power_max_uw=0, act_freq_mhz=0, cur_freq_mhz=350, gvt=True,
                   mdevs=dict(GVT_MDEVS if mdevs is None else mdevs))
    write_gpu(root, gpu)
    return gpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("host", choices=("flex", "gvt", "max"))
    args = p.parse_args()
    hosts: dict[str, Callable[[str], IntelGpu]] = {
        "flex": flex_host, "gvt": gvt_host, "max": max1550_host}
    hosts[args.host](args.root)


if __name__ == "__main__":
    main()
