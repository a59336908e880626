"""Dashboards: the committed JSON is what the generator builds; UIDs, variables, datasources
and panel ids are stable and sane; queries name only contract metrics and recording rules."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as SdkDashboard

from dashboards.generate import BOARDS, SCHEMA_VERSION, expressions, outputs, schema_clean
from exporter.metrics import FAMILIES
from gpu_ledger.sharing import SharingMode
from metering import publish

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "alerts" / "gpu-ledger-recording.yml"
EXPECTED_UIDS = {"fleet.json": "gpu-ledger-fleet", "node.json": "gpu-ledger-node",
                 "workloads.json": "gpu-ledger-workloads", "cost.json": "gpu-ledger-cost"}


def _docs() -> dict[str, dict[str, Any]]:
    return {name: json.loads((ROOT / "dashboards" / name).read_text(encoding="utf-8"))
            for name in BOARDS}


def test_committed_json_is_current() -> None:
    stale = [p.name for p, text in outputs().items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    assert stale == [], f"run `python -m dashboards.generate`: {stale} differ"


def test_generation_is_deterministic() -> None:
    assert outputs() == outputs()


def test_stable_uids() -> None:
    assert {name: doc["uid"] for name, doc in _docs().items()} == EXPECTED_UIDS


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_variables(name: str) -> None:
    doc = _docs()[name]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"
            assert var["allValue"] == ".*"  # "All" must also match series without the label
    all_vars = {v for d in _docs().values() for v in
                (x["name"] for x in d["templating"]["list"])}
    assert {"datasource", "cluster", "node", "gpu", "namespace"} <= all_vars


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panels(name: str) -> None:
    doc = _docs()[name]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    declared = {v["name"] for v in doc["templating"]["list"]}
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {
                "__rate_interval", "__range", "__range_s", "__interval"}
            assert used <= declared, f"{panel['title']}: undeclared variables {used - declared}"


def test_queries_use_only_contract_metrics_and_recording_rules() -> None:
    known = {f.name for f in FAMILIES} | {"up"} | set(publish.METRICS)  # metering's push
    labels = {label for f in FAMILIES for label in f.labels}
    records = {r["record"] for g in yaml.safe_load(RECORDING.read_text())["groups"]
               for r in g["rules"]}
    for doc in _docs().values():
        for where, expr in expressions(doc):
            for name in re.findall(r"(?<![:\w])gpu_\w+(?![:\w])", expr):
                assert name in known or name in labels, f"{where}: {name} not in the contract"
            for name in re.findall(r"\b\w+:\w+:\w+\b", expr):
                assert name in records, f"{where}: {name} is not a recording rule"


def test_boards_cover_every_device_and_mig_family() -> None:
    """The node / GPU detail board shows every device, MIG and exporter family, and the
    Workloads board every vGPU family (process series are opt-in and churn, so they are left
    to ad-hoc queries)."""
    for board, collectors in (("node.json", None), ("workloads.json", ("vgpu",))):
        text = " ".join(expr for _, expr in expressions(_docs()[board]))
        wanted = [f.name for f in FAMILIES
                  if (f.collector in collectors if collectors
                      else f.collector not in ("attribution", "vgpu"))
                  and f.name != "gpu_exporter_source_error_info"]
        assert wanted
        missing = [n for n in wanted if not re.search(rf"(?<![:\w]){n}(?![:\w])", text)]
        assert missing == [], board


# --- what Grafana accepts ----------------------------------------------------------------------

def _all_panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [inner for p in doc["panels"] for inner in [p, *p.get("panels", [])]]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_no_null_options(name: str) -> None:
    """Grafana's dashboard validator rejects `"options": null` (grafana-foundation-sdk #1203):
    every visualisation carries an options object; rows carry none."""
    for panel in _all_panels(_docs()[name]):
        if panel["type"] == "row":
            assert "options" not in panel, panel["title"]
        else:
            assert isinstance(panel.get("options"), dict) and panel["options"], panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_current_schema_version_with_nothing_left_to_migrate(name: str) -> None:
    """schemaVersion is Grafana's latest, and the boards contain none of what Grafana's
    migrations 37-42 would still rewrite (so declaring 42 is honest)."""
    doc = _docs()[name]
    assert doc["schemaVersion"] == SCHEMA_VERSION == 42
    assert isinstance(doc["refresh"], str)                                     # V40
    assert "time_options" not in (doc.get("timepicker") or {})                 # V41
    for panel in _all_panels(doc):
        legend = (panel.get("options") or {}).get("legend")
        if legend is not None:                                                 # V37
            assert isinstance(legend, dict) and legend["showLegend"] is True
            assert legend["displayMode"] in ("list", "table")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
        assert "displayMode" not in custom                                     # V38
        assert all(t["id"] not in ("timeSeriesTable", "formatTime")            # V39, V43
                   for t in panel.get("transformations") or [])
        for override in panel.get("fieldConfig", {}).get("overrides", []):     # V42
            assert all(p["id"] != "custom.hideFrom" for p in override["properties"])


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_round_trip_through_the_sdk(name: str) -> None:
    """grafana-foundation-sdk reads the committed JSON back (`Dashboard.from_json`) and
    writes the same document once the fields Grafana's schema no longer has are dropped."""
    doc = _docs()[name]
    model = SdkDashboard.from_json(doc)
    assert model.schema_version == SCHEMA_VERSION
    assert schema_clean(json.loads(json.dumps(model, cls=JSONEncoder))) == doc


def test_a_panel_per_sharing_mode_and_dra() -> None:
    """Workloads shows allocated vs used for every sharing mode the exporter labels
    (gpu_ledger.sharing.SharingMode, vGPU included) and for DRA claims."""
    doc = _docs()["workloads.json"]
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"])
             for p in _all_panels(doc) if p["type"] == "timeseries"}
    for mode in SharingMode:
        titled = [t for t, e in exprs.items() if f'sharing="{mode}"' in e]
        assert len(titled) == 1, (mode, titled)
        assert "container:gpu_allocated:gpus" in exprs[titled[0]]
        assert "container:gpu_used:gpus" in exprs[titled[0]]
    assert any('resource!~".+/.+"' in e for t, e in exprs.items() if t.startswith("DRA"))


def test_top_waste_table() -> None:
    doc = _docs()["workloads.json"]
    [panel] = [p for p in _all_panels(doc) if p["title"].startswith("Top waste")]
    assert panel["type"] == "table"
    assert [t["id"] for t in panel["transformations"]] == ["merge"]
    assert all(t.get("instant") and t.get("format") == "table" for t in panel["targets"])
    assert panel["targets"][0]["expr"].startswith("topk(20, ")


# A job matcher with a literal value (`job="gpu-ledger-exporter"`, `job=~"a|b"`); one naming a
# dashboard variable (`job=~"$job"`) would follow the deployment.
HARD_CODED_JOB = re.compile(r'\bjob\s*(=~|!~|!=|=)\s*"(?!\$)')


def test_no_query_hard_codes_a_job() -> None:
    """A namePrefix overlay or a scrape job of another name must not empty a panel (issue
    15): no panel query or variable selects a fixed job value."""
    for doc in _docs().values():
        for where, expr in expressions(doc):
            assert not HARD_CODED_JOB.search(expr), f"{where}: {expr}"
    assert HARD_CODED_JOB.search('sum(up{job="gpu-ledger-exporter"})')  # the check can fail
    assert not HARD_CODED_JOB.search('up{job=~"$job"}')
