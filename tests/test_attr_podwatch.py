"""The pod watch with the exporter's Kubernetes client (exporter/kube) against FakeApiServer."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.podwatch import PodWatch, pod_info
from exporter.core import ExporterOptions, SourceStatus
from exporter.kube.watch import BackoffPolicy
from gpusim.apiserver import FakeApiServer
from tests.waiting import wait_until

NODE = "gpu-node-1"
FAST = BackoffPolicy(initial=0.05, cap=0.1)


def pod(name: str, uid: str, node: str = NODE, team: str = "ml", ns: str = "default",
        cid: str | None = None) -> dict[str, Any]:
    statuses = [{"name": "main", "containerID": f"containerd://{cid}"}] if cid else []
    return {"metadata": {"name": name, "namespace": ns, "uid": uid,
                         "labels": {"team": team, "secret-ish": "no"}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
            "status": {"containerStatuses": statuses}}


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    s = FakeApiServer([pod("a", "uid-a", cid="aa" * 32), pod("b", "uid-b", team="infra"),
                       pod("other", "uid-o", node="gpu-node-2")])
    s.start()
    yield s
    s.stop()


@pytest.fixture
def watch(server: FakeApiServer, tmp_path: Path) -> Iterator[PodWatch]:
    opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")),
                           pod_label_allowlist=("team",))
    w = PodWatch(opts, watch_timeout=30).start()
    wait_until(lambda: w.status.up, "the first list")
    yield w
    w.close()


def test_lists_only_this_nodes_pods(watch: PodWatch, server: FakeApiServer) -> None:
    assert set(watch.pods) == {"uid-a", "uid-b"}
    a = watch.pods["uid-a"]
    assert (a.namespace, a.name, a.labels) == ("default", "a", (("team", "ml"),))
    assert a.containers == {"aa" * 32: "main"}
    assert watch.by_container["aa" * 32] is a
    assert watch.by_name[("default", "b")].labels == (("team", "infra"),)
    assert server.requests[0] == "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1"


def test_watch_events(watch: PodWatch, server: FakeApiServer) -> None:
    server.add_pod(pod("c", "uid-c", cid="cc" * 32))
    server.add_pod(pod("elsewhere", "uid-e", node="gpu-node-2"))
    wait_until(lambda: "uid-c" in watch.pods, "ADDED")
    server.modify_pod(pod("a", "uid-a", team="research", cid="ab" * 32))
    wait_until(lambda: watch.pods["uid-a"].labels == (("team", "research"),), "MODIFIED")
    assert watch.by_container["ab" * 32].name == "a"
    assert "aa" * 32 not in watch.by_container
    server.delete_pod("default", "b")
    wait_until(lambda: "uid-b" not in watch.pods, "DELETED")
    assert set(watch.pods) == {"uid-a", "uid-c"}
    assert watch.lists == 1  # all of that arrived over the watch: no relist, no polling
    watches = [r for r in server.requests if "watch=true" in r]
    assert watches and all("resourceVersion=" in r for r in watches)


def test_expired_watch_relists(watch: PodWatch, server: FakeApiServer) -> None:
    server.expire()  # ends the open watch; the next one gets 410 Gone
    # changes while the watch is gone must show up after the relist
    server.delete_pod("default", "b")
    server.add_pod(pod("d", "uid-d"))
    wait_until(lambda: watch.lists >= 2, "a relist after 410")
    wait_until(lambda: set(watch.pods) == {"uid-a", "uid-d"}, "the relisted state")
    assert watch.status == SourceStatus(True)
    lists = [r for r in server.requests if "watch=true" not in r]
    assert len(lists) >= 2
    server.add_pod(pod("e", "uid-e"))  # and the watch resumes after the relist
    wait_until(lambda: "uid-e" in watch.pods, "events after the relist")


def test_watch_that_times_out_resumes_without_relisting(server: FakeApiServer,
                                                        tmp_path: Path) -> None:
    opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")))
    w = PodWatch(opts, watch_timeout=1).start()
    try:
        wait_until(lambda: sum("watch=true" in r for r in server.requests) >= 2,
                   "a second watch request")
        server.add_pod(pod("late", "uid-late"))
        wait_until(lambda: "uid-late" in w.pods, "an event on the resumed watch")
        assert w.lists == 1
    finally:
        w.close()


def test_bad_credentials_are_reported_and_retried(server: FakeApiServer, tmp_path: Path) -> None:
    path = server.kubeconfig(str(tmp_path / "kc"))
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("gpu-ledger-fake-token", "wrong"))
    w = PodWatch(ExporterOptions(node=NODE, kubeconfig=path), backoff=FAST).start()
    try:
        wait_until(lambda: w.status.reason == "unauthorized", "the 401")
        assert w.status.up is False
        wait_until(lambda: len(server.requests) >= 3, "retries with backoff")
        assert w.pods == {}
        with open(path, "w") as f:  # fixed on disk: the next retry reads it again
            f.write(text)
        wait_until(lambda: w.status.up and set(w.pods) == {"uid-a", "uid-b"}, "the fixed token")
    finally:
        w.close()


def test_unreachable_server(tmp_path: Path) -> None:
    dead = FakeApiServer([])
    path = dead.kubeconfig(str(tmp_path / "kc"))
    dead.stop()  # never started; the port is now closed
    w = PodWatch(ExporterOptions(node=NODE, kubeconfig=path), backoff=FAST,
                 request_timeout=2).start()
    try:
        wait_until(lambda: w.status.reason == "unreachable", "a connection failure")
    finally:
        w.close()


def test_no_node_name_means_no_watch() -> None:
    w = PodWatch(ExporterOptions(node="", kubeconfig="/nonexistent")).start()
    assert w.status == SourceStatus(False, "no-node-name")
    assert not w.started
    w.close()


def test_pod_info_tolerates_partial_objects() -> None:
    assert pod_info({}, frozenset()) is None
    assert pod_info({"metadata": {"name": "x", "namespace": "y"}}, frozenset()) is None
    info = pod_info({"metadata": {"name": "x", "namespace": "y", "uid": "U", "labels": None},
                     "status": {"containerStatuses": [{"name": "c"}, "junk"],
                                "initContainerStatuses": [
                                    {"name": "init", "containerID": "cri-o://ABC"}]}},
                    frozenset({"team"}))
    assert info is not None
    assert (info.uid, info.labels, info.containers) == ("u", (), {"abc": "init"})
