"""NVIDIA vGPU in a scenario: a host GPU's active vGPU instances (`vgpus`) and a guest GPU's
licence (`license`)."""

from __future__ import annotations

import re

from exporter.errors import ConfigError
from gpusim.model import LICENSE_FEATURES, LicenseSpec, VgpuSpec, stable_uuid
from gpusim.signal import Signal
from gpusim.validate import (
    Node,
    as_duration,
    as_size,
    as_str,
    one_of,
    ratio_signal,
    size_signal,
)

GIB = 1 << 30
# The framebuffer in GB is the number before the series letters: A100-4C, T4-2Q, L40S-48Q.
_TYPE_FB = re.compile(r"-(\d+)[A-Z]+$")


def parse_license(file: str, key: str, raw: object) -> LicenseSpec:
    n = Node(file, key, raw if raw is not None else {})
    lic = LicenseSpec(
        feature=n.get("feature", one_of(LICENSE_FEATURES), "compute"),
        product=n.get("product", as_str, "NVIDIA Virtual Compute Server"),
        lapses_at=n.get("lapses_at", as_duration, None),
    )
    n.done()
    return lic


def parse_vgpus(file: str, key: str, items: list[object], node: str, gpu_index: int,
                memory: int) -> tuple[VgpuSpec, ...]:
    """The active vGPU instances of one host GPU (each copy of a `count` entry gets its own
    UUIDs). Their framebuffers together fit the GPU's memory."""
    out: list[VgpuSpec] = []
    for i, raw in enumerate(items):
        k = f"{key}[{i}]"
        n = Node(file, k, raw)
        type_name = n.need("type", as_str, "the vGPU type as NVML names it, e.g. "
                           "NVIDIA A100-4C")
        m = _TYPE_FB.search(type_name)
        default_fb = int(m[1]) * GIB if m else None
        fb = n.get("framebuffer", as_size, default_fb)
        if fb is None:
            raise ConfigError(file, f"{k}.framebuffer", "a size (the type name gives none)",
                              None)
        out.append(VgpuSpec(
            index=i, type_name=type_name, framebuffer=fb,
            uuid=n.get("uuid", as_str, "") or stable_uuid(node, "vgpu", str(gpu_index), str(i)),
            vm=n.get("vm", as_str, "") or stable_uuid(node, "vm", str(gpu_index), str(i)),
            memory=n.get("memory", size_signal, Signal.const(0.0)),
            sm_util=n.get("sm_util", ratio_signal, Signal.const(0.0)),
        ))
        n.done()
    if sum(v.framebuffer for v in out) > memory:
        raise ConfigError(file, key, f"vGPU framebuffers that fit the GPU's "
                          f"{memory // GIB}GiB", f"{sum(v.framebuffer for v in out) // GIB}GiB")
    return tuple(out)

