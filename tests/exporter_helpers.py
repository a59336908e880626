"""Helpers for exporter tests: build a Sampler on a simulated node with a manual clock."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import REGISTRY
from exporter.core import ExporterOptions
from exporter.device.nvml import NvmlBackend
from exporter.sampler import Sampler
from gpusim.cluster import ManualClock
from gpusim.node import write_sysfs_tree
from gpusim.nvml import SimNVML
from gpusim.scenario import loads_scenario

T0 = 1_790_000_000.0
_SYSFS_TREES: list[tempfile.TemporaryDirectory[str]] = []

SCENARIO = """
node: node-a
gpus:
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    power_limit_watts: 700
    nvlink_links: 2
    mig:
      - profile: 3g.40gb
      - profile: 2g.20gb
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
    not_supported: [memory_temperature]
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
pods:
  - namespace: ml
    name: trainer
    containers:
      - name: main
        gpus: [{gpu: 0, mig: 0}]
        processes: [{memory: 10GiB, sm_util: 0.5}]
  - namespace: ml
    name: infer
    containers:
      - name: main
        gpus: [{gpu: 1}]
        processes: [{memory: 4GiB, sm_util: 0.25}]
faults:
  - {gpu: 1, at: 1h, kind: lost}
xids:
  - {gpu: 0, at: 10m, xid: 13}
"""


def make_sampler(text: str = SCENARIO, *, without: tuple[str, ...] = ("attribution",),
                 threaded: bool = False) -> tuple[Sampler, ManualClock, SimNVML]:
    clock = ManualClock(T0)
    scenario = loads_scenario(text, "test.yaml")
    nvml = SimNVML(scenario, clock=clock, start=T0)
    specs = [s for s in REGISTRY if s.name not in without]
    sysfs = tempfile.TemporaryDirectory(prefix="gpu-ledger-sysfs-")
    _SYSFS_TREES.append(sysfs)  # removed at interpreter exit
    write_sysfs_tree(scenario, Path(sysfs.name))
    sampler = Sampler(NvmlBackend(nvml), ExporterOptions(node="node-a", interval=1.0,
                                            sysfs_root=sysfs.name),
                      specs, clock=clock, threaded=threaded)
    return sampler, clock, nvml


def samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def values(body: bytes, name: str, **match: str) -> list[float]:
    return [v for (n, labels), v in samples(body).items()
            if n == name and all((k, val) in labels for k, val in match.items())]
