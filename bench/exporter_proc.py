"""`python -m bench.exporter_proc ARGS`: `gpu-ledger exporter ARGS` with the benchmark shim on
the simulated NVML (bench/simshim.py), so the process's CPU is the exporter's, not the
simulator's. Everything else is the unchanged exporter entry point."""

from __future__ import annotations

import sys
from typing import Any

import exporter.nvml_loader
from bench.simshim import memoize_processes
from gpu_ledger.cli import main as gpu_ledger_main

_load = exporter.nvml_loader.load_nvml


def _load_shimmed(spec: str, *args: Any, **kwargs: Any) -> Any:
    nvml = _load(spec, *args, **kwargs)
    if hasattr(nvml, "_timeline"):
        memoize_processes(nvml)
    return nvml


if __name__ == "__main__":
    exporter.nvml_loader.load_nvml = _load_shimmed
    sys.exit(gpu_ledger_main(["exporter", *sys.argv[1:]]))
