"""A node-scoped list+watch of pods with the `kubernetes` client, on its own daemon thread.

Keeps pod UID → namespace, name, allow-listed labels and container ID → container name, so a
scrape never calls the API. List, then watch from the list's resourceVersion; on 410 Gone
relist; on any other failure back off (exponentially, capped) and relist. Bodies are decoded as
plain JSON rather than into client models: cheaper, and a pod missing fields the models require
(a half-written status) cannot stall the cache.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from exporter.core import ExporterOptions, PodLabels, SourceStatus
from exporter.errors import ConfigError

log = logging.getLogger(__name__)

GONE = 410


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    labels: PodLabels  # allow-listed only, sorted by name
    containers: dict[str, str] = field(default_factory=dict)  # container ID → container name
    container_names: tuple[str, ...] = ()


def _container_id(raw: str) -> str:
    """`containerd://<id>` (or cri-o://, docker://) → `<id>`, lower-case."""
    return raw.rsplit("://", 1)[-1].strip().lower()


def pod_info(obj: dict[str, Any], allowlist: frozenset[str]) -> PodInfo | None:
    """PodInfo from a pod as JSON; None when it lacks identity (uid, namespace, name)."""
    meta = obj.get("metadata") or {}
    uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str)):
        return None
    raw_labels = meta.get("labels") or {}
    labels = tuple(sorted((k, str(v)) for k, v in raw_labels.items() if k in allowlist)) \
        if isinstance(raw_labels, dict) else ()
    status = obj.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, dict) and cs.get("containerID") and cs.get("name"):
                containers[_container_id(str(cs["containerID"]))] = str(cs["name"])
    spec = obj.get("spec") or {}
    names = tuple(str(c.get("name")) for c in spec.get("containers") or ()
                  if isinstance(c, dict) and c.get("name"))
    return PodInfo(uid.lower(), ns, name, labels, containers, names)


class _Expired(Exception):
    """The watch's resourceVersion is gone: relist."""


class PodWatch:
    """Call start(); read `pods` (uid → PodInfo), `by_name`, `by_container` and `status` from
    any thread. Each is replaced whole on change, never mutated, so readers need no lock."""

    def __init__(self, options: ExporterOptions, *, watch_timeout: int = 300,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 request_timeout: float = 10.0) -> None:
        self.options = options
        self.node = options.node
        self.allowlist = frozenset(options.pod_label_allowlist)
        self.watch_timeout = watch_timeout
        self.backoff_initial, self.backoff_max = backoff_initial, backoff_max
        self.request_timeout = request_timeout
        self.pods: dict[str, PodInfo] = {}
        self.by_name: dict[tuple[str, str], PodInfo] = {}
        self.by_container: dict[str, PodInfo] = {}
        self.status = SourceStatus(False, "starting")
        self.lists = 0  # completed lists (the first, then one per relist), for tests and logs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._api: Any = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> PodWatch:
        if self._thread is not None:
            return self
        if not self.node:
            self.status = SourceStatus(False, "no-node-name")
            return self
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._abort_response()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._api is not None:
            self._api.api_client.close()

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                if self._api is None:
                    self._api = self._connect()
                version = self._list()
                backoff = self.backoff_initial
                while not self._stop.is_set():
                    version = self._watch(version)
            except _Expired:
                log.info("pod watch: resourceVersion expired, relisting")
                continue
            except Exception as err:  # any failure: report, back off, relist
                if self._stop.is_set():
                    return
                self.status = SourceStatus(False, _reason(err))
                log.warning("pod watch failed (%s), retrying in %.1fs", err, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    def _connect(self) -> Any:
        from kubernetes import client
        from kubernetes import config as k8s_config

        config: Any = k8s_config  # untyped functions
        path = self.options.kubeconfig
        if path:
            try:
                api_client = config.new_client_from_config(config_file=path)
            except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as err:
                raise ConfigError(path, "", f"a kubeconfig with a usable current context "
                                            f"({err})") from err
        else:
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
                api_client = client.ApiClient(cfg)
            except config.ConfigException:
                api_client = config.new_client_from_config()  # $KUBECONFIG / ~/.kube/config
        return client.CoreV1Api(api_client)

    def _selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def _list(self) -> str:
        resp = self._api.list_pod_for_all_namespaces(
            field_selector=self._selector(), _preload_content=False,
            _request_timeout=self.request_timeout)
        body = json.loads(resp.data)
        pods = {}
        for obj in body.get("items") or ():
            info = pod_info(obj, self.allowlist)
            if info is not None:
                pods[info.uid] = info
        self._publish(pods)
        self.lists += 1
        self.status = SourceStatus(True)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch request from `version` until the server ends it; returns the version to
        resume from. Raises _Expired on 410."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._api.list_pod_for_all_namespaces(
                field_selector=self._selector(), watch=True, resource_version=version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout,
                _preload_content=False,
                _request_timeout=(self.request_timeout, self.watch_timeout + self.request_timeout))
        except ApiException as err:
            if err.status == GONE:
                raise _Expired from err
            raise
        self._response = resp
        try:
            for event in _events(resp):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == GONE:
                        raise _Expired
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    version = str(rv)
                self._apply(kind, obj)
        finally:
            self._response = None
            resp.release_conn()
        return version

    def _apply(self, kind: Any, obj: dict[str, Any]) -> None:
        info = pod_info(obj, self.allowlist)
        if info is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK only moves the version
        pods = dict(self.pods)
        if kind == "DELETED":
            pods.pop(info.uid, None)
        else:
            pods[info.uid] = info
        self._publish(pods)

    def _publish(self, pods: dict[str, PodInfo]) -> None:
        self.by_name = {(p.namespace, p.name): p for p in pods.values()}
        self.by_container = {cid: p for p in pods.values() for cid in p.containers}
        self.pods = pods

    def _abort_response(self) -> None:
        """Unblock a watch read so close() need not wait for the server's timeout."""
        resp = self._response
        if resp is None:
            return
        shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3
        with contextlib.suppress(OSError):
            if shutdown is not None:
                shutdown()
                return
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """JSON watch events from a streamed response, one per line (chunks split anywhere)."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
    if buffer.strip():
        event = json.loads(buffer)
        if isinstance(event, dict):
            yield event


def _reason(err: Exception) -> str:
    """A short, low-cardinality reason for gpu_exporter_source_error_info."""
    status = getattr(err, "status", None)
    if isinstance(status, int) and status:
        return {401: "unauthorized", 403: "forbidden", 404: "not-found"}.get(
            status, f"http-{status}")
    name = type(err).__name__
    if isinstance(err, ConfigError) or name == "ConfigException":
        return "no-config"
    if isinstance(err, (OSError, ConnectionError)) or "MaxRetryError" in name \
            or "ProtocolError" in name or "Timeout" in name:
        return "unreachable"
    if isinstance(err, (ValueError, KeyError, TypeError)):
        return "bad-response"
    return "error"
