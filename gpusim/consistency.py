"""Checks across a scenario's entries: unique pod names, no device unit held twice at once,
no pid used twice."""

from __future__ import annotations

import math

from exporter.errors import ConfigError
from gpusim.model import ContainerSpec, GpuSpec, HostProcessSpec, PodSpec, UnitRef


def check_pod_names(file: str, pods: tuple[PodSpec, ...]) -> None:
    seen: dict[tuple[str, str], int] = {}
    for p in pods:
        if (p.namespace, p.name) in seen:
            raise ConfigError(file, f"pods[{p.index}].name", "a name unique in its namespace",
                              f"{p.namespace}/{p.name}")
        seen[(p.namespace, p.name)] = p.index


def _overlap(a: PodSpec, b: PodSpec) -> bool:
    """Whether two pods can be alive at once. Repeating pods are treated as always alive from
    their start, which is stricter than needed but keeps the check simple."""
    a_end = math.inf if a.end is None or a.repeat is not None else a.end
    b_end = math.inf if b.end is None or b.repeat is not None else b.end
    return a.start < b_end and b.start < a_end


def check_units(file: str, pods: tuple[PodSpec, ...], gpus: tuple[GpuSpec, ...]) -> None:
    """No device unit is held by two containers at the same time."""
    holders: dict[UnitRef, list[tuple[PodSpec, str]]] = {}
    for p in pods:
        for ci, c in enumerate(p.containers):
            for ui, u in enumerate(c.units):
                if u.claim or u.is_grant:  # claims and grants are made to be shared
                    continue
                for other, where in holders.get(u, []):
                    if other is p or _overlap(other, p):
                        raise ConfigError(
                            file, f"pods[{p.index}].containers[{ci}].gpus[{ui}]",
                            f"a device unit no other container holds at the same time "
                            f"(held by {where})", _unit_text(u))
                holders.setdefault(u, []).append(
                    (p, f"{p.namespace}/{p.name}/{c.name}"))
    del gpus


def _unit_text(u: UnitRef) -> str:
    s = f"gpu {u.gpu}"
    if u.mig is not None:
        s += f" mig {u.mig}"
    if u.replica is not None:
        s += f" replica {u.replica}"
    if u.vgpu is not None:
        s += f" vgpu {u.vgpu}"
    return s


def process_slots(c: ContainerSpec) -> int:
    return sum(1 if p.unit is not None else len(c.units) for p in c.processes)


def check_pids(file: str, pods: tuple[PodSpec, ...],
                hosts: tuple[HostProcessSpec, ...]) -> None:
    seen: dict[int, str] = {}

    def claim(pid: int, key: str) -> None:
        if pid in seen:
            raise ConfigError(file, key, f"a pid not used elsewhere (also at {seen[pid]})", pid)
        seen[pid] = key

    for p in pods:
        for ci, c in enumerate(p.containers):
            for pi, proc in enumerate(c.processes):
                if proc.pid is None:
                    continue
                key = f"pods[{p.index}].containers[{ci}].processes[{pi}].pid"
                n = 1 if proc.unit is not None else len(c.units)
                for j in range(n):
                    claim(proc.pid + j, key)
    for i, h in enumerate(hosts):
        if h.pid is not None:
            claim(h.pid, f"host_processes[{i}].pid")
