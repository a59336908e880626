"""NodeScopedWatch and ApiClient (exporter/kube) against FakeApiServer: ResourceSlices as well as
pods, bookmarks, HTTP 410, a 410 storm with bounded requests and one storm log line, TLS with a
CA, a client certificate, tls-server-name and the in-cluster service account."""

import logging
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.podwatch import PodWatch
from exporter.attribution.resourceslices import ResourceSlice, SliceDevice, resource_slice_watch
from exporter.core import ExporterOptions, SourceStatus
from exporter.kube.client import ApiClient
from exporter.kube.config import load_in_cluster, load_kubeconfig
from exporter.kube.watch import BackoffPolicy, NodeScopedWatch, WatchedKind
from gpusim.apiserver import FakeApiServer
from tests.pki import make_ca, make_leaf
from tests.waiting import wait_until

NODE = "gpu-node-1"
FAST = BackoffPolicy(initial=0.05, cap=0.2, healthy_after=5.0)


def pod(name: str, node: str = NODE) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}}


def gpu_slice(name: str, node: str, uuids: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "uuid": {"string": u}, "index": {"int": i},
                         "type": {"string": "gpu"}}} for i, u in enumerate(uuids)]}}


def watch_of(server: FakeApiServer, tmp_path: Path, **kw: Any) -> PodWatch:
    opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")))
    return PodWatch(opts, **kw).start()


# --- ResourceSlices: the same machinery, another kind ----------------------------------------


def test_resource_slices_of_this_node(tmp_path: Path) -> None:
    with FakeApiServer(slices=[gpu_slice("mine", NODE, ["GPU-a", "GPU-b"]),
                               gpu_slice("theirs", "gpu-node-2", ["GPU-c"])]) as server:
        opts = ExporterOptions(node=NODE, kubeconfig=server.kubeconfig(str(tmp_path / "kc")))
        watch = resource_slice_watch(opts, policy=FAST).start()
        try:
            wait_until(lambda: watch.status.up, "the first list")
            assert list(watch.items.values()) == [ResourceSlice(
                name="mine", driver="gpu.nvidia.com", pool="gpu-node-1", node=NODE,
                devices=(SliceDevice("gpu-0", (("index", "0"), ("type", "gpu"),
                                               ("uuid", "GPU-a"))),
                         SliceDevice("gpu-1", (("index", "1"), ("type", "gpu"),
                                               ("uuid", "GPU-b")))))]
            assert server.requests[0] == ("/apis/resource.k8s.io/v1/resourceslices"
                                          "?fieldSelector=spec.nodeName%3Dgpu-node-1")
            server.add_slice(gpu_slice("mine-2", NODE, ["GPU-d"]))
            server.add_slice(gpu_slice("theirs-2", "gpu-node-2", ["GPU-e"]))
            wait_until(lambda: len(watch.items) == 2, "ADDED")
            server.delete_slice("mine")
            wait_until(lambda: set(watch.items) == {"uid-mine-2"}, "DELETED")
            assert watch.lists == 1
        finally:
            watch.close()


# --- versions: bookmarks, HTTP 410 ------------------------------------------------------------


def test_bookmark_moves_the_version_without_events(tmp_path: Path) -> None:
    with FakeApiServer([pod("a"), pod("elsewhere", "gpu-node-2")]) as server:
        watch = watch_of(server, tmp_path, backoff=FAST)
        try:
            wait_until(lambda: watch.status.up and watch.version != "", "the first list")
            server.modify_pod(pod("elsewhere", "gpu-node-2"))  # not ours: filtered out
            rv = server.bookmark()
            wait_until(lambda: watch.version == str(rv), "the bookmark")
            server.end_watches()  # the next watch must resume from the bookmark
            wait_until(lambda: f"resourceVersion={rv}" in server.requests[-1], "a resumed watch")
            assert "allowWatchBookmarks=true" in server.requests[-1]
            assert watch.lists == 1 and set(watch.pods) == {"uid-a"}
        finally:
            watch.close()


def test_http_410_on_watch_relists(tmp_path: Path) -> None:
    with FakeApiServer([pod("a")]) as server:
        watch = watch_of(server, tmp_path, backoff=FAST)
        try:
            wait_until(lambda: watch.status.up, "the first list")
            server.gone = "http"
            server.end_watches()
            server.add_pod(pod("b"))
            wait_until(lambda: watch.lists >= 2 and "uid-b" in watch.pods, "a relist")
            server.gone = ""
            server.add_pod(pod("c"))
            wait_until(lambda: "uid-c" in watch.pods, "the watch after the relist")
            assert watch.status == SourceStatus(True)
        finally:
            watch.close()


# --- a storm: every watch answers 410 ---------------------------------------------------------


@pytest.mark.parametrize("gone", ["event", "http"])
def test_410_storm_is_bounded_and_logged_once(gone: str, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    policy = BackoffPolicy(initial=0.1, cap=1.0, jitter=0.5, healthy_after=0.5, storm_after=3)
    window = 2.0
    caplog.set_level(logging.DEBUG, logger="exporter.kube.watch")
    with FakeApiServer([pod("a")]) as server:
        server.gone = gone
        watch = watch_of(server, tmp_path, backoff=policy)
        try:
            time.sleep(window)
            requests = list(server.requests)
            lists = [r for r in requests if "watch=true" not in r]
            watches = [r for r in requests if "watch=true" in r]
            # the first list, then at most one relist per backoff step that fits the window
            assert 3 <= len(lists) <= 1 + policy.max_retries_within(window)
            assert len(watches) <= len(lists)
            assert set(watch.pods) == {"uid-a"} and watch.status.up  # the cache stays good
            loud = [r for r in caplog.records if r.levelno >= logging.INFO]
            storms = [r.getMessage() for r in loud if "storm:" in r.getMessage()]
            assert len(storms) == 1 and "3 failures in a row" in storms[0], storms
            assert "410-expired x3" in storms[0]
            assert len(loud) == 2  # the first failure and the storm line, nothing per request
            server.gone = ""  # the server recovers: one closing line with the total, at the
            n = 0  # first event after the watch has been up for healthy_after
            while not any("healthy again" in r.getMessage() for r in caplog.records):
                assert n < 200, "no recovery line"
                server.add_pod(pod(f"new-{n}"))
                n += 1
                time.sleep(0.1)
        finally:
            watch.close()
    ends = [r.getMessage() for r in caplog.records if "healthy again" in r.getMessage()]
    assert len(ends) == 1 and "410-expired x" in ends[0]


def test_backoff_schedule() -> None:
    policy = BackoffPolicy(initial=0.5, cap=30.0, jitter=0.5)
    assert [policy.step(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    # shortest waits 0.25, 0.5, 1, 2, 4: five retries fit in 8 s, not six
    assert policy.max_retries_within(8.0) == 5


def test_unusable_objects_are_kept_out(tmp_path: Path) -> None:
    def parse(obj: dict[str, Any]) -> str | None:
        return (obj.get("spec") or {}).get("nodeName") and obj["metadata"]["name"]

    with FakeApiServer([pod("a"), {"metadata": {"name": "no-spec"}}]) as server:
        creds = load_kubeconfig(server.kubeconfig(str(tmp_path / "kc")))
        kind = WatchedKind("pod", "/api/v1/pods", parse)
        watch = NodeScopedWatch(kind, NODE, lambda: ApiClient(creds), policy=FAST).start()
        try:
            wait_until(lambda: watch.status.up, "the list")
            assert list(watch.items.values()) == ["a"]
        finally:
            watch.close()


# --- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "rogue-ca")
    make_leaf(d, "server", "ca", "IP:127.0.0.1", "serverAuth")
    make_leaf(d, "named", "ca", "DNS:kubernetes.default.svc", "serverAuth")
    make_leaf(d, "client", "ca", "DNS:gpu-ledger-exporter", "clientAuth")
    return d


def server_tls(pki: Path, cert: str = "server", client_ca: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(str(pki / "ca.crt"))
    return ctx


@pytest.fixture
def tls_server(pki: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer([pod("a")], tls=server_tls(pki)) as server:
        yield server


def test_tls_with_the_cluster_ca(tls_server: FakeApiServer, pki: Path, tmp_path: Path) -> None:
    path = tls_server.kubeconfig(str(tmp_path / "kc"), ca_file=str(pki / "ca.crt"))
    watch = PodWatch(ExporterOptions(node=NODE, kubeconfig=path), backoff=FAST).start()
    try:
        wait_until(lambda: watch.status.up, "a list over TLS")
        assert set(watch.pods) == {"uid-a"}
        tls_server.add_pod(pod("b"))
        wait_until(lambda: "uid-b" in watch.pods, "a watch event over TLS")
    finally:
        watch.close()


def test_tls_with_an_unknown_ca_is_refused(tls_server: FakeApiServer, pki: Path,
                                           tmp_path: Path) -> None:
    path = tls_server.kubeconfig(str(tmp_path / "kc"), ca_file=str(pki / "rogue-ca.crt"))
    watch = PodWatch(ExporterOptions(node=NODE, kubeconfig=path), backoff=FAST).start()
    try:
        wait_until(lambda: watch.status.reason == "tls", "a verification failure")
        assert watch.pods == {}
    finally:
        watch.close()


def test_client_certificate_instead_of_a_token(pki: Path, tmp_path: Path) -> None:
    user = {"client-certificate": str(pki / "client.crt"), "client-key": str(pki / "client.key")}
    with FakeApiServer([pod("a")], tls=server_tls(pki, client_ca=True)) as server:
        creds = load_kubeconfig(server.kubeconfig(str(tmp_path / "kc"),
                                                  ca_file=str(pki / "ca.crt"), user=user))
        assert creds.bearer() == ""
        body = ApiClient(creds).get_json("/api/v1/pods", {})
        assert [p["metadata"]["name"] for p in body["items"]] == ["a"]
        anonymous = load_kubeconfig(server.kubeconfig(str(tmp_path / "kc2"),
                                                      ca_file=str(pki / "ca.crt"), user={}))
        with pytest.raises((ssl.SSLError, OSError)):
            ApiClient(anonymous).get_json("/api/v1/pods", {})


def test_tls_server_name(pki: Path, tmp_path: Path) -> None:
    """A certificate for kubernetes.default.svc reached at 127.0.0.1 (kubeconfig
    `tls-server-name`, as for a tunnelled API server)."""
    with FakeApiServer([pod("a")], tls=server_tls(pki, "named")) as server:
        path = Path(server.kubeconfig(str(tmp_path / "kc"), ca_file=str(pki / "ca.crt")))
        with pytest.raises(ssl.SSLCertVerificationError):
            ApiClient(load_kubeconfig(str(path))).get_json("/api/v1/pods", {})
        path.write_text(path.read_text().replace(
            '"certificate-authority"', '"tls-server-name": "kubernetes.default.svc", '
                                       '"certificate-authority"'))
        body = ApiClient(load_kubeconfig(str(path))).get_json("/api/v1/pods", {})
        assert len(body["items"]) == 1


def test_in_cluster_service_account(tls_server: FakeApiServer, pki: Path, tmp_path: Path) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("gpu-ledger-fake-token\n")
    (sa / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    port = tls_server.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    creds = load_in_cluster(env, str(sa))
    kind = WatchedKind("pod", "/api/v1/pods", lambda obj: obj["metadata"]["name"])
    watch = NodeScopedWatch(kind, NODE, lambda: ApiClient(creds), policy=FAST).start()
    try:
        wait_until(lambda: watch.status.up, "a list with the service account")
        assert list(watch.items.values()) == ["a"]
        (sa / "token").write_text("rotated-and-wrong\n")  # read per request
        with pytest.raises(Exception, match="401"):
            ApiClient(creds).get_json("/api/v1/pods", {})
    finally:
        watch.close()
