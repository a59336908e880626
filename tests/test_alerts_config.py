"""The alert configuration a user overrides (`python -m alerts.generate --config`): selectors
and thresholds change in the generated rules, the committed rule files stay as they are, bad
settings give one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from alerts.generate import scoped

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "alerts" / "gpu-ledger-alerts.yml"


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alerts.generate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def exprs(path: Path) -> dict[str, str]:
    doc = yaml.safe_load(path.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def test_override_changes_selectors_and_thresholds(tmp_path: Path) -> None:
    before = COMMITTED.read_text()
    config = tmp_path / "alerts-config.yaml"
    config.write_text('exporter_selector: job="acme-gpu", cluster="eu1"\n'
                      "gpu_temp_warning_c: 80\nexporter_down_for: 10m\n")
    out = tmp_path / "rules"
    out.mkdir()
    result = generate("--config", str(config), "--out", str(out))
    assert result.returncode == 0, result.stderr
    got = exprs(out / "gpu-ledger-alerts.yml")
    assert got["GpuExporterDown"] == 'up{job="acme-gpu", cluster="eu1"} == 0'
    assert got["GpuExporterAbsent"] == 'absent(up{job="acme-gpu", cluster="eu1"})'
    assert got["GpuTemperatureHigh"] == (
        'gpu_temperature_celsius{job="acme-gpu", cluster="eu1"} > 80')
    assert got["GpuNotAnswering"].startswith(
        'gpu_expected_devices{job="acme-gpu", cluster="eu1", source="pci"}')
    # every selector of the exporter's series carries the override (mixin-style selectors)
    for name, expr in got.items():
        # (gpu_ledger_*: the metering job's pushed series, selected by their own job label)
        for selector in re.findall(r'(?<![\w:"$.])(?:gpu_(?!ledger_)[a-z_]+|process_[a-z_]+|up)\b'
                                   r"(?!\s*\()(\{[^}]*\})?", expr):
            assert selector.startswith('{job="acme-gpu", cluster="eu1"'), (name, expr)
    assert "gpu-ledger-exporter" not in (out / "gpu-ledger-alerts.yml").read_text()
    doc = yaml.safe_load((out / "gpu-ledger-alerts.yml").read_text())
    (down,) = [r for g in doc["groups"] for r in g["rules"] if r["alert"] == "GpuExporterDown"]
    assert down["for"] == "10m"
    assert (out / "gpu-ledger-recording.yml").is_file()
    assert COMMITTED.read_text() == before


def test_bad_settings_are_one_line_errors(tmp_path: Path) -> None:
    out = tmp_path / "rules"
    out.mkdir()
    cases = {"gpu_temp_warnng_c: 80\n": "unknown setting 'gpu_temp_warnng_c'",
             "gpu_temp_warning_c: hot\n": "gpu_temp_warning_c: expected float",
             "- a list\n": "expected a mapping"}
    for text, message in cases.items():
        config = tmp_path / "c.yaml"
        config.write_text(text)
        result = generate("--config", str(config), "--out", str(out))
        assert result.returncode == 2
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list(out.iterdir()) == []
    # customised rules never overwrite the committed ones
    assert generate("--config", str(config)).returncode == 2


def test_scoped_adds_the_selector_to_exporter_series_only() -> None:
    sel = 'job="j", namespace="n"'
    assert scoped("absent(up)", sel) == 'absent(up{job="j", namespace="n"})'
    assert scoped('max_over_time(gpu_info[1h]) unless on (uuid) gpu_info{gpu="0"}', sel) == (
        'max_over_time(gpu_info{job="j", namespace="n"}[1h]) '
        'unless on (uuid) gpu_info{job="j", namespace="n", gpu="0"}')
    # recording rules, functions and label values are not exporter selectors
    assert scoped('container:gpu_used:gpus > 0 and group_left () x{a="gpu_up"}', sel) == (
        'container:gpu_used:gpus > 0 and group_left () x{a="gpu_up"}')
    assert scoped("gpu_up == 0", "") == "gpu_up == 0"
