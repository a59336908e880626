"""Pod owner (controller) from ownerReferences: unit cases, then through the real pod watch
against the fake API server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from exporter.attribution.podwatch import PodWatch, owner_of, pod_info
from exporter.core import ExporterOptions
from gpusim.apiserver import FakeApiServer

NODE = "gpu-node-1"


def _ref(kind: str, name: str, controller: object = True) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u",
            "controller": controller}


def test_controller_kinds() -> None:
    rs = {"ownerReferences": [_ref("ReplicaSet", "infer-7d9f8c6b5")],
          "labels": {"pod-template-hash": "7d9f8c6b5"}}
    assert owner_of(rs) == ("Deployment", "infer")
    # A ReplicaSet whose name does not end in the pod-template-hash: its own workload.
    assert owner_of({"ownerReferences": [_ref("ReplicaSet", "rs-by-hand")],
                     "labels": {"pod-template-hash": "abc"}}) == ("ReplicaSet", "rs-by-hand")
    assert owner_of({"ownerReferences": [_ref("ReplicaSet", "x-abc")]}) == ("ReplicaSet", "x-abc")
    assert owner_of({"ownerReferences": [_ref("StatefulSet", "emb")]}) == ("StatefulSet", "emb")
    assert owner_of({"ownerReferences": [_ref("Job", "batch-28733")]}) == ("Job", "batch-28733")
    # Only the controller reference counts; none, malformed or non-controller: a bare pod.
    both = {"ownerReferences": [_ref("ConfigMap", "cm", controller=False), _ref("Job", "j")]}
    assert owner_of(both) == ("Job", "j")
    for meta in ({}, {"ownerReferences": "x"}, {"ownerReferences": [_ref("Job", "j", "yes")]},
                 {"ownerReferences": [{"kind": 3, "name": "j", "controller": True}]}):
        assert owner_of(meta) == ("", "")


def test_owner_through_the_pod_watch(tmp_path: Path) -> None:
    pod = {"metadata": {"name": "infer-7d9f8c6b5-x2x9q", "namespace": "ml", "uid": "uid-1",
                        "labels": {"pod-template-hash": "7d9f8c6b5"},
                        "ownerReferences": [_ref("ReplicaSet", "infer-7d9f8c6b5")]},
           "spec": {"nodeName": NODE, "containers": [{"name": "main"}]}, "status": {}}
    assert pod_info(pod, frozenset()) is not None
    server = FakeApiServer([pod])
    server.start()
    try:
        opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")))
        watch = PodWatch(opts, watch_timeout=30).start()
        try:
            end = time.monotonic() + 20
            while "uid-1" not in watch.pods and time.monotonic() < end:
                time.sleep(0.02)
            assert watch.pods["uid-1"].owner == ("Deployment", "infer")
        finally:
            watch.close()
    finally:
        server.stop()
