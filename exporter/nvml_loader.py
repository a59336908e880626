"""Pick the device backend the exporter reads: NVML over the real `pynvml`, or over a simulated
NVML module.

The backend never knows which NVML it has: both answer `NvmlApi` (exporter/device/nvmlapi.py),
so the simulator exercises the real NVML backend's code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

from exporter.device.contract import DeviceBackend
from exporter.device.nvmlapi import NvmlApi
from exporter.errors import ConfigError


def load_nvml(spec: str, clock: Callable[[], float] = time.time) -> NvmlApi:
    """`real` -> the pynvml module; `sim:PATH` -> a SimNVML running the scenario at PATH.

    Raises ConfigError for an unknown spec or a malformed scenario file."""
    if spec == "real":
        import pynvml

        # pynvml is untyped; tests/test_device_backend.py checks it has every NvmlApi member.
        return cast(NvmlApi, pynvml)
    if spec.startswith("sim:") and spec[4:]:
        # The simulator lives outside the product (a source checkout has it, the image does not):
        # imported only when asked for.
        try:
            from gpusim.nvml import SimNVML
            from gpusim.scenario import load_scenario
        except ModuleNotFoundError as err:
            raise ConfigError("--nvml", "sim:PATH", "the simulator package gpusim, which this "
                              "installation lacks (it comes with a source checkout: "
                              "pip install -e '.[sim]')", f"no module {err.name}") from None

        return SimNVML(load_scenario(spec[4:]), clock=clock)
    raise ConfigError("--nvml", "nvml", "'real' or 'sim:PATH' (a scenario YAML file)", spec)


def load_backend(spec: str, clock: Callable[[], float] = time.time) -> DeviceBackend:
    """The NVML backend for `--nvml SPEC`; the exporter chooses all of a node's backends
    (`--device-backend`) in exporter/device/registry.py."""
    from exporter.device.nvml import NvmlBackend

    return NvmlBackend(load_nvml(spec, clock))


AMD_SIMULATIONS = ("mi300x-cpx-nps4", "mxgpu-host")


def load_amd_backend(spec: str, clock: Callable[[], float] = time.time,
                     node: str = "") -> DeviceBackend:
    """The AMD backend: `real` -> amdsmi, imported by the backend's first open() (a node
    without libamd_smi.so gets one line and retries); `sim:mi300x-cpx-nps4` or
    `sim:mxgpu-host` -> the simulated amdsmi (gpusim/amdsmi_sim.py)."""
    from exporter.device.amd import AmdBackend

    if spec == "real":
        return AmdBackend(node=node)
    name = spec[4:] if spec.startswith("sim:") else ""
    if name not in AMD_SIMULATIONS:
        raise ConfigError("--amdsmi", "amdsmi", "'real' or 'sim:NAME' with NAME one of "
                          + ", ".join(AMD_SIMULATIONS), spec)
    try:
        from gpusim.amdsmi_sim import SimAmdVf, mi300x_cpx_nps4, mxgpu_host
    except ModuleNotFoundError as err:
        raise ConfigError("--amdsmi", "sim:NAME", "the simulator package gpusim, which this "
                          "installation lacks (pip install -e '.[sim]')",
                          f"no module {err.name}") from None
    if name == "mi300x-cpx-nps4":
        sim = mi300x_cpx_nps4(clock=clock)
    else:  # four 48 GiB VFs per GPU, two of them lent to VMs
        vfs = [SimAmdVf(49_152, 8_192, "vm-a"), SimAmdVf(49_152, 30_720, "vm-b"),
               SimAmdVf(49_152), SimAmdVf(49_152)]
        sim = mxgpu_host(vfs=vfs, clock=clock)
    return AmdBackend(sim.as_api(), node=node)
