"""The simulated cluster drives the real exporter code path; these check what it feeds the
exporter matches what a real cluster would."""

from __future__ import annotations

from pathlib import Path

from gpusim.cluster import SimCluster, mode_overrides
from gpusim.scenario import loads_scenario
from tests.exporter_helpers import samples

MIXED_MODES = """
node: n
gpus:
  - {model: NVIDIA A100-SXM4-80GB, memory: 80GiB, power_limit_watts: 400}
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
    sharing: {mode: time-slicing, replicas: 4}
pods:
  - namespace: a
    name: ex
    containers: [{name: c, gpus: [{gpu: 0}]}]
  - namespace: a
    name: ts
    containers: [{name: c, gpus: [{gpu: 1, replica: 2}]}]
"""


def test_exclusive_and_time_sliced_gpus_under_one_resource_name(tmp_path: Path) -> None:
    """Both GPUs sit under nvidia.com/gpu; the replica suffix in the device ID tells the
    exporter which is shared, so the simulation must not override it per resource name."""
    scenario = loads_scenario(MIXED_MODES, "mixed-modes.yaml")
    assert mode_overrides(scenario) == ()
    t0 = 1_790_000_000.0
    with SimCluster([scenario], start=t0, workdir=tmp_path) as cluster:
        (_, rendering), = list(cluster.step(t0 + 60))
    allocs = {dict(labels)["pod"]: dict(labels)
              for (name, labels), _ in samples(rendering.body(False, False)).items()
              if name == "gpu_container_allocation"}
    assert (allocs["ex"]["sharing"], allocs["ex"]["replicas"]) == ("exclusive", "1")
    assert (allocs["ts"]["sharing"], allocs["ts"]["replicas"]) == ("time-slicing", "4")


def test_mps_is_configured_because_ids_cannot_show_it() -> None:
    text = MIXED_MODES.replace("mode: time-slicing, replicas: 4",
                               "mode: mps, replicas: 4, resource: nvidia.com/gpu.shared")
    assert mode_overrides(loads_scenario(text, "mps.yaml")) == (("nvidia.com/gpu.shared", "mps"),)
