"""Which device backends the exporter runs: `--device-backend auto|nvml|amd|intel` (a comma
list names several). `auto` runs every backend whose library or devices answer on this node
(a node may have NVIDIA GPUs and an Intel iGPU) and says in one log line why each other one
is absent; an explicitly named backend that is absent is a one-line start-up error.

Each vendor's module has a `probe(spec: LoadSpec, auto: bool) -> DeviceBackend` that raises
`BackendAbsent` with one line of why: NVML here, `exporter.device.amd.probe` and
`exporter.device.intel.probe` when those modules exist (imported lazily, so a vendor library
is loaded only when its backend is asked for). A probe must not leave its library open: the
sampler opens, retries and closes each backend."""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from exporter.device.backends import Backends
from exporter.device.contract import DeviceBackend
from exporter.errors import ConfigError

log = logging.getLogger(__name__)

NAMES = ("nvml", "amd", "intel")


class BackendAbsent(Exception):
    """The backend's library or devices are not on this node; the message is one line."""


@dataclass(frozen=True)
class LoadSpec:
    """What a probe may read to build its backend."""

    nvml: str = "real"  # --nvml: 'real' or 'sim:SCENARIO.yaml'
    amdsmi: str = "real"  # --amdsmi: 'real' or 'sim:NAME' (exporter.nvml_loader.load_amd_backend)
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    # this node's name (--node-name): the node half of a GPU uuid that is not chip-derived
    node: str = ""
    clock: Callable[[], float] = field(default=time.time, compare=False)

    @property
    def scenario(self) -> str | None:
        """The simulated node's scenario file (--nvml sim:PATH), else None."""
        return self.nvml[4:] if self.nvml.startswith("sim:") and self.nvml[4:] else None


Probe = Callable[[LoadSpec, bool], DeviceBackend]


def _nvml(spec: LoadSpec, auto: bool) -> DeviceBackend:
    from exporter.device.nvml import NvmlBackend
    from exporter.nvml_loader import load_nvml

    try:
        nvml = load_nvml(spec.nvml, spec.clock)  # ConfigError for a bad --nvml
    except ImportError as err:  # an installation without pynvml
        raise BackendAbsent(f"pynvml is not installed ({err})") from None
    backend = NvmlBackend(nvml)
    if auto and spec.scenario is None:
        # present when NVML initialises, or sysfs has NVIDIA GPUs (a driver still loading:
        # the sampler retries it); named explicitly it always runs (the historic default)
        try:
            nvml.nvmlInit()
        except Exception as err:
            if not backend.expected_devices(spec.sysfs_root):
                raise BackendAbsent(f"NVML does not initialise ({err}) and sysfs lists no "
                                    "NVIDIA GPU") from None
        else:
            nvml.nvmlShutdown()
    return backend


def _module_probe(vendor: str) -> Probe:
    """The probe of exporter.device.<vendor>, found when it is called."""

    def probe(spec: LoadSpec, auto: bool) -> DeviceBackend:
        name = f"exporter.device.{vendor}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            raise BackendAbsent(f"this build has no {vendor} backend") from None
        return cast(Probe, module.probe)(spec, auto)

    return probe


PROBES: dict[str, Probe] = {"nvml": _nvml, "amd": _module_probe("amd"),
                            "intel": _module_probe("intel")}


def parse_choice(text: str) -> tuple[str, ...]:
    """'auto' -> ('auto',); 'nvml,intel' -> those; anything else a ValueError."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names != ("auto",) and (not names or any(n not in NAMES for n in names)):
        raise ValueError(text)
    return names


def load_backends(choice: str, spec: LoadSpec) -> Backends:
    """The node's backends for `--device-backend CHOICE`. Raises ConfigError (one line) for
    a bad choice, a bad --nvml, or a named backend that is absent."""
    try:
        names = parse_choice(choice)
    except ValueError:
        raise ConfigError("--device-backend", "", "auto or a comma list of "
                          f"{', '.join(NAMES)}", choice) from None
    auto = names == ("auto",)
    members: list[DeviceBackend] = []
    for name in NAMES if auto else names:
        try:
            members.append(PROBES[name](spec, auto))
        except BackendAbsent as err:
            if not auto:
                absent = ConfigError(f"--device-backend {name}", "", "its library or devices")
                absent.args = (f"--device-backend {name}: {err}",)
                raise absent from None
            log.info("device backend %s absent: %s", name, err)
    if not members:
        # Nothing answers (no GPU yet, a driver still loading): NVML, as before auto existed,
        # reports itself down and retries.
        log.info("no device backend answers: running NVML, which retries")
        try:
            members.append(_nvml(spec, False))
        except BackendAbsent as err:
            none = ConfigError("--device-backend auto", "", "a device backend")
            none.args = (f"--device-backend auto: no device backend on this node ({err})",)
            raise none from None
    return Backends(members)
