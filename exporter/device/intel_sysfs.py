"""Intel GPUs as sysfs shows them (i915 and xe), read from a root directory so tests and the
simulator point it at a tree (gpusim/intel_sysfs.py writes one).

Where each value lives, as the kernel writes it (Linux 6.15 sources and ABI documents; each
file is one value and a newline):

- `/sys/class/drm/cardN/device`: a link to the PCI function (its name is the BDF), with
  `vendor` (`0x8086`), `device` (`0x56c0`), `driver` (a link to `.../drivers/i915` or `xe`).
  A function with `physfn` is an SR-IOV VF; a PF lists `sriov_totalvfs`, `sriov_numvfs` and
  `virtfnN` links to its VFs (Documentation/ABI/testing/sysfs-bus-pci).
- hwmon, `device/hwmon/hwmonK` whose `name` is the driver (i915 also has gt-level `i915_gtN`):
  `energy1_input` µJ, `power1_max` µW (0: the limit is disabled), generic hwmon
  `power1_average` / `power1_input` µW where a driver adds them, `temp2_input` / `temp3_input`
  millidegrees C (xe package / VRAM) (Documentation/ABI/testing/sysfs-driver-intel-i915-hwmon,
  KernelVersion 6.2; sysfs-driver-intel-xe-hwmon, 6.5 to 6.16).
- frequency in MHz: i915 `cardN/gt_act_freq_mhz` (0 while the GT sleeps in RC6), else
  `gt_cur_freq_mhz`; xe `device/tile0/gt0/freq0/act_freq`, else `cur_freq`
  (drivers/gpu/drm/xe/xe_gt_freq.c).
- local memory: xe `device/tileN/physical_vram_size_bytes` (xe_tile_sysfs.c), summed over
  tiles. Upstream i915 has no such file (only Intel's out-of-tree backports do).
- tiles (the subdevices of a Data Center GPU Max): xe makes a `device/tile<id>` directory per
  tile (xe_tile_sysfs.c, `kobject_add(..., &dev->kobj, "tile%d", tile->id)`) and a
  `gt<id>` directory per GT inside its tile (xe_gt_sysfs.c); a media GT (Meteor Lake and
  later) is a second GT of tile 0, not a tile. i915 makes `cardN/gt/gt<id>` per GT
  (gt/intel_gt_sysfs.c); there a second GT is a tile only on PVC (Meteor Lake's gt1 is its media
  GT), so i915 GTs count as tiles on the PVC device IDs of include/drm/intel/pciids.h only.
  GPU Aware Scheduling names a tile `card<N>:gt<id>` after these directories (Linux 6.15).
- GVT-g (i915 on integrated GPUs up to gen 9/10): the PCI function's `mdev_supported_types/
  i915-GVTg_V5_N/{name,description,available_instances}`, and each mediated device at
  `/sys/bus/mdev/devices/<uuid>` (a link into its parent function's directory) with an
  `mdev_type` link to its type (Documentation/driver-api/vfio-mediated-device.rst).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from exporter.device.contract import pci_bdf
from exporter.pcidevices import gpu_functions

INTEL_VENDOR = "0x8086"
DRIVERS = ("i915", "xe")
_CARD = re.compile(r"^card([0-9]{1,6})$")
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_VIRTFN = re.compile(r"^virtfn([0-9]{1,6})$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# i915 gvt/vgpu.c: type "GVTg_V<gen>_<N>" with weight VGPU_WEIGHT(N) = VGPU_MAX_WEIGHT (16) / N,
# the share of the GPU's time a vGPU of the type gets when all N run (the mdev core prefixes
# the driver: "i915-GVTg_V5_4").
_GVT_TYPE = re.compile(r"GVTg_V[0-9]{1,2}_([0-9]{1,2})$")
GVT_MAX_WEIGHT = 16


def read_text(path: str) -> str | None:
    """A sysfs attribute without its newline; None when absent or unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4096).strip()
    except OSError:
        return None


def read_int(path: str) -> int | None:
    """A decimal sysfs attribute; None when absent, unreadable or not a number."""
    text = read_text(path)
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20:
        return None
    return int(text)


def _link_name(path: str) -> str:
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return ""


@dataclass(frozen=True)
class IntelCard:
    """One DRM card of an Intel PCI function bound to i915 or xe."""

    card: str  # "card0"
    number: int
    bdf: str  # "0000:03:00.0"
    device_id: str  # "0x56c0"
    driver: str  # "i915" | "xe"
    card_dir: str  # <root>/class/drm/cardN
    pci_dir: str  # the PCI function's directory (the resolved `device` link)
    physfn: str  # the PF's BDF when this function is an SR-IOV VF, else ""


def intel_cards(sysfs_root: str) -> list[IntelCard] | None:
    """Every Intel card bound to i915 or xe, by card number; None when DRM sysfs is absent."""
    drm = os.path.join(sysfs_root, "class", "drm")
    try:
        names = os.listdir(drm)
    except OSError:
        return None
    cards: list[IntelCard] = []
    for name in names:
        m = _CARD.match(name)
        if m is None:
            continue
        card_dir = os.path.join(drm, name)
        dev = os.path.join(card_dir, "device")
        if (read_text(os.path.join(dev, "vendor")) or "").lower() != INTEL_VENDOR:
            continue
        driver = _link_name(os.path.join(dev, "driver"))
        if driver not in DRIVERS:
            continue
        pci_dir = os.path.realpath(dev)
        bdf = pci_bdf(os.path.basename(pci_dir))
        if not _BDF.match(bdf):
            continue
        physfn = os.path.join(dev, "physfn")
        cards.append(IntelCard(
            name, int(m[1]), bdf, (read_text(os.path.join(dev, "device")) or "").lower(),
            driver, card_dir, pci_dir,
            pci_bdf(os.path.basename(os.path.realpath(physfn))) if os.path.islink(physfn)
            else ""))
    return sorted(cards, key=lambda c: c.number)


def intel_gpu_functions(sysfs_root: str) -> list[str] | None:
    """PCI addresses of the Intel display-class functions (class 0x03xxxx: VGA, 3D, display
    controller) that are not SR-IOV VFs, bound to a driver or not: the GPUs the node has even
    when i915/xe did not take one. None when sysfs cannot be read."""
    return gpu_functions(sysfs_root, INTEL_VENDOR, ("0x03",), physical_only=True)


def hwmon_dir(card: IntelCard) -> str | None:
    """The device-level hwmon directory (its `name` is the driver's), or None."""
    base = os.path.join(card.pci_dir, "hwmon")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None
    for entry in entries:
        path = os.path.join(base, entry)
        if read_text(os.path.join(path, "name")) == card.driver:
            return path
    return None


_GT_HWMON = re.compile(r"^i915_gt([0-9]{1,2})$")


def gt_energy_uj(card: IntelCard) -> dict[int, int]:
    """GT id -> `energy1_input` (µJ) of i915's gt-level hwmon devices, named `i915_gt<N>`
    ("For gt level hwmon devices (name "i915_gtN") this reflects energy input for the gt",
    sysfs-driver-intel-i915-hwmon, KernelVersion 6.2). xe has no per-tile energy file (its
    `energy1_input` / `energy2_input` are card and package: sysfs-driver-intel-xe-hwmon)."""
    base = os.path.join(card.pci_dir, "hwmon")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[int, int] = {}
    for entry in entries:
        m = _GT_HWMON.match(read_text(os.path.join(base, entry, "name")) or "")
        uj = read_int(os.path.join(base, entry, "energy1_input")) if m else None
        if m and uj is not None:
            out[int(m.group(1))] = uj
    return out


def frequency_mhz(card: IntelCard) -> int | None:
    if card.driver == "xe":
        freq = os.path.join(card.pci_dir, "tile0", "gt0", "freq0")
        act = read_int(os.path.join(freq, "act_freq"))
        return act if act is not None else read_int(os.path.join(freq, "cur_freq"))
    act = read_int(os.path.join(card.card_dir, "gt_act_freq_mhz"))
    return act if act is not None else read_int(os.path.join(card.card_dir, "gt_cur_freq_mhz"))


def local_memory_bytes(card: IntelCard) -> int | None:
    """xe: VRAM summed over tiles; None where sysfs does not say (i915, integrated GPUs)."""
    if card.driver != "xe":
        return None
    total, seen = 0, False
    try:
        entries = os.listdir(card.pci_dir)
    except OSError:
        return None
    for entry in entries:
        if re.fullmatch(r"tile[0-9]{1,2}", entry):
            size = read_int(os.path.join(card.pci_dir, entry, "physical_vram_size_bytes"))
            if size is not None:
                total, seen = total + size, True
    return total if seen else None


# include/drm/intel/pciids.h INTEL_PVC_IDS (Linux 6.15): Data Center GPU Max (Ponte Vecchio)
PVC_IDS = frozenset({"0x0b69", "0x0b6e", "0x0bd4", "0x0bd5", "0x0bd6", "0x0bd7", "0x0bd8",
                     "0x0bd9", "0x0bda", "0x0bdb", "0x0be0", "0x0be1", "0x0be5"})
_TILE = re.compile(r"^tile([0-9]{1,2})$")
_GT = re.compile(r"^gt([0-9]{1,2})$")


@dataclass(frozen=True)
class Tile:
    """One tile of a multi-tile GPU as sysfs shows it."""

    id: int  # the tile id (xe tile<id>; i915: the GT id)
    gt: int  # its (first) GT's id: the `gt<id>` GPU Aware Scheduling's annotation names
    gt_dir: str  # the GT's sysfs directory
    vram_bytes: int | None  # xe `physical_vram_size_bytes`; None where sysfs does not say


def _numbered(base: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    try:
        names = os.listdir(base)
    except OSError:
        return []
    out = [(int(m[1]), os.path.join(base, n)) for n in names if (m := pattern.match(n))]
    return sorted(out)


def tiles(card: IntelCard) -> list[Tile]:
    """The card's tiles, by id; empty or one for a single-tile GPU."""
    if card.driver == "xe":
        out: list[Tile] = []
        for tid, tdir in _numbered(card.pci_dir, _TILE):
            gts = _numbered(tdir, _GT)
            if gts:
                out.append(Tile(tid, gts[0][0], gts[0][1],
                                read_int(os.path.join(tdir, "physical_vram_size_bytes"))))
        return out
    if card.device_id not in PVC_IDS:
        return []
    return [Tile(gid, gid, gdir, None)
            for gid, gdir in _numbered(os.path.join(card.card_dir, "gt"), _GT)]


@dataclass(frozen=True)
class SriovState:
    total_vfs: int
    num_vfs: int
    vfs: tuple[tuple[int, str], ...]  # (VF number, its BDF), enabled VFs


def sriov(pci_dir: str) -> SriovState | None:
    """A PF's SR-IOV state; None when the function has no SR-IOV capability."""
    total = read_int(os.path.join(pci_dir, "sriov_totalvfs"))
    if total is None:
        return None
    vfs: list[tuple[int, str]] = []
    try:
        entries = os.listdir(pci_dir)
    except OSError:
        entries = []
    for entry in entries:
        m = _VIRTFN.match(entry)
        if m:
            vf = pci_bdf(os.path.basename(os.path.realpath(os.path.join(pci_dir, entry))))
            if _BDF.match(vf):
                vfs.append((int(m[1]), vf))
    return SriovState(total, read_int(os.path.join(pci_dir, "sriov_numvfs")) or 0,
                      tuple(sorted(vfs)))


def gvt_share(type_name: str) -> float | None:
    """The fraction of its GPU a GVT-g type is priced as: 1/N for `GVTg_V5_N` (the kernel
    gives it weight 16/N of 16); None for any other type."""
    m = _GVT_TYPE.search(type_name)
    if m is None or not 1 <= int(m[1]) <= GVT_MAX_WEIGHT:
        return None
    return 1 / int(m[1])


@dataclass(frozen=True)
class Mdev:
    uuid: str
    parent: str  # the parent PCI function's BDF
    type_name: str  # "i915-GVTg_V5_4"


def mdevs(sysfs_root: str) -> list[Mdev]:
    """Every mediated device of the node (any parent), by UUID."""
    base = os.path.join(sysfs_root, "bus", "mdev", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out: list[Mdev] = []
    for name in names:
        uuid = name.lower()
        if not _UUID.match(uuid):
            continue
        real = os.path.realpath(os.path.join(base, name))
        parent = pci_bdf(os.path.basename(os.path.dirname(real)))
        type_name = _link_name(os.path.join(real, "mdev_type"))
        if _BDF.match(parent) and type_name:
            out.append(Mdev(uuid, parent, type_name))
    return out


@dataclass(frozen=True)
class MdevType:
    name: str  # directory name, "i915-GVTg_V5_4"
    available_instances: int | None
    description: str


def mdev_types(pci_dir: str) -> list[MdevType]:
    """The mdev types a GVT-g host's GPU offers (empty elsewhere)."""
    base = os.path.join(pci_dir, "mdev_supported_types")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [MdevType(n, read_int(os.path.join(base, n, "available_instances")),
                     read_text(os.path.join(base, n, "description")) or "") for n in names]
