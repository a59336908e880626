"""deploy/ (Kustomize base and overlay) and the Dockerfile: every manifest parses and
round-trips through the `kubernetes` client's models, names and labels line up, the generated
copies are current, container args parse with the real CLIs, the CronJob's shell script runs."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from alerts.generate import DEFAULT_CONFIG
from exporter.cli import build_parser as exporter_parser
from exporter.cli import parse_listen
from gpu_ledger.cli import COMMANDS
from metering.cli_close import build_parser as close_parser
from metering.cli_meter import build_parser as meter_parser
from metering.report import cli as report_cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "no-prometheus-operator"

# kind -> the kubernetes client model that must accept it
MODELS = {
    "DaemonSet": "V1DaemonSet", "Service": "V1Service", "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole", "ClusterRoleBinding": "V1ClusterRoleBinding",
    "CronJob": "V1CronJob", "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    "ConfigMap": "V1ConfigMap", "Namespace": "V1Namespace", "NetworkPolicy": "V1NetworkPolicy",
    "PriorityClass": "V1PriorityClass",
}


def load_generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_generate", DEPLOY / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_yaml(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    doc = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def generator_files(entry: dict[str, Any]) -> list[str]:
    """configMapGenerator `files`: `path` or `key=path`."""
    return [f.split("=", 1)[-1] for f in entry.get("files", [])]


def base_objects(directory: Path = BASE) -> list[dict[str, Any]]:
    """The objects a kustomization's resources hold (files and nested kustomizations), plus a
    ConfigMap for each generator: enough of `kustomize build` to check names and labels."""
    k = kustomization(directory)
    out: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        path = directory / res
        out += base_objects(path) if path.is_dir() else load_yaml(path)
    for gen in k.get("configMapGenerator", []):
        data = {}
        for spec in gen.get("files", []):
            key, _, rel = spec.rpartition("=")
            rel_path = directory / rel
            data[key or rel_path.name] = rel_path.read_text(encoding="utf-8")
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"], "namespace": "gpu-ledger",
                                  "labels": (gen.get("options") or {}).get("labels", {})},
                     "data": data})
    return out


OBJECTS = base_objects()


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in OBJECTS if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


DAEMONSET = one("DaemonSet")
DS_POD = DAEMONSET["spec"]["template"]["spec"]
DS_CONTAINER = container(DS_POD)
CRONJOB = one("CronJob")
CJ_POD = CRONJOB["spec"]["jobTemplate"]["spec"]["template"]["spec"]
CJ_CONTAINER = container(CJ_POD)


# --- files ---------------------------------------------------------------------------------


def test_every_manifest_parses() -> None:
    # files/ holds data for generators (the cost model), not manifests; the Helm chart holds
    # templates and values (tests/test_deploy_helm.py renders it)
    files = sorted(p for p in DEPLOY.rglob("*.yaml")
                   if not {"files", "helm"} & set(p.relative_to(DEPLOY).parts))
    assert len(files) >= 10
    for path in files:
        docs = load_yaml(path)
        assert docs, f"{path}: no document"
        for doc in docs:
            assert isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc, path


@pytest.mark.parametrize("directory", [BASE, ROOT / "dashboards", OVERLAY],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_kustomization_lists_files_that_exist(directory: Path) -> None:
    k = kustomization(directory)
    for res in k.get("resources", []):
        path = (directory / res).resolve()
        assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{directory}: {res}"
    for gen in k.get("configMapGenerator", []):
        for rel in generator_files(gen):
            assert (directory / rel).is_file(), f"{directory}: {gen['name']}: {rel}"
            # kustomize's default load restrictor: nothing outside the kustomization's root
            assert (directory / rel).resolve().is_relative_to(directory.resolve())
    if directory == BASE:
        listed = {r for r in k["resources"] if r.endswith(".yaml")}
        on_disk = {p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert listed == on_disk, "every manifest in deploy/base is listed, and only those"


def test_generated_copies_are_current() -> None:
    gen = load_generate()
    assert gen.stale() == [], "run `python deploy/generate.py`"


def test_generate_check_flags_a_stale_copy(tmp_path: Path) -> None:
    gen = load_generate()
    dirs = {"base": tmp_path / "base", "dashboards": tmp_path / "dashboards"}
    gen.write(**dirs)
    assert gen.stale(**dirs) == []
    (dirs["base"] / "files" / "cost-model.yaml").write_text("version: 1\n")
    (dirs["dashboards"] / "kustomization.yaml").write_text("{}")
    # a copy of a dashboard where they were copied before: they are committed once now
    (dirs["base"] / "dashboards").mkdir()
    (dirs["base"] / "dashboards" / "fleet.json").write_text("{}")
    assert gen.stale(**dirs) == ["files/cost-model.yaml", "../../dashboards/kustomization.yaml",
                                 "dashboards/fleet.json"]
    gen.write(**dirs)
    assert gen.stale(**dirs) == []
    assert not (dirs["base"] / "dashboards").exists()


def test_chart_dashboard_links_are_current(tmp_path: Path) -> None:
    """The chart reads each dashboard through a link (deploy/generate.py keeps them)."""
    gen = load_generate()
    assert gen.stale_links() == [], "run `python deploy/generate.py`"
    chart = tmp_path / "files" / "dashboards"
    gen.write_links(chart=chart)
    assert gen.stale_links(chart=chart) == []
    assert [p.read_bytes() for p in sorted(chart.iterdir())] == [
        p.read_bytes() for p in sorted((ROOT / "dashboards").glob("*.json"))]
    (chart / "fleet.json").unlink()
    (chart / "gone.json").write_text("{}")
    assert gen.stale_links(chart=chart) == ["files/dashboards/fleet.json",
                                            "files/dashboards/gone.json"]
    gen.write_links(chart=chart)
    assert gen.stale_links(chart=chart) == []


def test_generate_names_a_bad_rule_file(tmp_path: Path) -> None:
    gen = load_generate()
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "x.yml").write_text("rules: []\n")
    with pytest.raises(gen.GenerateError, match=r"x\.yml: key 'groups': expected a list"):
        gen.prometheus_rule(tmp_path)


# --- the kubernetes client's models --------------------------------------------------------


def test_objects_round_trip_through_kubernetes_models() -> None:
    """Deserialize into the client's model and serialize back: a misspelt or misplaced field
    is dropped on the way, so the round trip differs from the manifest."""
    api: Any = ApiClient()  # untyped
    seen = set()
    for obj in OBJECTS:
        model_name = MODELS.get(obj["kind"])
        if model_name is None:
            continue
        model = api._ApiClient__deserialize(obj, model_name)
        assert api.sanitize_for_serialization(model) == obj, \
            f"{obj['kind']} {obj['metadata']['name']}"
        seen.add(obj["kind"])
    assert seen == set(MODELS)


def test_every_namespaced_object_is_in_the_namespace() -> None:
    namespace = one("Namespace")["metadata"]["name"]
    assert namespace == kustomization(BASE)["namespace"] == "gpu-ledger"
    for obj in OBJECTS:
        if obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"):
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == namespace, obj["metadata"]["name"]


def test_objects_carry_the_name_label() -> None:
    for obj in OBJECTS:
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-ledger", \
            f"{obj['kind']} {obj['metadata']['name']}"


# --- exporter: DaemonSet, Service, ServiceMonitor, RBAC ----------------------------------


def test_service_selects_the_daemonset_pods() -> None:
    svc = one("Service")
    pod_labels = DAEMONSET["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert DAEMONSET["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    (cport,) = DS_CONTAINER["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9847, cport["name"])
    assert cport["containerPort"] == 9847
    # the ServiceMonitor takes the job from this label: the alerts' job matcher
    job = svc["metadata"]["labels"][one("ServiceMonitor")["spec"]["jobLabel"]]
    assert f'job="{job}"' in DEFAULT_CONFIG.exporter_selector


def test_servicemonitor_selects_the_service() -> None:
    svc, sm = one("Service"), one("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # no namespaceSelector: the Operator looks in the ServiceMonitor's own namespace
    assert "namespaceSelector" not in sm["spec"]
    assert svc["metadata"]["namespace"] == sm["metadata"]["namespace"]
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        # the exporter's own namespace/pod labels are the attribution: never renamed
        assert endpoint["honorLabels"] is True


def test_prometheusrule_holds_every_rule_file() -> None:
    rule = one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    files = sorted(p for p in (ROOT / "alerts").glob("*.y*ml"))
    assert files, "alerts/ has rule files"
    groups = [g for p in files for g in yaml.safe_load(p.read_text(encoding="utf-8"))["groups"]]
    assert rule["spec"]["groups"] == groups
    assert not any("tests" in str(p.relative_to(ROOT / "alerts")) for p in files)


def test_rbac_grants_only_reading_pods_resource_slices_and_claims() -> None:
    role, binding = one("ClusterRole"), one("ClusterRoleBinding")
    sa = one("ServiceAccount")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch"]},
        # a shared claim's sharing config, one GET at a time: no list or watch of claims
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert DS_POD["serviceAccountName"] == sa["metadata"]["name"]
    assert CJ_POD["automountServiceAccountToken"] is False  # metering needs no API access


def test_daemonset_node_access() -> None:
    assert DS_POD["hostPID"] is True
    assert DS_POD["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in DS_POD["tolerations"]
    env = {e["name"]: e for e in DS_CONTAINER["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    (volume,) = [v for v in DS_POD["volumes"] if "hostPath" in v]
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    (mount,) = [m for m in DS_CONTAINER["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert not any("nvidia.com" in r for r in DS_CONTAINER["resources"]["limits"])


def test_daemonset_security_context() -> None:
    sc = DS_CONTAINER["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in sc["capabilities"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert DS_POD["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert DS_CONTAINER["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"},
                                         "limits": {"cpu": "200m", "memory": "192Mi"}}


def test_daemonset_probes() -> None:
    port = DS_CONTAINER["ports"][0]["name"]
    assert DS_CONTAINER["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    # liveness on the landing page: a broken driver must not crash-loop the exporter
    assert DS_CONTAINER["livenessProbe"]["httpGet"] == {"path": "/", "port": port}
    assert DS_CONTAINER["startupProbe"]["httpGet"]["path"] == "/"
    # not ready must still be scraped: its self-metrics say what is wrong
    assert one("Service")["spec"]["publishNotReadyAddresses"] is True


def test_daemonset_args_parse_with_the_exporter_cli() -> None:
    command, *flags = DS_CONTAINER["args"]
    assert command in COMMANDS and COMMANDS[command][0] == "exporter.cli"
    args = exporter_parser().parse_args(flags)
    assert parse_listen(args.listen)[1] == DS_CONTAINER["ports"][0]["containerPort"]
    mount = next(m["mountPath"] for m in DS_CONTAINER["volumeMounts"]
                 if m["name"] == "pod-resources")
    assert Path(args.pod_resources_socket).parent == Path(mount)
    assert args.no_kubernetes is False


# --- metering: CronJob, PVC, ConfigMaps ----------------------------------------------------


def test_cronjob_schedule_and_references() -> None:
    spec = CRONJOB["spec"]
    assert spec["schedule"] == "30 0 * * *"  # daily, just after midnight UTC
    assert spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    volumes = {v["name"]: v for v in CJ_POD["volumes"]}
    pvc = one("PersistentVolumeClaim")
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    cost_model = one("ConfigMap", volumes["cost-model"]["configMap"]["name"])
    assert "cost-model.yaml" in cost_model["data"]
    env = {e["name"]: e for e in CJ_CONTAINER["env"]}
    ref = env["PROMETHEUS_URL"]["valueFrom"]["configMapKeyRef"]
    assert ref["key"] in one("ConfigMap", ref["name"])["data"]
    assert CJ_CONTAINER["securityContext"]["readOnlyRootFilesystem"] is True
    assert CJ_POD["securityContext"]["runAsNonRoot"] is True


def cronjob_script() -> str:
    assert CJ_CONTAINER["command"] == ["/bin/sh", "-c"]
    script: str = CJ_CONTAINER["args"][0]
    return script


def run_script(tmp_path: Path, env: dict[str, str], now: str = "2026-11-15T00:30:00Z"
               ) -> list[list[str]]:
    """Run the CronJob's script with a stub `gpu-ledger` that records its arguments, and a
    `date` whose clock reads `now` (arithmetic on a given date, -d, is the real date's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls"
    stub = bin_dir / "gpu-ledger"
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\037" "$a" >> {record}; done\n'
                    f'echo >> {record}\n')
    real_date = shutil.which("date")
    clock = bin_dir / "date"
    clock.write_text(f'#!/bin/sh\ncase " $* " in *" -d "*) exec {real_date} "$@";; esac\n'
                     f'exec {real_date} -d "{now}" "$@"\n')
    for f in (stub, clock):
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    subprocess.run(["/bin/sh", "-c", cronjob_script()], env=full_env, check=True,
                   capture_output=True, timeout=30)
    return [line.split("\x1f")[:-1] for line in record.read_text().splitlines()]


def test_cronjob_script_meters_daily_then_closes_and_reports_on_the_1st(tmp_path: Path
                                                                       ) -> None:
    """Every day `meter --daily`; on the 1st also `close` and `report` the month before (the
    year crossed on January 1st), with the real commands' parsers."""
    calls = run_script(tmp_path, {"PROMETHEUS_URL": "http://prom:9090"},
                       now="2026-01-01T00:30:00Z")
    assert [c[0] for c in calls] == ["meter", "close", "report"]
    meter = meter_parser().parse_args(calls[0][1:])
    close = close_parser().parse_args(calls[1][1:])
    report = report_cli._parser().parse_args(calls[2][1:])
    assert meter.prometheus == "http://prom:9090" and meter.daily and not meter.month
    assert (close.month, report.month) == ("2025-12", "2025-12")
    assert meter.db == close.db == report.db
    mounts = {m["name"]: m["mountPath"] for m in CJ_CONTAINER["volumeMounts"]}
    assert Path(meter.db).parent == Path(mounts["data"])
    assert Path(report.out).is_relative_to(mounts["data"])
    assert Path(meter.cost_model) == Path(mounts["cost-model"]) / "cost-model.yaml"
    for command in ("meter", "close", "report"):
        assert COMMANDS[command][0].startswith("metering.")


def test_cronjob_script_only_meters_on_other_days(tmp_path: Path) -> None:
    calls = run_script(tmp_path, {"PROMETHEUS_URL": "http://prom:9090"})
    assert [c[0] for c in calls] == ["meter"]


def test_cronjob_script_closes_the_month_named(tmp_path: Path) -> None:
    """MONTH closes and reports that month whatever the day (a failed run on the 1st)."""
    calls = run_script(tmp_path, {"PROMETHEUS_URL": "http://prom:9090", "MONTH": "2026-10"})
    assert [c[0] for c in calls] == ["meter", "close", "report"]
    assert close_parser().parse_args(calls[1][1:]).month == "2026-10"


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    maps = [o for o in OBJECTS if o["kind"] == "ConfigMap"
            and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    names = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == names
    gens = kustomization(ROOT / "dashboards")["configMapGenerator"]
    assert all(g["options"]["disableNameSuffixHash"] is True for g in gens)


def test_dashboards_are_committed_once() -> None:
    """deploy/ holds no copy of a dashboard: the base includes dashboards/'s kustomization."""
    assert "../../dashboards" in kustomization(BASE)["resources"]
    originals = list((ROOT / "dashboards").glob("*.json"))
    names, contents = {p.name for p in originals}, {p.read_bytes() for p in originals}
    copies = [p for p in DEPLOY.rglob("*.json")  # the chart's links to them are no copies
              if not p.is_symlink() and (p.name in names or p.read_bytes() in contents)]
    assert len(originals) >= 4 and copies == []


def test_cost_model_configmap_is_the_repository_one() -> None:
    cm = one("ConfigMap", "gpu-ledger-cost-model")
    assert cm["data"]["cost-model.yaml"] == (ROOT / "cost-model.yaml").read_text(encoding="utf-8")


def test_image_tag_is_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (image,) = kustomization(BASE)["images"]
    assert image["name"] == DS_CONTAINER["image"] == CJ_CONTAINER["image"]
    assert image["newTag"] == version


# --- overlay -------------------------------------------------------------------------------


def test_overlay_patches_objects_of_the_base() -> None:
    k = kustomization(OVERLAY)
    assert k["resources"] == ["../../base"]
    for entry in k["patches"]:
        patch = yaml.safe_load(entry["patch"])
        one(patch["kind"], patch["metadata"]["name"])  # exists, exactly once
    deleted = {yaml.safe_load(e["patch"])["kind"] for e in k["patches"]
               if "$patch: delete" in e["patch"]}
    assert deleted == {"ServiceMonitor", "PrometheusRule"}
    (gen,) = k["configMapGenerator"]
    assert gen["behavior"] == "replace"
    one("ConfigMap", gen["name"])


# --- Dockerfile ----------------------------------------------------------------------------


def dockerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", text))
    return [line.strip() for line in text.splitlines() if line.strip()]


SIMULATOR = "gpusim"  # tests, benchmarks and the demo use it; the image must not contain it


def copy_sources() -> list[str]:
    out = []
    for line in dockerfile():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = shlex.split(line)[1:]
            out += sources
    return out


def test_dockerfile_structure() -> None:
    lines = dockerfile()
    froms = [line for line in lines if line.startswith("FROM ")]
    base = ("python:3.11-slim@sha256:"
            "90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff")
    assert froms == [f"FROM {base} AS build", f"FROM {base}"]  # pinned by digest
    final = lines[lines.index(froms[-1]):]
    assert [line for line in final if line.startswith("USER ")] == ["USER 65532:65532"]
    assert 'ENTRYPOINT ["gpu-ledger"]' in final
    assert "EXPOSE 9847" in final
    assert any("from=build" in line and "pip install" in line for line in final)


def test_dockerfile_copies_every_package_and_nothing_ignored() -> None:
    sources = copy_sources()
    for src in sources:
        assert (ROOT / src).exists(), src
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    assert SIMULATOR in packages  # a source checkout installs it (tests, demo, benchmarks) ...
    assert packages - {SIMULATOR} <= set(sources), "a product package is not copied into the image"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for src in sources:
        assert src not in ignored, f"{src} is COPYed but .dockerignore excludes it"
    # ... the image does not: neither copied nor even in the build context.
    assert SIMULATOR not in sources and SIMULATOR in ignored


def test_build_stage_makes_a_complete_wheel_from_the_copied_files(tmp_path: Path) -> None:
    """What `pip wheel .` sees in the build stage: only the COPYed paths."""
    src = tmp_path / "src"
    src.mkdir()
    for rel in copy_sources():
        path = ROOT / rel
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "-q", "--wheel-dir", str(tmp_path / "wheels"), str(src)],
                   check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "wheels").glob("gpu_ledger-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("gpu_ledger/cli.py", "gpu_ledger/doctor.py", "exporter/cli.py",
                   "exporter/nvml_loader.py", "exporter/attribution/podresources_pb2.py",
                   "metering/sql/schema.sql", "metering/data/cost-model.yaml"):
        assert needed in names, needed
    # The image installs this wheel: no simulator module, no scenario file in it.
    assert [n for n in names if n.startswith(f"{SIMULATOR}/") or "scenarios/" in n] == []
    assert not any(n.split("/")[0] == "exporter" and "/sim" in n for n in names)
    # ... and what the image installs with it: the unconditional requirements, no extras.
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA")))
    runtime = {re.match(r"[A-Za-z0-9._-]+", line.removeprefix("Requires-Dist: "))[0].lower()
               for line in metadata.decode().splitlines()
               if line.startswith("Requires-Dist: ") and "extra ==" not in line}
    assert "nvidia-ml-py" in runtime and "duckdb" in runtime
    # The image installs requirements.lock, then this wheel with --no-deps.
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    pinned = {n.lower() for n in re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==", lock)}
    assert runtime <= pinned
    # The simulator's gRPC server, the tests' parsers, the benchmarks' pandas: none of them.
    not_product = {"grpcio", "pandas", "prometheus-client", "kubernetes"}
    assert runtime.isdisjoint(not_product) and pinned.isdisjoint(not_product), pinned
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpu-ledger = gpu_ledger.cli:main" in zipfile.ZipFile(wheel).read(
        entry_points).decode()
