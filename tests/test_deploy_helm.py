"""deploy/helm/gpu-ledger through a real helm: `helm lint --strict` and `helm template` with the
defaults and every values file in examples/, each render validated like the Kustomize renders
(kubernetes-validate, the vendored CRD schemas; helpers from test_deploy_render). The chart and
the Kustomize base are one install: with the defaults (and the examples that mirror the shipped
overlays) `helm template` and `kubectl kustomize` give the same objects, compared field by field.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from exporter.cli import build_parser as exporter_parser
from tests.deploytools import helm
from tests.test_deploy_render import (
    CRD_SCHEMAS,
    DEPLOY,
    K8S_VERSIONS,
    METERING_OPTIONS,
    crd_schema,
    kustomize,
    overlay,
    strict,
    validate,
)

ROOT = DEPLOY.parent
CHART = DEPLOY / "helm" / "gpu-ledger"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
HELM = helm()


def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


@cache
def template(*args: str) -> tuple[dict[str, Any], ...]:
    out = helm_run("template", "gpu-ledger", str(CHART), *args)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d is not None)


def example(name: str) -> tuple[dict[str, Any], ...]:
    return template("-f", str(CHART / "examples" / name))


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def normalised(objects: tuple[dict[str, Any], ...], tool: str) -> dict[Any, Any]:
    """Objects by (kind, namespace, name), without the label naming the tool that applied
    them (checked to be that tool's)."""
    out = {}
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        labels = obj["metadata"].get("labels", {})
        assert labels.pop("app.kubernetes.io/managed-by") == tool, key(obj)
        out[key(obj)] = obj
    return out


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() | b.keys()):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'helm' if k in a else 'kustomize'}"
            found = first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: helm {a!r} != kustomize {b!r}"


def assert_same_objects(chart: tuple[dict[str, Any], ...],
                        kustomized: list[dict[str, Any]]) -> None:
    h, k = normalised(chart, "Helm"), normalised(tuple(kustomized), "kustomize")
    assert sorted(h) == sorted(k), (sorted(h.keys() - k.keys()), sorted(k.keys() - h.keys()))
    for name in h:
        diff = first_difference(h[name], k[name])
        assert diff is None, f"{name}: {diff}"


# The shipped Kustomize directories and the chart values that must render the same objects.
SAME = {
    "base": [],
    "overlays/no-prometheus-operator": ["-f", str(CHART / "examples/no-prometheus-operator.yaml")],
    "overlays/dcgm-compat": ["-f", str(CHART / "examples/dcgm-compat.yaml")],
    "overlays/otel-hw": ["-f", str(CHART / "examples/otel-hw.yaml")],
}


@pytest.mark.parametrize("directory", sorted(SAME))
def test_chart_and_kustomize_render_the_same_objects(directory: str) -> None:
    assert_same_objects(template(*SAME[directory]), kustomize(DEPLOY / directory))


def test_the_comparison_catches_a_difference() -> None:
    """A one-field change in the chart's render is found, with its path."""
    chart = json.loads(json.dumps(template()))
    (ds,) = [o for o in chart if o["kind"] == "DaemonSet"]
    ds["spec"]["template"]["spec"]["containers"][0]["args"][3] = "--interval=10s"
    with pytest.raises(AssertionError, match=r"containers\[0\]\.args\[3\]: helm '--interval=10s'"):
        assert_same_objects(tuple(chart), kustomize(DEPLOY / "base"))


def test_a_replaced_cost_model_gets_kustomizes_name(tmp_path: Path) -> None:
    """`--set-file metering.costModel` and a Kustomize overlay replacing the cost model give
    the same hashed ConfigMap name, and the CronJob mounts it."""
    model = tmp_path / "cost-model.yaml"
    model.write_text((ROOT / "cost-model.yaml").read_text().replace("# ", "#  ", 1))
    chart = template("--set-file", f"metering.costModel={model}")
    directory = overlay(tmp_path, "cost", "configMapGenerator:\n"
                        "  - name: gpu-ledger-cost-model\n    behavior: replace\n"
                        "    files:\n      - cost-model.yaml\n")
    (directory / "cost-model.yaml").write_text(model.read_text())
    kustomized = kustomize(directory)
    names = [{o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("gpu-ledger-cost-model-")}
             for objs in (chart, kustomized)]
    assert names[0] == names[1] and len(names[0]) == 1
    assert names[0] != {o["metadata"]["name"] for o in template() if o["kind"] == "ConfigMap"
                        and o["metadata"]["name"].startswith("gpu-ledger-cost-model-")}
    (cj,) = [o for o in chart if o["kind"] == "CronJob"]
    volumes = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"]
    assert {v["configMap"]["name"] for v in volumes if "configMap" in v} == names[0]


def test_the_packaged_chart_renders_the_same(tmp_path: Path) -> None:
    """`helm package` resolves files/'s links into the archive (what a chart repository
    serves), and takes nothing else from dashboards/; it renders the same."""
    out = helm_run("package", str(CHART), "-d", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (archive,) = tmp_path.glob("gpu-ledger-*.tgz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert not [n for n in names if n.endswith(".py") or n.endswith("kustomization.yaml")]
    rendered = helm_run("template", "gpu-ledger", str(archive))
    assert rendered.returncode == 0, rendered.stderr
    assert tuple(d for d in yaml.safe_load_all(rendered.stdout) if d) == template()


def test_metering_options_match_the_documented_overlay(tmp_path: Path) -> None:
    """The selector and cluster docs/operations.md sets with an overlay, set as chart values:
    the same objects, the merged ConfigMap's hashed name included."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"metering": {
        "selector": 'job="kubernetes-pods",app_kubernetes_io_name="gpu-ledger"',
        "cluster": "eu-west"}}))
    assert_same_objects(template("-f", str(values)),
                        kustomize(overlay(tmp_path, "metering-options", METERING_OPTIONS)))


# --- lint and validation of every values file --------------------------------------------


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint_strict(values: Path | None) -> None:
    out = helm_run("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda p: p.name if p else "defaults")
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_validate(values: Path | None, version: str) -> None:
    objects = template(*(["-f", str(values)] if values else []))
    for obj in objects:
        if obj["kind"] in CRD_SCHEMAS:
            schema = strict(crd_schema(obj["kind"]))
            schema["properties"]["metadata"] = {"type": "object"}
            validate(obj, schema)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {err.message} "
                                 f"at {list(err.path)}") from err


@pytest.mark.parametrize(("setting", "message"), [
    ("metering.shedule=0 3 * * *", "additional properties 'shedule' not allowed"),
    ("exporter.sharingModes.nvidia\\.com/gpu=mpss", "value must be one of"),
    ("metering.memoryLimit=1.5 gigs", "/metering/memoryLimit"),
])
def test_values_schema_refuses_a_mistake(setting: str, message: str) -> None:
    out = helm_run("template", "gpu-ledger", str(CHART), "--set", setting)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_memory_limit_pattern_accepts_what_metering_does() -> None:
    from metering.db import _SIZE

    pattern = json.loads((CHART / "values.schema.json").read_text())["properties"]["metering"][
        "properties"]["memoryLimit"]["pattern"]
    for value in ("1.5GB", "4GB", "512MiB", "70MB", "2 GiB", "1.5 gigs", "GB", "1.5"):
        assert bool(re.match(pattern, value)) == bool(_SIZE.match(value)), value


def test_examples_cover_the_options_users_set() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "no-prometheus-operator.yaml", "dcgm-compat.yaml", "otel-hw.yaml", "gpu-operator.yaml",
        "tls.yaml", "sharing.yaml", "reports-to-shared-volume.yaml", "reports-to-object-store.yaml"}


# --- what the options do ------------------------------------------------------------------


def one(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def exporter_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (c,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


def test_sharing_modes_labels_and_collectors_reach_the_exporter_cli() -> None:
    objects = example("sharing.yaml")
    ds = one(objects, "DaemonSet")
    command, *flags = exporter_container(objects)["args"]
    args = exporter_parser().parse_args(flags)
    assert command == "exporter"
    assert sorted(args.sharing_mode) == ["gpu.nvidia.com=time-slicing",
                                         "nvidia.com/gpu.shared=mps"]
    assert args.pod_labels == "team,cost-center"
    assert "--no-collector.vgpu" in flags
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"]["example.com/owner"] == "platform"
    # selectors stay as they were: a DaemonSet's selector is immutable
    assert ds["spec"]["selector"]["matchLabels"] == one(template(), "DaemonSet")[
        "spec"]["selector"]["matchLabels"]
    # helm merges maps: the GPU label stays unless the values set it to null
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true",
                                           "node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert len(pod["spec"]["tolerations"]) == 2


def test_tls_switches_probes_and_scrapes_to_https() -> None:
    objects = example("tls.yaml")
    c = exporter_container(objects)
    args = exporter_parser().parse_args(c["args"][1:])
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["web-config"]
    assert Path(args.web_config).parent == Path(mount)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"]
    volumes = one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "web-config", "secret": {"secretName": "gpu-ledger-web-config"}} in volumes


def test_gpu_operator_mode() -> None:
    objects = example("gpu-operator.yaml")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "PrometheusRule"] == [
        "gpu-ledger"]  # no DCGM_FI_* rules beside the Operator's dcgm-exporter
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in objects)


def test_dcgm_rules_beside_the_operators_dcgm_exporter_are_refused() -> None:
    out = helm_run("template", "gpu-ledger", str(CHART), "-f",
                   str(CHART / "examples/gpu-operator.yaml"), "--set", "dcgmCompat.enabled=true")
    assert out.returncode != 0
    assert "DCGM_FI_* series; turn one off" in out.stderr


def test_switches_leave_objects_out() -> None:
    objects = template("--set", "networkPolicy.enabled=false", "--set", "dashboards.enabled=false",
                       "--set", "metering.enabled=false", "--set", "createNamespace=false",
                       "--set", "namespace=observability")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"NetworkPolicy", "ConfigMap", "CronJob", "PersistentVolumeClaim",
                        "Namespace"}
    assert {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]} == {
        "observability"}
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "observability"


def fleet_rows() -> dict[int, str]:
    """docs/operations.md's "Sizing the metering job per fleet size" rows: GPUs -> the "set"
    column."""
    text = (ROOT / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| ([\d,]+) \|.*\| ([^|]+) \|$", text, re.M)
    return {int(gpus.replace(",", "")): setting for gpus, setting in rows}


@pytest.mark.parametrize("gpus", [10000, 20000, 40000, 80000])
def test_fleet_examples_follow_the_sizing_table(gpus: int) -> None:
    setting = fleet_rows()[gpus]
    limit = re.search(r"limit (\d+Gi)", setting)
    assert limit is not None, setting
    cj = one(example(f"fleet-{gpus}.yaml"), "CronJob")
    spec = cj["spec"]["jobTemplate"]["spec"]
    (c,) = spec["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == limit.group(1)
    env = {e["name"]: e.get("value") for e in c["env"]}
    if "GPU_LEDGER_TEMP_DIR" in setting:
        data = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["data"]
        assert Path(env["GPU_LEDGER_TEMP_DIR"] or "").is_relative_to(data)
    deadline = re.search(r"activeDeadlineSeconds` of (\d+) h", setting)
    if deadline:
        assert spec["activeDeadlineSeconds"] >= int(deadline.group(1)) * 3600


def test_default_metering_follows_the_small_fleet_rows() -> None:
    assert "defaults (limit 2Gi)" in fleet_rows()[1000]
    (c,) = one(template(), "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"]
    assert c["resources"]["limits"]["memory"] == "2Gi"


def test_chart_version_is_the_project_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    assert exporter_container(template())["image"] == f"ghcr.io/gpu-ledger/gpu-ledger:{version}"


# --- getting reports to people -------------------------------------------------------------


def run_publish_script(tmp_path: Path, script: str) -> Path:
    """The CronJob's script with its paths moved under tmp_path and a stub `gpu-ledger` whose
    `report` writes the month's files, as the real one does (docs/reports.md)."""
    data, publish, bin_dir = tmp_path / "data", tmp_path / "publish", tmp_path / "bin"
    for d in (data, publish, bin_dir):
        d.mkdir()
    stub = bin_dir / "gpu-ledger"
    stub.write_text('#!/bin/sh\n[ "$1" = report ] || exit 0\n'
                    'while [ $# -gt 0 ]; do case "$1" in --out) out=$2;; --month) m=$2;; esac;'
                    ' shift; done\nmkdir -p "$out"\n'
                    'for e in csv md html parquet; do echo x > "$out/chargeback-$m.$e"; done\n'
                    'echo old > "$out/chargeback-2020-01.csv"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    moved = script.replace("/var/lib/gpu-ledger", str(data)).replace("/publish", str(publish))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PROMETHEUS_URL": "http://p:9090",
           "MONTH": "2026-10"}
    subprocess.run(["/bin/sh", "-c", moved], env=env, check=True, capture_output=True,
                   timeout=30)
    return publish


def test_reports_are_copied_to_the_shared_volume(tmp_path: Path) -> None:
    cj = one(example("reports-to-shared-volume.yaml"), "CronJob")
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "publish", "mountPath": "/publish"} in c["volumeMounts"]
    assert {"name": "publish", "persistentVolumeClaim": {"claimName": "finance-reports"}} in (
        pod["volumes"])
    published = run_publish_script(tmp_path, c["args"][0])
    assert sorted(p.name for p in published.iterdir()) == [
        f"chargeback-2026-10.{e}" for e in ("csv", "html", "md", "parquet")]


def test_reports_are_synced_by_a_container_after_metering() -> None:
    cj = one(example("reports-to-object-store.yaml"), "CronJob")
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (metering,) = pod["initContainers"]
    (publish,) = pod["containers"]
    assert metering["name"] == "metering" and publish["name"] == "publish"
    reports = next(m for m in publish["volumeMounts"] if m["mountPath"] == "/reports")
    assert reports == {"name": "data", "mountPath": "/reports", "subPath": "reports",
                       "readOnly": True}
    # the report step writes where the publishing container reads
    assert "--out /var/lib/gpu-ledger/reports" in metering["args"][0]
    assert {"name": "tmp", "mountPath": "/tmp"} in publish["volumeMounts"]
    assert publish["args"][:2] == ["s3", "sync"] and publish["args"][2] == "/reports"
