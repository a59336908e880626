"""The Kubernetes client bounds objects, not only bytes (issue 24, item 5), against
FakeApiServer (gpusim/apiserver.py), its `hostile` hook standing for a broken or hostile API
server: item caps per list, per-object value and byte caps (an oversized object is skipped and
counted, the rest of the node is not), a total deadline per request, a bounded pod cache with
a counted overflow, and a flood of events published at most once per interval. Memory under
each attack is measured by bench/kube_hostile.py, not here."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.podwatch import PodWatch, pod_info
from exporter.core import ExporterOptions
from exporter.kube import watch as kwatch
from exporter.kube.client import (
    MAX_OBJECT_VALUES,
    ApiClient,
    BadResponse,
    DeadlineExceeded,
)
from exporter.kube.config import load_kubeconfig
from exporter.kube.watch import CACHE_FULL, TOO_LARGE, BackoffPolicy, NodeScopedWatch, WatchedKind
from gpusim.apiserver import FakeApiServer
from tests.waiting import wait_until

NODE = "gpu-node-1"
FAST = BackoffPolicy(initial=0.05, cap=0.2, healthy_after=5.0)


@pytest.fixture(autouse=True)
def _restore_dropped() -> Iterator[None]:
    """The dropped counter is process-wide: leave it as found for the golden tests."""
    before = dict(kwatch._dropped)
    yield
    with kwatch._dropped_lock:
        kwatch._dropped.clear()
        kwatch._dropped.update(before)


def pod(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}], **extra}}


def huge_pod(name: str) -> dict[str, Any]:
    """A pod a tenant can create (about 300 KB, far under etcd's 1.5 MiB) of more JSON values
    than one object may have: 20,000 environment variables."""
    env = [{"name": f"V{i}", "value": ""} for i in range(MAX_OBJECT_VALUES // 3)]
    return pod(name, containers=[{"name": "main", "env": env}])


def kind(noun: str, max_items: int = kwatch.MAX_CACHED,
         max_bytes: int = kwatch.MAX_CACHED_BYTES) -> WatchedKind[Any]:
    return WatchedKind(noun, "/api/v1/pods", lambda obj: pod_info(obj, frozenset()),
                       max_items=max_items, max_bytes=max_bytes)


def node_watch(server: FakeApiServer, tmp_path: Path, k: WatchedKind[Any],
               **kw: Any) -> NodeScopedWatch[Any]:
    path = server.kubeconfig(str(tmp_path / "kc"))
    return NodeScopedWatch(k, NODE, lambda: ApiClient(load_kubeconfig(path)), policy=FAST,
                           **kw).start()


def dropped(noun: str, reason: str) -> int:
    return kwatch.dropped(NODE).get((noun, reason), 0)


def list_body(items: Iterator[bytes], version: str = "7") -> Iterator[bytes]:
    yield b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"%s"},"items":[' \
        % version.encode()
    first = True
    for item in items:
        yield item if first else b"," + item
        first = False
    yield b"]}"


# --- lists -----------------------------------------------------------------------------------


def test_a_list_of_millions_of_empty_objects_is_refused_after_the_item_cap(
        tmp_path: Path) -> None:
    """The issue's 60 MiB list of `{}` took the exporter to 2.9 GiB. Now the list is read an
    item at a time and refused after LIST_FACTOR x max_items items: the server never gets
    to send the rest."""
    sent = {"pieces": 0}

    def empties() -> Iterator[bytes]:
        for _ in range(60 * 1024):  # 60 MiB in 1 KiB pieces
            sent["pieces"] += 1
            yield b",".join([b"{}"] * 341) + b",{}"

    with FakeApiServer() as server:
        server.hostile = lambda path: list_body(empties()) if "watch" not in path else None
        api = ApiClient(load_kubeconfig(server.kubeconfig(str(tmp_path / "kc"))))
        items: list[Any] = []
        with pytest.raises(BadResponse, match="more than 400 items"):
            api.get_list("/api/v1/pods", {}, items.append, max_items=400)
        assert len(items) == 400 and all(i == {} for i in items)
        watch = node_watch(server, tmp_path, kind("pod-empties", max_items=10))
        try:
            wait_until(lambda: watch.status.reason == "bad-response", "the list refused")
            assert watch.lists == 0 and watch.items == {}
        finally:
            watch.close()
    assert sent["pieces"] < 60 * 1024 // 2, "the whole 60 MiB was read"


def test_pods_past_the_cache_bound_are_counted_not_cached(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """30 pods on the node, a cache of 10: the list keeps 10 and counts 20; ADDED events past
    the bound are counted too, with one log line in all; a deleted pod frees a slot."""
    noun = "pod-bound"
    with FakeApiServer([pod(f"p{i:02}") for i in range(30)]) as server, \
            caplog.at_level(logging.WARNING, logger="exporter.kube"):
        watch = node_watch(server, tmp_path, kind(noun, max_items=10))
        try:
            wait_until(lambda: watch.status.up and len(watch.items) == 10, "the first list")
            assert dropped(noun, CACHE_FULL) == 20
            for i in range(5):
                server.add_pod(pod(f"q{i}"))
            wait_until(lambda: dropped(noun, CACHE_FULL) == 25, "ADDED past the bound")
            cached = sorted(watch.items)
            server.delete_pod("ml", cached[0][len("uid-"):])
            server.add_pod(pod("late"))
            wait_until(lambda: "uid-late" in watch.items, "the freed slot taken")
            assert len(watch.items) == 10
        finally:
            watch.close()
    lines = [r for r in caplog.records if "not cached" in r.getMessage()]
    assert len(lines) == 1 and "gpu_exporter_kube_objects_dropped_total" in lines[0].getMessage()


def statuses(n: int) -> dict[str, Any]:
    return {"containerStatuses": [{"name": f"c{i}", "containerID": f"containerd://{i:064x}"}
                                  for i in range(n)]}


def test_the_cache_is_bounded_in_bytes_of_what_it_keeps(tmp_path: Path) -> None:
    """Few objects, each within the per-object bounds, can still be large once parsed (a pod
    with 5,000 container statuses keeps 5,000 container IDs): the cache's byte budget stops
    them, and a pod that outgrows the budget by a MODIFIED leaves the cache, counted."""
    noun = "pod-bytes"
    small = pod("small")
    big = [dict(pod(f"big{i}"), status=statuses(5_000)) for i in range(4)]
    one_big = pod_info(big[0], frozenset())
    assert one_big is not None
    budget = 2 * kwatch.retained_bytes(one_big) + 100_000
    with FakeApiServer([small, *big]) as server:
        watch = node_watch(server, tmp_path, kind(noun, max_bytes=budget))
        try:
            wait_until(lambda: watch.status.up, "the first list")
            assert "uid-small" in watch.items and len(watch.items) == 3
            assert dropped(noun, CACHE_FULL) == 2
            server.modify_pod(dict(small, status=statuses(5_000)))
            wait_until(lambda: "uid-small" not in watch.items, "the outgrown pod dropped")
            assert dropped(noun, CACHE_FULL) == 3 and len(watch.items) == 2
        finally:
            watch.close()


def test_the_pod_watch_caches_at_most_its_default_bound(tmp_path: Path) -> None:
    bound = kwatch.MAX_CACHED
    with FakeApiServer([pod(f"p{i}") for i in range(bound + 25)]) as server:
        opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")))
        before = dropped("pod", CACHE_FULL)
        watch = PodWatch(opts, backoff=FAST).start()
        try:
            wait_until(lambda: watch.status.up and len(watch.pods) == bound, "the first list")
            assert dropped("pod", CACHE_FULL) - before == 25
        finally:
            watch.close()


def test_one_oversized_pod_costs_only_itself(tmp_path: Path) -> None:
    """A tenant's pod of more JSON values than one object may have is skipped undecoded and
    counted, in the list and as a watch event; every other pod of the node stays cached."""
    noun = "pod-huge"
    with FakeApiServer([pod("a"), huge_pod("tenant"), pod("b")]) as server:
        watch = node_watch(server, tmp_path, kind(noun))
        try:
            wait_until(lambda: watch.status.up, "the first list")
            assert set(watch.items) == {"uid-a", "uid-b"}
            assert dropped(noun, TOO_LARGE) == 1
            server.add_pod(huge_pod("tenant-2"))
            server.add_pod(pod("c"))
            wait_until(lambda: "uid-c" in watch.items, "the pod after the huge event")
            assert set(watch.items) == {"uid-a", "uid-b", "uid-c"}
            assert dropped(noun, TOO_LARGE) == 2 and watch.status.up
        finally:
            watch.close()


# --- watch events ----------------------------------------------------------------------------


def _event(kind_: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind_, "object": obj}).encode() + b"\n"


def test_a_15_mib_watch_event_is_skipped_unbuffered(tmp_path: Path) -> None:
    """The issue's 15 MiB event took the exporter to 809 MiB. Now a line over 3 MiB is
    discarded as it arrives and counted; the event after it is applied."""
    noun = "pod-bigevent"
    ok = pod("after")
    ok["metadata"]["resourceVersion"] = "9"

    def stream() -> Iterator[bytes]:
        yield b'{"type":"ADDED","object":{"metadata":{"name":"x","annotations":{"a":"'
        for _ in range(15 * 16):
            yield b"z" * 65536
        yield b'"}}}}\n'
        yield _event("ADDED", ok)
        time.sleep(30)  # then stay open, as a watch does

    with FakeApiServer([pod("a")]) as server:
        server.hostile = lambda path: stream() if "watch=true" in path else None
        watch = node_watch(server, tmp_path, kind(noun))
        try:
            wait_until(lambda: "uid-after" in watch.items, "the event after the big one")
            assert dropped(noun, TOO_LARGE) == 1 and "uid-a" in watch.items
        finally:
            watch.close()


def test_an_event_flood_is_published_once_per_interval(tmp_path: Path) -> None:
    """20,000 MODIFIED events for 50 pods: each changes the private cache in O(1); readers
    get copies at most every publish_interval (before: a full copy and re-index per event,
    O(n) each), and the last state of the burst is published."""
    noun = "pod-flood"
    pods = [pod(f"p{i}") for i in range(50)]
    n = 20_000

    def stream() -> Iterator[bytes]:
        batch = []
        for i in range(n):
            p = pods[i % 50]
            p["metadata"]["labels"] = {"seq": str(i)}
            p["metadata"]["resourceVersion"] = str(100 + i)
            batch.append(_event("MODIFIED", p))
            if len(batch) == 200:
                yield b"".join(batch)
                batch = []
        time.sleep(30)

    publishes: list[int] = []
    allow = frozenset({"seq"})
    k = WatchedKind(noun, "/api/v1/pods", lambda obj: pod_info(obj, allow))
    with FakeApiServer(pods) as server:
        server.hostile = lambda path: stream() if "watch=true" in path else None
        watch = node_watch(server, tmp_path, k, publish_interval=0.25,
                           on_change=lambda items: publishes.append(len(items)))
        try:
            wait_until(lambda: watch.version == str(100 + n - 1), "the whole flood", 60)
            wait_until(lambda: dict(watch.items["uid-p49"].labels).get("seq") == str(n - 1),
                       "the burst's last state published")
        finally:
            watch.close()
    assert len(publishes) < n // 100, len(publishes)
    assert all(m == 50 for m in publishes)


# --- deadlines -------------------------------------------------------------------------------


def test_a_dripping_list_is_cut_at_its_total_deadline(tmp_path: Path) -> None:
    """A byte every 0.2 s satisfies the per-read timeout for ever (the issue's watch was still
    "starting" after 45 s); the whole request has a deadline."""
    def drip() -> Iterator[bytes]:
        for b in b'{"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[' * 10:
            yield bytes([b])
            time.sleep(0.2)

    with FakeApiServer() as server:
        server.hostile = lambda path: drip()
        api = ApiClient(load_kubeconfig(server.kubeconfig(str(tmp_path / "kc"))))
        with pytest.raises(DeadlineExceeded):
            api.get_list("/api/v1/pods", {}, lambda item: None, max_items=10, deadline=1.0)
        with pytest.raises(DeadlineExceeded):
            api.get_json("/api/v1/pods", {}, deadline=1.0)
        watch = node_watch(server, tmp_path, kind("pod-drip"), request_deadline=1.0)
        try:
            wait_until(lambda: watch.status.reason == "deadline", "the deadline as the reason")
        finally:
            watch.close()


def test_an_object_over_the_value_bound_is_refused_by_get(tmp_path: Path) -> None:
    """A ResourceClaim (read with get_json) is counted before it is decoded."""
    with FakeApiServer() as server:
        body = b'{"kind":"ResourceClaim","spec":[' + b",".join([b"{}"] * MAX_OBJECT_VALUES) + \
            b"]}"
        server.hostile = lambda path: iter([body])
        api = ApiClient(load_kubeconfig(server.kubeconfig(str(tmp_path / "kc"))))
        with pytest.raises(BadResponse, match="JSON values"):
            api.get_json("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c", {})

