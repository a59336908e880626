"""Pick the NVML module the exporter talks to: the real `pynvml`, or a simulated one.

The exporter never knows which it has: both expose pynvml's functions, constants and errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exporter.errors import ConfigError


def load_nvml(spec: str, clock: Callable[[], float] = time.time) -> Any:
    """`real` -> the pynvml module; `sim:PATH` -> a SimNVML running the scenario at PATH.

    Raises ConfigError for an unknown spec or a malformed scenario file."""
    if spec == "real":
        import pynvml

        return pynvml
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
