"""Per-process SM utilisation: a process that computes in bursts reads its mean over the
interval, not its newest sample; the figures are kept consistent with the device's own
utilisation over the same periods (exporter/processes.py)."""

from __future__ import annotations

import pytest

from exporter.processes import reconcile
from gpusim.cluster import SimCluster
from gpusim.scenario import loads_scenario
from tests.exporter_helpers import T0, values

# GPU 0: a bursty process (0 to 4 % in a 4 s cycle: 2, 4, 2, 0 % on whole seconds) next to a
# steady one. GPU 1: the bursty one alone.
SCENARIO = """
node: node-a
gpus:
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
    sharing: {mode: time-slicing, replicas: 2}
  - model: NVIDIA A100-SXM4-80GB
    memory: 80GiB
    power_limit_watts: 400
pods:
  - namespace: ml
    name: light
    containers:
      - name: main
        gpus: [{gpu: 0, replica: 0}]
        processes: [{memory: 1GiB, sm_util: {sine: {min: 0, max: 0.04, period: 4s}}}]
  - namespace: ml
    name: steady
    containers:
      - name: main
        gpus: [{gpu: 0, replica: 1}]
        processes: [{memory: 1GiB, sm_util: 0.1}]
  - namespace: ml
    name: alone
    containers:
      - name: main
        gpus: [{gpu: 1}]
        processes: [{memory: 1GiB, sm_util: {sine: {min: 0, max: 0.04, period: 4s}}}]
"""
SM = "gpu_container_sm_utilization_ratio"


def test_bursty_process_reads_its_mean_not_its_newest_sample() -> None:
    """The cycle at t=63.5 s sees samples for t=49..63; the newest (t=63) reads 0 %, the
    mean over the 15 periods is 2 %. Before, the container read 0."""
    scenario = loads_scenario(SCENARIO, "bursty.yaml")
    with SimCluster([scenario], start=T0, collectors=("device", "attribution")) as cluster:
        body = b""
        for t in (T0 + 48.5, T0 + 63.5):
            for _, rendering in cluster.step(t):
                body = rendering.body(False, False)
    light = values(body, SM, pod="light")
    assert light == [pytest.approx(0.02, abs=0.002)]
    assert values(body, SM, pod="steady") == [pytest.approx(0.1)]
    # alone on GPU 1: it ran every kernel, so it reads the device's mean
    assert values(body, SM, pod="alone") == [pytest.approx(0.02, abs=0.002)]


def test_reconcile_rules() -> None:
    # the only process on a device gets the device figure, whatever its own samples said
    assert reconcile({7: 0.0}, 0.03) == {7: 0.03}
    assert reconcile({7: 0.5}, 0.4) == {7: 0.4}
    # overlapping processes (MPS) are scaled down to what the device was busy
    assert reconcile({1: 0.6, 2: 0.6}, 0.9) == pytest.approx({1: 0.45, 2: 0.45})
    # less than the device: left as measured (whose the rest is, nothing says)
    assert reconcile({1: 0.1, 2: 0.2}, 0.5) == {1: 0.1, 2: 0.2}
    # no device figure (not supported): as measured
    assert reconcile({1: 0.6, 2: 0.6}, None) == {1: 0.6, 2: 0.6}
    assert reconcile({}, 0.5) == {}
