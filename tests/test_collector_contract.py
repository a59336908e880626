"""The collector contract: no collector depends on another by table order, and the flags a user
can pass never leave a billing family silently empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.cli import build_parser
from gpusim.cluster import SimCluster
from tests.exporter_helpers import SCENARIO, make_sampler, samples, values

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_790_000_000.0


def test_attribution_alone_still_sees_process_memory() -> None:
    """Only device + attribution enabled (every other collector switched off): the per-container
    usage must still be the processes' memory, not 0 while attribution reports success."""
    scenario = ROOT / "gpusim" / "scenarios" / "a100-timeslice.yaml"
    with SimCluster([scenario], start=T0, collectors=("device", "attribution")) as cluster:
        body = b""
        for t in (T0 + 3600, T0 + 3610):
            for _, rendering in cluster.step(t):
                body = rendering.body(False, False)
    got = samples(body)
    used = [v for (n, _), v in got.items() if n == "gpu_container_memory_used_bytes"]
    procs = [v for (n, _), v in got.items() if n == "gpu_container_processes"]
    assert used and sum(used) > 0, "attribution emitted no process memory"
    assert sum(procs) > 0
    assert got[("gpu_exporter_collector_success",
                frozenset({("collector", "attribution")}))] == 1


def test_process_list_is_not_a_switchable_collector() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-collector.processes"])


def test_help_lists_the_no_collector_forms() -> None:
    text = build_parser().format_help()
    for name in ("device", "nvlink", "attribution"):
        assert f"--no-collector.{name}" in text


def test_nvml_error_classification_matches_pynvml_codes() -> None:
    import pynvml

    from exporter.nvmlcall import NvmlOutcome, classify

    expect = {
        "NOT_SUPPORTED": NvmlOutcome.UNSUPPORTED, "INVALID_ARGUMENT": NvmlOutcome.UNSUPPORTED,
        "FUNCTION_NOT_FOUND": NvmlOutcome.UNSUPPORTED, "NOT_FOUND": NvmlOutcome.NO_DATA,
        "NO_DATA": NvmlOutcome.NO_DATA, "GPU_IS_LOST": NvmlOutcome.LOST,
        "TIMEOUT": NvmlOutcome.TIMEOUT, "UNKNOWN": NvmlOutcome.FAILED,
        "NO_PERMISSION": NvmlOutcome.FAILED,
    }
    for name, outcome in expect.items():
        err = pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{name}"))
        assert classify(err) is outcome, name


def test_sampler_reads_only_the_protocol() -> None:
    """No name checks, isinstance pushes or getattr in the sampler: factories get their deps."""
    text = (ROOT / "exporter" / "sampler.py").read_text()
    for hidden in ("spec.name ==", "isinstance(", "getattr("):
        assert hidden not in text, hidden


def test_nvlink_counters_only_for_links_seen_active() -> None:
    """Link 1 is down from the start: no series until it comes up; once seen active it stays
    listed when it goes down again, so its error counts stay visible."""
    text = SCENARIO.replace("faults:\n", """faults:
  - {gpu: 0, at: 0s, kind: nvlink_down, link: 1, duration: 10m}
  - {gpu: 0, at: 20m, kind: nvlink_down, link: 1, duration: 10m}
""")
    sampler, clock, _ = make_sampler(text)
    body = sampler.cycle().body(False, False)
    assert len(values(body, "gpu_nvlink_errors_total", gpu="0", link="0")) == 4
    assert not values(body, "gpu_nvlink_errors_total", gpu="0", link="1")
    clock.now += 15 * 60
    body = sampler.cycle().body(False, False)
    assert len(values(body, "gpu_nvlink_errors_total", gpu="0", link="1")) == 4
    clock.now += 10 * 60  # down again
    body = sampler.cycle().body(False, False)
    assert len(values(body, "gpu_nvlink_errors_total", gpu="0", link="1")) == 4
