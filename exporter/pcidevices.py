"""How many GPUs the node has, from a source that does not need the vendor library to answer:
the PCI functions in sysfs (NVIDIA: vendor 0x10de, class VGA 0x0300 or 3D controller 0x0302;
NVSwitches are bridges, 0x0680, and are not counted; AMD and Intel: their backends' classes).
A GPU that fell off the bus before the exporter started never reaches the library's device
list, but its PCI function usually stays; comparing the two keeps a dead GPU visible across
exporter restarts."""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # first four hex digits of the 24-bit class code


def gpu_functions(sysfs_root: str, vendor: str, classes: tuple[str, ...], *,
                  physical_only: bool = False) -> list[str] | None:
    """Sorted PCI addresses (sysfs spelling, `0000:3b:00.0`) of the functions of `vendor`
    whose class code starts with one of `classes`; with `physical_only`, SR-IOV VFs (a
    `physfn` link) are left out. None when sysfs cannot be read (no PCI bus visible: the count
    is unknown, not zero). One reader for every backend's expected devices."""
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return None
    found = []
    for dev in entries:
        try:
            ven = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if ven == vendor and klass.startswith(classes) \
                and not (physical_only and os.path.lexists(dev / "physfn")):
            found.append(dev.name)
    return found


def nvidia_gpu_functions(sysfs_root: str = "/sys") -> list[str] | None:
    """Sorted PCI addresses of the NVIDIA GPUs, or None when sysfs cannot be read."""
    return gpu_functions(sysfs_root, NVIDIA_VENDOR, GPU_CLASSES)
