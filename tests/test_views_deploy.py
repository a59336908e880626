"""The optional OpenTelemetry hw.* view as a Kustomize component: a user's overlay on the base
with `components: [.../otel-hw]` gets a second PrometheusRule with only hw_* records, which the
Prometheus Operator's CRD schema accepts; the base alone has none of them."""

from __future__ import annotations

from pathlib import Path

from jsonschema import validate
from test_deploy_render import DEPLOY, crd_schema, kustomize, one, overlay, strict


def test_otel_component_adds_its_own_rule_group(tmp_path: Path) -> None:
    base_rule = one(kustomize(DEPLOY / "base"), "PrometheusRule")
    assert "gpu-ledger.otel-hw" not in [g["name"] for g in base_rule["spec"]["groups"]]
    # relative to the overlay's directory, tmp_path / "otel", as kustomize wants it
    rel = Path("../" * (len(tmp_path.relative_to("/").parts) + 1)) / DEPLOY.relative_to("/")
    directory = overlay(tmp_path, "otel", f"components:\n  - {rel / 'components' / 'otel-hw'}\n")
    rules = {o["metadata"]["name"]: o for o in kustomize(directory)
             if o["kind"] == "PrometheusRule"}
    assert sorted(rules) == ["gpu-ledger", "gpu-ledger-otel"]
    otel = rules["gpu-ledger-otel"]
    assert [g["name"] for g in otel["spec"]["groups"]] == ["gpu-ledger.otel-hw"]
    records = [r["record"] for r in otel["spec"]["groups"][0]["rules"]]
    assert records and all(r.startswith("hw_") for r in records)
    schema = strict(crd_schema("PrometheusRule"))
    schema["properties"]["metadata"] = {"type": "object"}
    validate(otel, schema)
