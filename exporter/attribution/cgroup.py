"""Host PID → (pod UID, container ID) from /proc/<pid>/cgroup.

Works for cgroup v1 and v2, the cgroupfs and systemd drivers, and containerd, CRI-O and docker
(cri-dockerd). Paths are matched by pattern, not by prefix: under a cgroup namespace they may
start with `/../`, and nested cgroups may follow the container's segment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# Static (mirror) pods have a 32-hex config hash as UID instead of a dashed UUID.
_POD = re.compile(rf"(?:^|[/-])pod(?P<uid>{_UID}|[0-9a-fA-F]{{32}})(?:\.slice)?$")
# One path segment naming a container; crio-conmon-<id> is CRI-O's monitor, not the container.
_CONTAINER = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|cri-dockerd|containerd)-)?(?P<id>[0-9a-fA-F]{64})"
    r"(?:\.scope)?$")
_CONMON = re.compile(r"^crio-conmon-[0-9a-fA-F]+(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupRef:
    pod_uid: str  # dashed lower-case UUID (or static pod hash); '' when only the container is known
    container_id: str  # lower-case 64-hex; '' when the process is not in a container's cgroup


def _match_path(path: str) -> CgroupRef | None:
    pod_uid = ""
    container_id = ""
    conmon = False
    for segment in path.split("/"):
        if not pod_uid:
            p = _POD.search(segment)
            if p:
                # Anything container-like above the pod is an outer container (kind, k3d
                # nodes run kubelets inside docker): only what follows the pod counts.
                pod_uid = p["uid"].replace("_", "-").lower()
                container_id, conmon = "", False
                continue
        if not container_id:
            c = _CONTAINER.match(segment)
            if c:
                container_id = c["id"].lower()
            elif _CONMON.match(segment):
                conmon = True
    if conmon and not container_id:
        return CgroupRef(pod_uid, "") if pod_uid else None
    if pod_uid or container_id:
        return CgroupRef(pod_uid, container_id)
    return None


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod and container a /proc/<pid>/cgroup text places the process in, or None.

    Each line is `hierarchy-id:controllers:path`; v1 has one per hierarchy (some may sit at
    `/`), v2 a single `0::path`. The most specific match over all lines wins.
    """
    best: CgroupRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = _match_path(parts[2].strip())
        if ref is None:
            continue
        if ref.pod_uid and ref.container_id:
            return ref
        if best is None or (ref.pod_uid and not best.pod_uid):
            best = ref
    return best


class CgroupResolver:
    """Caches pid → CgroupRef while the pid stays in NVML's process list. A pid that leaves the
    list is forgotten at once: pids are reused, and a new process may live in another pod."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._cache: dict[int, CgroupRef | None] = {}

    def resolve(self, pids: Iterable[int]) -> dict[int, CgroupRef | None]:
        old = self._cache
        cache: dict[int, CgroupRef | None] = {}
        result: dict[int, CgroupRef | None] = {}
        for pid in pids:
            if pid in result:
                continue
            if pid in old:
                result[pid] = cache[pid] = old[pid]
                continue
            text = self._read(pid)
            if text is None:
                result[pid] = None  # not cached: the process may be starting or just gone
            else:
                result[pid] = cache[pid] = parse_cgroup(text)
        self._cache = cache  # pids no longer listed are dropped here
        return result

    def _read(self, pid: int) -> str | None:
        try:
            with open(os.path.join(self.proc_root, str(pid), "cgroup"), encoding="utf-8",
                      errors="replace") as f:
                return f.read()
        except OSError:
            return None
