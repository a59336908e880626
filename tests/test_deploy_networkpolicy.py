"""The NetworkPolicy admits only the Prometheus namespace to the exporter's metrics port, and
an overlay can name another namespace (issue 14). Built with the real `kubectl kustomize`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploytools import kubectl
from tests.test_deploy import BASE, DAEMONSET, DS_CONTAINER, one

POLICY = one("NetworkPolicy", "gpu-ledger-exporter")


def test_policy_selects_the_exporter_pods_and_only_ingress() -> None:
    pod_labels = DAEMONSET["spec"]["template"]["metadata"]["labels"]
    selector = POLICY["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert POLICY["spec"]["policyTypes"] == ["Ingress"]  # egress (API server) stays open


def test_only_the_prometheus_namespace_reaches_only_the_metrics_port() -> None:
    (rule,) = POLICY["spec"]["ingress"]
    (peer,) = rule["from"]  # one peer: a namespace, no ipBlock, no "from everywhere"
    assert peer == {"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    (port,) = rule["ports"]
    metrics = [p for p in DS_CONTAINER["ports"] if p["name"] == port["port"]]
    assert metrics and port["protocol"] == "TCP"


def test_an_overlay_names_another_prometheus_namespace(tmp_path: Path) -> None:
    """The patch docs/operations.md gives, applied to the base by kubectl kustomize."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(f"""\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {os.path.relpath(BASE, overlay)}
patches:
  - target: {{kind: NetworkPolicy, name: gpu-ledger-exporter}}
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0/namespaceSelector/matchLabels
        value: {{kubernetes.io/metadata.name: observability}}
""")
    out = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True,
                         text=True, check=True).stdout
    docs: list[Any] = [d for d in yaml.safe_load_all(out) if d]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"}
