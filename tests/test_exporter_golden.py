"""Golden files of the full exposition for each example scenario, through the whole exporter
(simulated NVML, real PodResources gRPC server, real pod watch, cgroup files). Regenerate with
`UPDATE_GOLDEN=1 pytest tests/test_exporter_golden.py` and review the diff."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from gpusim.cluster import SimCluster

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = sorted((ROOT / "gpusim" / "scenarios").glob("*.yaml"))
T0 = 1_790_000_000.0
# Values that legitimately change run to run: how long a collector took, the Python version,
# the test process's own memory, CPU, descriptors and start time.
_VOLATILE = [
    (re.compile(r"^(gpu_exporter_collector_duration_seconds\{[^}]*\}) .*$", re.M), r"\1 0"),
    (re.compile(r"^(process_[a-z_]+) .*$", re.M), r"\1 0"),
    (re.compile(r'python_version="[^"]*"'), 'python_version="<py>"'),
]


def normalise(text: str) -> str:
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text


def exposition(scenario: Path, openmetrics: bool) -> str:
    """Three cycles (GPM needs two samples), 2h into the scenario."""
    with SimCluster([scenario], start=T0) as cluster:
        body = b""
        for t in (T0 + 7200 - 20, T0 + 7200 - 10, T0 + 7200):
            for _, rendering in cluster.step(t):
                body = rendering.body(openmetrics, False)
    return normalise(body.decode())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_golden_exposition(scenario: Path, tmp_path: Path) -> None:
    assert SCENARIOS, "no example scenarios found"
    for openmetrics, suffix in ((False, ".prom"), (True, ".om")):
        got = exposition(scenario, openmetrics)
        golden = GOLDEN / f"{scenario.stem}{suffix}"
        if os.environ.get("UPDATE_GOLDEN"):
            golden.write_text(got)
        assert golden.exists(), f"missing {golden}: run with UPDATE_GOLDEN=1"
        assert got == golden.read_text(), f"{golden.name} differs: UPDATE_GOLDEN=1 and review"
    # promtool lints the text format the way Prometheus users will.
    proc = subprocess.run(["promtool", "check", "metrics"],
                          input=(GOLDEN / f"{scenario.stem}.prom").read_bytes(),
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_goldens_cover_the_contract() -> None:
    """Across the example scenarios, every declared family appears at least once, except
    the opt-in per-process families and the error info that only a down source shows
    (covered by tests/test_exporter_faults.py)."""
    from exporter.metrics import FAMILIES

    text = "".join((GOLDEN / f"{p.stem}.prom").read_text() for p in SCENARIOS)
    # fractional grants come from pod annotations the scenario format cannot express yet:
    # covered by tests/test_attr_collector.py::test_fractional_grants_from_annotations
    not_in_scenarios = {"gpu_exporter_source_error_info", "gpu_container_memory_fraction",
                        "gpu_container_core_fraction",
                        # only past the pod cache's bounds: tests/test_kube_limits.py
                        "gpu_exporter_kube_objects_dropped_total",
                        # AMD RAS events: no NVIDIA scenario has them (until the AMD
                        # simulator's): tests/test_device_backends.py
                        "gpu_error_events_total", "gpu_error_event_last_timestamp_seconds",
                        "gpu_ras_errors_total",
                        # Intel tiles' busy share (Level Zero) and energy (i915 gt hwmon,
                        # Level Zero): tests/test_intel_tiles.py
                        "gpu_partition_utilization_ratio", "gpu_partition_energy_joules_total"}
    missing = [f.name for f in FAMILIES
               if not f.name.startswith("gpu_process_")
               and f.name not in not_in_scenarios and f"\n{f.name}" not in "\n" + text]
    assert not missing, f"families never emitted by any example scenario: {missing}"
