"""The exposition renderer: escaping, both formats, and promtool's verdict on the output."""

from __future__ import annotations

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from exporter.core import SampleSink
from exporter.metricsdoc import TARGET, generate
from exporter.render import Rendering, format_value, pod_label_name, render

DEV = ("node-a", "0", "GPU-1", "NVIDIA H100 80GB HBM3", "nvidia")


def _sink() -> SampleSink:
    sink = SampleSink()
    sink.add("gpu_up", DEV, 1)
    sink.add("gpu_energy_joules_total", DEV, 1234.5)
    sink.add("gpu_info", (*DEV, "00000000:18:00.0", "550.54", "12.4", "96.00", "disabled", "none"),
             1)
    sink.add("gpu_container_processes", ("node-a", "ml", "train-0", "main", "GPU-1", ""), 2,
             (("app.kubernetes.io/name", "trainer"), ("team", "vision")))
    return sink


def test_text_format_parses_and_omits_empty_labels() -> None:
    text = render(_sink().samples).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    proc = fams["gpu_container_processes"].samples[0]
    assert "mig_uuid" not in proc.labels
    assert proc.labels["label_team"] == "vision"
    assert proc.labels["label_app_kubernetes_io_name"] == "trainer"
    assert fams["gpu_energy_joules"].type == "counter"
    assert fams["gpu_energy_joules"].samples[0].value == 1234.5


def test_openmetrics_format_parses_with_info_and_counter_families() -> None:
    text = render(_sink().samples, openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    fams = {f.name: f for f in om_parse(text)}
    assert fams["gpu"].type == "info"
    assert fams["gpu_energy_joules"].type == "counter"
    assert fams["gpu_energy_joules"].samples[0].name == "gpu_energy_joules_total"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_hostile_label_values_round_trip(value: str) -> None:
    sink = SampleSink()
    sink.add("gpu_container_processes", ("n", "ns", value, "c", "GPU-1", ""), 1,
             (("team", value),))
    for om in (False, True):
        text = render(sink.samples, openmetrics=om).decode()
        parse = om_parse if om else text_string_to_metric_families
        samples = [s for f in parse(text) for s in f.samples]
        assert len(samples) == 1
        assert samples[0].labels.get("pod", "") == value
        assert samples[0].labels.get("label_team", "") == value


def test_undeclared_family_or_wrong_arity_is_a_bug() -> None:
    sink = SampleSink()
    try:
        sink.add("gpu_up", ("only-node",), 1)
    except ValueError as err:
        assert "expected labels" in str(err)
    else:
        raise AssertionError("wrong label arity accepted")


def test_values_and_label_names() -> None:
    assert format_value(3.0) == "3"
    assert format_value(0.25) == "0.25"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("-inf")) == "-Inf"
    assert pod_label_name("example.com/team-name") == "label_example_com_team_name"


def test_rendering_gzip_is_cached_and_valid() -> None:
    import gzip

    r = Rendering(_sink().samples)
    gz = r.body(False, True)
    assert gz is r.body(False, True)
    assert gzip.decompress(gz) == r.body(False, False)


def test_promtool_accepts_output(tmp_path) -> None:
    path = tmp_path / "metrics.prom"
    path.write_bytes(render(_sink().samples))
    proc = subprocess.run(["promtool", "check", "metrics"], stdin=path.open("rb"),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_metrics_doc_is_current() -> None:
    assert TARGET.read_text() == generate(), "run `make generate` (python -m exporter.metricsdoc)"
