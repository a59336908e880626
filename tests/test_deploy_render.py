"""deploy/ through the real tools: `kubectl kustomize` renders the base and every overlay,
kubernetes-validate checks each core object strictly against the Kubernetes OpenAPI schemas,
and the ServiceMonitor and PrometheusRule are checked against the Prometheus Operator's CRD
schemas (vendored in deploy/schemas/). Overlays that move the namespace or prefix the names
must keep scraping and alerting: the ServiceMonitor finds the Service, and the job label
Prometheus gives the targets is the one the alert rules select."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from alerts.generate import DEFAULT_CONFIG
from metering import publish
from tests.deploytools import kubectl

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"
# Oldest and newest Kubernetes minor the manifests must be valid for (CronJob timeZone is GA
# from 1.27).
K8S_VERSIONS = ("1.27.0", "1.37.0")
CRD_SCHEMAS = {"ServiceMonitor": "servicemonitor-v1.json",
               "PrometheusRule": "prometheusrule-v1.json"}

KUBECTL = kubectl()


def kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(KUBECTL), "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def overlay(tmp: Path, name: str, body: str) -> Path:
    """A user's overlay on the base, the way docs/operations.md shows it."""
    directory = tmp / name
    directory.mkdir()
    rel = Path("../" * len(directory.relative_to("/").parts)) / DEPLOY.relative_to("/") / "base"
    (directory / "kustomization.yaml").write_text(f"resources:\n  - {rel}\n{body}")
    return directory


@cache
def rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(directory))


SHIPPED = [DEPLOY / "base", *sorted(p for p in (DEPLOY / "overlays").iterdir() if p.is_dir())]


@pytest.mark.parametrize("directory", SHIPPED, ids=lambda p: p.name)
def test_every_kustomization_renders(directory: Path) -> None:
    objects = rendered(directory)
    assert {o["kind"] for o in objects} >= {"DaemonSet", "Service", "CronJob"}


@pytest.mark.parametrize("directory", SHIPPED, ids=lambda p: p.name)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_strictly(directory: Path, version: str) -> None:
    core = [o for o in rendered(directory) if o["kind"] not in CRD_SCHEMAS]
    assert core
    for obj in core:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {err.message} "
                                 f"at {list(err.path)}") from err


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / CRD_SCHEMAS[kind]).read_text())
    return schema


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server prunes them (a typo in
    a ServiceMonitor field would otherwise pass and then silently vanish)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        if isinstance(out.get("pattern"), str):
            # RE2 takes `^(?i)...`; Python wants inline flags first (same meaning)
            out["pattern"] = re.sub(r"^\^\(\?(\w+)\)", r"(?\1)^", out["pattern"])
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def validate(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    """OpenAPI v3 schemas are JSON Schema draft 4 with extensions (x-kubernetes-*), which
    jsonschema ignores as unknown keywords."""
    jsonschema.Draft4Validator(schema).validate(obj)


@pytest.mark.parametrize("kind", sorted(CRD_SCHEMAS))
def test_operator_objects_validate_against_the_crd_schemas(kind: str) -> None:
    (obj,) = [o for o in rendered(DEPLOY / "base") if o["kind"] == kind]
    schema = strict(crd_schema(kind))
    # metadata is the API server's ObjectMeta, not part of the CRD's schema
    schema["properties"]["metadata"] = {"type": "object"}
    validate(obj, schema)


def test_crd_validation_catches_a_misspelt_field() -> None:
    (sm,) = [o for o in rendered(DEPLOY / "base") if o["kind"] == "ServiceMonitor"]
    bad = json.loads(json.dumps(sm))
    bad["spec"]["endpoints"][0]["honourLabels"] = True
    schema = strict(crd_schema("ServiceMonitor"))
    schema["properties"]["metadata"] = {"type": "object"}
    with pytest.raises(jsonschema.ValidationError, match="honourLabels"):
        validate(bad, schema)


def test_vendored_schemas_keep_their_licence_and_refresh_command() -> None:
    assert "Apache License" in (SCHEMAS / "LICENSE").read_text()
    for name in CRD_SCHEMAS.values():
        comment = json.loads((SCHEMAS / name).read_text())["$comment"]
        assert "deploy/schemas/refresh.py" in comment
    assert "deploy/schemas/refresh.py" in (ROOT / "Makefile").read_text()


# --- overrides a platform engineer applies ---------------------------------------------------


def one(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def scrape_job(objects: tuple[dict[str, Any], ...]) -> tuple[str, str]:
    """(namespace, job) of the targets Prometheus Operator makes from the ServiceMonitor:
    it looks in the namespaces of namespaceSelector (its own when absent), for Services whose
    labels match; the job is the Service label named by jobLabel, else the Service name."""
    sm, svc = one(objects, "ServiceMonitor"), one(objects, "Service")
    sel = sm["spec"].get("namespaceSelector", {})
    namespaces = sel.get("matchNames", [sm["metadata"]["namespace"]])
    assert sel.get("any") or svc["metadata"]["namespace"] in namespaces, "Service not watched"
    labels = svc["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= labels.items(), "Service not selected"
    job_label = sm["spec"].get("jobLabel")
    job = labels[job_label] if job_label in labels else svc["metadata"]["name"]
    return svc["metadata"]["namespace"], job


def alert_job_values(objects: tuple[dict[str, Any], ...]) -> set[str]:
    rule = one(objects, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return set(re.findall(r'job="([^"]*)"', "\n".join(exprs)))


OVERRIDES = {
    "namespace": "namespace: monitoring\n",
    "name-prefix": "namePrefix: acme-\n",
    "both": "namespace: monitoring\nnamePrefix: acme-\nnameSuffix: -v2\n",
}


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_overrides_keep_scraping_and_alerting(tmp_path: Path, name: str) -> None:
    objects = tuple(kustomize(overlay(tmp_path, name, OVERRIDES[name])))
    namespace, job = scrape_job(objects)
    if "namespace:" in OVERRIDES[name]:
        assert namespace == "monitoring"
    # the exporter's alerts select exactly the job the targets get; the metering alerts the
    # job label the metering run pushes (kept by honor_labels, whatever the deploy is named)
    assert alert_job_values(objects) == {job, publish.JOB}
    assert f'job="{job}"' in DEFAULT_CONFIG.exporter_selector
    # the exporter's ServiceAccount is the one bound to its ClusterRole
    binding, ds = one(objects, "ClusterRoleBinding"), one(objects, "DaemonSet")
    (subject,) = binding["subjects"]
    pod = ds["spec"]["template"]["spec"]
    assert subject == {"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                       "namespace": ds["metadata"]["namespace"]}
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    assert pod["priorityClassName"] == one(objects, "PriorityClass")["metadata"]["name"]


def test_daemonset_carries_priority_and_image_annotations() -> None:
    objects = rendered(DEPLOY / "base")
    ds = one(objects, "DaemonSet")
    template = ds["spec"]["template"]
    assert template["spec"]["priorityClassName"] == "gpu-ledger-node"
    pc = one(objects, "PriorityClass")
    assert 0 < pc["value"] < 1_000_000_000 and pc["globalDefault"] is False
    annotations = template["metadata"]["annotations"]
    assert annotations["org.opencontainers.image.source"].startswith("https://")
    dockerfile = (ROOT / "Dockerfile").read_text()
    for key, value in annotations.items():
        if key.startswith("org.opencontainers.image."):
            assert f'{key}="{value}"' in dockerfile


def test_packaging_metadata_has_no_setuptools_deprecation() -> None:
    """`pip install` printed a deprecation warning for a `project.license` table; an SPDX
    string (setuptools >= 77) is the current form."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught if "license" in str(w.message).lower()] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_dcgm_component_adds_its_own_rule_group() -> None:
    """The optional DCGM-compatible rules come only with the component (the dcgm-compat
    overlay), as a second PrometheusRule that the Operator's CRD schema accepts."""
    base_rule = one(rendered(DEPLOY / "base"), "PrometheusRule")
    assert "gpu-ledger.dcgm-compat" not in [g["name"] for g in base_rule["spec"]["groups"]]
    rules = {o["metadata"]["name"]: o for o in rendered(DEPLOY / "overlays" / "dcgm-compat")
             if o["kind"] == "PrometheusRule"}
    assert sorted(rules) == ["gpu-ledger", "gpu-ledger-dcgm"]
    dcgm = rules["gpu-ledger-dcgm"]
    assert [g["name"] for g in dcgm["spec"]["groups"]] == ["gpu-ledger.dcgm-compat"]
    records = [r["record"] for r in dcgm["spec"]["groups"][0]["rules"]]
    assert records and all(r.startswith("DCGM_FI_") for r in records)
    schema = strict(crd_schema("PrometheusRule"))
    schema["properties"]["metadata"] = {"type": "object"}
    validate(dcgm, schema)


# docs/performance.md, "DaemonSet resources" and "On a GPU node": RSS in the production
# configuration on the machine without a GPU, and its peak on the H100 node; CPU at the 5 s
# interval on the big node (percent of a core).
PRODUCTION_RSS_MIB = 32.7
GPU_NODE_PEAK_MIB = 70.8
BIG_NODE_CPU_PERCENT = 1.63


def _quantity(text: str) -> float:
    """A Kubernetes quantity as MiB (memory) or millicores (cpu)."""
    units = {"Mi": 1.0, "Gi": 1024.0, "m": 1.0}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text) * 1000  # whole cores


def test_daemonset_resources_follow_the_measured_figures() -> None:
    perf = (ROOT / "docs" / "performance.md").read_text()
    for figure in (f"**{PRODUCTION_RSS_MIB} MiB**", f"peak {GPU_NODE_PEAK_MIB} MiB in the "
                   "production\n  configuration", f"{BIG_NODE_CPU_PERCENT} %"):
        assert figure in perf, figure
    # A big MIG node is not measured on a GPU: the request keeps 1.5 times the one-GPU peak.
    gpu_node_worst = 1.5 * GPU_NODE_PEAK_MIB
    (container,) = [c for c in one(rendered(DEPLOY / "base"), "DaemonSet")["spec"]["template"]
                    ["spec"]["containers"] if c["name"] == "exporter"]
    res = container["resources"]
    assert _quantity(res["requests"]["memory"]) >= gpu_node_worst
    assert _quantity(res["limits"]["memory"]) >= 1.5 * gpu_node_worst
    assert _quantity(res["requests"]["cpu"]) >= 3 * BIG_NODE_CPU_PERCENT * 10  # % -> millicores
    assert _quantity(res["limits"]["cpu"]) >= _quantity(res["requests"]["cpu"])


# The overlay docs/operations.md ("Metering options") shows: the CronJob's selector and cluster
# set through the metering ConfigMap, no generated or base file edited.
METERING_OPTIONS = """\
configMapGenerator:
  - name: gpu-ledger-metering
    behavior: merge
    literals:
      - selector=job="kubernetes-pods",app_kubernetes_io_name="gpu-ledger"
      - cluster=eu-west
"""


def cronjob_env(objects: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The metering container's environment as the kubelet builds it: values, and ConfigMap
    keys (a missing key of an `optional` reference leaves the variable unset)."""
    (cronjob,) = [o for o in objects if o["kind"] == "CronJob"]
    (ctr,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for e in ctr["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        ref = e["valueFrom"]["configMapKeyRef"]
        data = maps[ref["name"]]  # a ConfigMap that is not rendered would stop the pod
        if ref["key"] in data:
            env[e["name"]] = data[ref["key"]]
        else:
            assert ref.get("optional") is True, f"{e['name']}: {ref['key']} missing"
    return env


def meter_options(env: dict[str, str]) -> tuple[str, Any]:
    """The selector and cluster scope the CronJob's `meter` line runs with under `env`."""
    from metering import cli_meter
    from metering.selector import DEFAULT_SELECTOR, Selector

    args = cli_meter.build_parser().parse_args(
        ["--prometheus", env["PROMETHEUS_URL"], "--month", "2026-10"])
    cli_meter.apply_source_env(args, env)
    selector = DEFAULT_SELECTOR if args.selector is None else Selector.parse(args.selector)
    return str(selector), cli_meter._cluster_scope(args)


def test_the_shipped_cronjob_meters_with_the_default_selector_and_cluster() -> None:
    from metering.cluster import ClusterScope

    env = cronjob_env(rendered(DEPLOY / "base"))
    assert not {"GPU_LEDGER_SELECTOR", "GPU_LEDGER_CLUSTER"} & env.keys()
    assert meter_options(env) == ('{job=~"gpu-ledger-exporter|"}', ClusterScope())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_an_overlay_sets_the_cronjobs_selector_and_cluster(tmp_path: Path, version: str) -> None:
    from metering.cli_meter import SOURCE_ENV
    from metering.cluster import ClusterScope

    assert METERING_OPTIONS in (ROOT / "docs" / "operations.md").read_text()
    objects = tuple(kustomize(overlay(tmp_path, "metering-options", METERING_OPTIONS)))
    for obj in objects:
        if obj["kind"] not in CRD_SCHEMAS:
            kubernetes_validate.validate(obj, version, strict=True)
    env = cronjob_env(objects)
    assert env["PROMETHEUS_URL"] == "http://prometheus-operated.monitoring.svc:9090"  # kept
    assert {env[v] for v in (SOURCE_ENV["selector"], SOURCE_ENV["cluster"])} == {
        'job="kubernetes-pods",app_kubernetes_io_name="gpu-ledger"', "eu-west"}
    assert meter_options(env) == (
        '{job="kubernetes-pods",app_kubernetes_io_name="gpu-ledger"}', ClusterScope("eu-west"))
