"""The pods of this node: a NodeScopedWatch of /api/v1/pods, indexed for attribution.

Keeps pod UID → namespace, name, allow-listed labels and container ID → container name, so a
scrape never calls the API (list+watch, 410 relist, bookmarks and backoff: exporter/kube/watch.py).
Pods are read from plain JSON, field by field: a pod missing fields (a half-written status)
cannot stall the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.attribution.fractional import ParsedGrants, parse_grants
from exporter.attribution.inteltiles import ANNOTATION as TILES_ANNOTATION
from exporter.attribution.inteltiles import ContainerTiles, parse_tiles
from exporter.core import ExporterOptions, PodLabels, SourceStatus
from exporter.kube.client import connector
from exporter.kube.watch import (
    DEFAULT_BACKOFF,
    BackoffPolicy,
    NodeScopedWatch,
    WatchedKind,
)


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    labels: PodLabels  # allow-listed only, sorted by name
    containers: dict[str, str] = field(default_factory=dict)  # container ID → container name
    container_names: tuple[str, ...] = ()
    owner: tuple[str, str] = ("", "")  # controller (kind, name); ("", "") for a bare pod
    # HAMi / gpushare fractional grants from the pod's annotations, and what failed to parse
    grants: ParsedGrants = field(default_factory=ParsedGrants)
    # Intel tiles per GPU-using container from GPU Aware Scheduling (inteltiles.py)
    intel_tiles: tuple[ContainerTiles, ...] = ()


def owner_of(meta: dict[str, Any]) -> tuple[str, str]:
    """The pod's controller from its ownerReferences, so metering can group a workload's pods
    whatever their names. A ReplicaSet named `<deployment>-<pod-template-hash>` (the label the
    Deployment controller puts on its pods) is reported as that Deployment; other kinds
    (StatefulSet, Job, DaemonSet, a ReplicaSet of its own) as they are."""
    refs = meta.get("ownerReferences")
    ref = next((r for r in refs if isinstance(r, dict) and r.get("controller") is True),
               None) if isinstance(refs, list) else None
    if ref is None or not isinstance(ref.get("kind"), str) or not isinstance(ref.get("name"), str):
        return ("", "")
    kind, name = ref["kind"], ref["name"]
    labels = meta.get("labels")
    pth = labels.get("pod-template-hash") if isinstance(labels, dict) else None
    if kind == "ReplicaSet" and isinstance(pth, str) and pth and name.endswith("-" + pth):
        return ("Deployment", name[: -len(pth) - 1])
    return (kind, name)


def _container_id(raw: str) -> str:
    """`containerd://<id>` (or cri-o://, docker://) → `<id>`, lower-case."""
    return raw.rsplit("://", 1)[-1].strip().lower()


def _names(containers: object) -> tuple[str, ...]:
    """The names of a spec's container list, in order."""
    if not isinstance(containers, list):
        return ()
    return tuple(c["name"] for c in containers
                 if isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"])


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _grants(annotations: dict[str, Any], names: tuple[str, ...],
            init_names: tuple[str, ...]) -> ParsedGrants:
    """parse_grants never raises by design; should it ever, the pod loses its grant, not the
    node its pod list (this runs inside the watch's list and event handling)."""
    try:
        return parse_grants(annotations, names, init_names)
    except Exception as e:  # tenant-written input must never fail a list
        return ParsedGrants(errors=(f"annotations unreadable ({type(e).__name__})",))


def pod_info(obj: dict[str, Any], allowlist: frozenset[str]) -> PodInfo | None:
    """PodInfo from a pod as JSON; None when it lacks identity (uid, namespace, name). Never
    raises: a field of the wrong shape is read as absent, so one odd pod cannot fail a list."""
    meta = _dict(obj.get("metadata"))
    uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str)):
        return None
    raw_labels = _dict(meta.get("labels"))
    labels = tuple(sorted((k, str(v)) for k, v in raw_labels.items()
                          if k in allowlist and isinstance(v, str)))
    status = _dict(obj.get("status"))
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        statuses = status.get(key)
        for cs in statuses if isinstance(statuses, list) else ():
            if isinstance(cs, dict) and isinstance(cs.get("containerID"), str) and \
                    isinstance(cs.get("name"), str) and cs["containerID"] and cs["name"]:
                containers[_container_id(cs["containerID"])] = cs["name"]
    spec = _dict(obj.get("spec"))
    names, init_names = _names(spec.get("containers")), _names(spec.get("initContainers"))
    annotations = meta.get("annotations")
    grants = _grants(annotations, names, init_names) if isinstance(annotations, dict) \
        else ParsedGrants()
    tiles = parse_tiles(annotations.get(TILES_ANNOTATION)) if isinstance(annotations, dict) \
        else ()
    return PodInfo(uid.lower(), ns, name, labels, containers, names, owner_of(meta), grants,
                   tiles)


class PodWatch:
    """Call start(); read `pods` (uid → PodInfo), `by_name`, `by_container` and `status` from
    any thread. Each is replaced whole on change, never mutated, so readers need no lock."""

    def __init__(self, options: ExporterOptions, *, watch_timeout: int = 300,
                 backoff: BackoffPolicy = DEFAULT_BACKOFF, request_timeout: float = 10.0) -> None:
        self.node = options.node
        allowlist = frozenset(options.pod_label_allowlist)
        self.pods: dict[str, PodInfo] = {}
        self.by_name: dict[tuple[str, str], PodInfo] = {}
        self.by_container: dict[str, PodInfo] = {}
        kind = WatchedKind("pod", "/api/v1/pods", lambda obj: pod_info(obj, allowlist))
        self._watch = NodeScopedWatch(
            kind, options.node, connector(options.kubeconfig, request_timeout),
            on_change=self._index, policy=backoff, watch_timeout=watch_timeout)

    @property
    def started(self) -> bool:
        return self._watch.started

    @property
    def running(self) -> bool:
        return self._watch.running

    @property
    def version(self) -> str:
        return self._watch.version

    @property
    def status(self) -> SourceStatus:
        if not self.node:
            return SourceStatus(False, "no-node-name")
        return self._watch.status

    @property
    def lists(self) -> int:
        """Completed lists: the first, then one per relist."""
        return self._watch.lists

    def start(self) -> PodWatch:
        if self.node:
            self._watch.start()
        return self

    def close(self) -> None:
        self._watch.close()

    def _index(self, items: Mapping[str, PodInfo]) -> None:
        pods = {p.uid: p for p in items.values()}
        self.by_name = {(p.namespace, p.name): p for p in pods.values()}
        self.by_container = {cid: p for p in pods.values() for cid in p.containers}
        self.pods = pods
