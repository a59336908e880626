"""Alert and recording rules: current with their generator, valid for promtool, proven by
promtool unit tests, and complete (severity, summary, description, runbook with a real anchor,
a firing and a silent case for every alert, only metric names from the exporter's contract)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.generate import DEFAULT_CONFIG
from exporter.metrics import FAMILIES
from metering import publish

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts" / "gpu-ledger-alerts.yml"
RECORDING = ROOT / "alerts" / "gpu-ledger-recording.yml"
UNIT_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PROMTOOL = "/usr/bin/promtool"
RUNBOOK_PREFIX = "https://github.com/gpu-ledger/gpu-ledger/blob/main/docs/runbooks.md#"


def _rules(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return _rules(ALERTS)


def _github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_rule_files_match_generator() -> None:
    proc = subprocess.run([sys.executable, "-m", "alerts.generate", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_promtool_check_rules() -> None:
    proc = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS), str(RECORDING)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no promtool unit tests under alerts/tests"
    proc = subprocess.run([PROMTOOL, "test", "rules", *map(str, UNIT_TESTS)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(UNIT_TESTS), proc.stdout


@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_alert_metadata(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    ann = rule["annotations"]
    assert ann["summary"].strip()
    assert "{{" in ann["description"], "the description should name the series it is about"
    url = ann["runbook_url"]
    assert url.startswith(RUNBOOK_PREFIX)
    headings = {_github_anchor(m) for m in
                re.findall(r"^#+\s+(.+)$", RUNBOOKS.read_text(encoding="utf-8"), re.M)}
    assert url[len(RUNBOOK_PREFIX):] in headings, f"no runbook section for {rule['alert']}"


@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_gpu_alerts_name_gpu_node_and_pods(rule: dict[str, Any]) -> None:
    if any(m in rule["expr"] for m in ("gpu_exporter", "up{", "process_", "gpu_expected_devices")):
        return  # alerts on the exporter itself name its instance instead
    if "gpu_ledger_" in rule["expr"]:
        return  # alerts on metering's pushed state name the team or cluster instead
    desc = rule["annotations"]["description"]
    for part in ("$labels.gpu", "$labels.node", "$labels.uuid", "gpu_container_allocation"):
        assert part in desc


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {r["alert"] for r in _alerts()}
    assert names - fires == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown staying silent"


def test_runbook_has_a_section_per_alert_and_no_orphans() -> None:
    sections = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(encoding="utf-8"), re.M))
    assert sections == {r["alert"] for r in _alerts()}


def test_expressions_use_only_contract_metrics() -> None:
    """Rules may only read the exporter's families, Prometheus's `up`, and each other."""
    known = {f.name for f in FAMILIES} | {"up", publish.JOB} | set(publish.METRICS)  # metering
    label_names = {label for f in FAMILIES for label in f.labels}
    records = {r["record"] for r in _rules(RECORDING)}
    for rule in _alerts() + _rules(RECORDING):
        text = rule["expr"] + " " + rule.get("annotations", {}).get("description", "")
        for name in re.findall(r"(?<![:\w])gpu_\w+(?![:\w])", text):
            assert name in known or name in label_names, f"{name} is not in the contract"
        for name in re.findall(r"\b\w+:\w+:\w+\b", text):
            assert name in records, f"{name} is not a recording rule"
        assert "free" not in rule["expr"] or "alert" not in rule, \
            "memory alerts divide used by total, never by free"


def test_thresholds_come_from_one_table() -> None:
    """The job matcher appears in the rules only as generated from Config.exporter_selector."""
    text = ALERTS.read_text(encoding="utf-8")
    assert 'up{job="gpu-ledger-exporter"}' in text
    # ... and, in the metering alerts, from Config.metering_selector: the job meter pushes as
    assert DEFAULT_CONFIG.metering_selector == f'job="{publish.JOB}"'
    assert text.count("job=") == (text.count('job="gpu-ledger-exporter"')
                                  + text.count(DEFAULT_CONFIG.metering_selector))
