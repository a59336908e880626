"""How many NVIDIA GPUs the node has, from a source that does not need NVML to answer: the PCI
functions in sysfs (vendor 0x10de, class VGA 0x0300 or 3D controller 0x0302; NVSwitches are
bridges, 0x0680, and are not counted). A GPU that fell off the bus before the exporter started
never reaches NVML's device list, but its PCI function usually stays; comparing the two keeps a
dead GPU visible across exporter restarts."""

from __future__ import annotations

from pathlib import Path

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # first four hex digits of the 24-bit class code


def nvidia_gpu_functions(sysfs_root: str = "/sys") -> list[str] | None:
    """Sorted PCI addresses of the NVIDIA GPUs, or None when sysfs cannot be read (no PCI bus
    visible: the count is unknown, not zero)."""
    devices = Path(sysfs_root) / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return None
    found = []
    for dev in entries:
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass[:6] in GPU_CLASSES:
            found.append(dev.name)
    return found
