"""Fractional GPU grants that schedulers record in pod annotations (sharing mode `fractional`).

HAMi (`nvidia.com/gpumem`, `nvidia.com/gpucores`): the scheduler writes its decision to
`hami.io/vgpu-devices-allocated` as one group per container of the pod spec, groups ended by
`;`, devices in a group ended by `:`, each device `<uuid>,<vendor>,<memory MiB>,<core %>`
(e.g. `GPU-0fc3...,NVIDIA,3000,30:;`). A core share of 0 means "not limited".

Alibaba gpushare (`aliyun.com/gpu-mem`): `ALIYUN_COM_GPU_MEM_IDX` is the GPU's index,
`ALIYUN_COM_GPU_MEM_POD` the units the pod got and `ALIYUN_COM_GPU_MEM_DEV` the units the
device has (both GiB by default), so the memory fraction is POD / DEV; no core share.

Parsing never raises: a malformed annotation gives no grant and one error string, which the
pod watch logs once and counts (gpu_exporter_fractional_errors_total).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
GPUSHARE_IDX, GPUSHARE_POD, GPUSHARE_DEV = (
    "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_POD", "ALIYUN_COM_GPU_MEM_DEV")
HAMI_RESOURCE, GPUSHARE_RESOURCE = "nvidia.com/gpumem", "aliyun.com/gpu-mem"
MiB = 1 << 20


@dataclass(frozen=True)
class FractionalGrant:
    container: str  # '' when the scheduler names none (gpushare): the pod's first container
    device: str  # a device ID as deviceids resolves it: a UUID (HAMi) or an index (gpushare)
    resource: str  # the extended resource the grant is for, the allocation's `resource` label
    memory_bytes: int | None = None  # HAMi: granted framebuffer
    memory_fraction: float | None = None  # gpushare: POD / DEV
    core_fraction: float | None = None  # HAMi: core % / 100; None when not limited


@dataclass(frozen=True)
class ParsedGrants:
    grants: tuple[FractionalGrant, ...] = ()
    errors: tuple[str, ...] = ()  # one line each, naming the annotation


def parse_grants(annotations: Mapping[str, object],
                 containers: tuple[str, ...]) -> ParsedGrants:
    grants: list[FractionalGrant] = []
    errors: list[str] = []
    hami = annotations.get(HAMI_ALLOCATED)
    if isinstance(hami, str) and hami.strip(";: \n"):
        _hami(hami, containers, grants, errors)
    if GPUSHARE_IDX in annotations:
        _gpushare(annotations, grants, errors)
    return ParsedGrants(tuple(grants), tuple(errors))


def _hami(value: str, containers: tuple[str, ...], grants: list[FractionalGrant],
          errors: list[str]) -> None:
    groups = value.split(";")
    if groups and groups[-1] == "":
        groups.pop()  # the terminator after the last container
    for i, group in enumerate(groups):
        for dev in (d for d in group.split(":") if d):
            parts = dev.split(",")
            if len(parts) != 4 or not parts[0] or not parts[2].isdigit() or \
                    not parts[3].isdigit() or int(parts[3]) > 100:
                errors.append(f"{HAMI_ALLOCATED}: malformed device entry {dev[:80]!r}")
                continue
            if i >= len(containers):
                errors.append(f"{HAMI_ALLOCATED}: group {i + 1} but the pod has "
                              f"{len(containers)} containers")
                continue
            cores = int(parts[3])
            grants.append(FractionalGrant(containers[i], parts[0], HAMI_RESOURCE,
                                          memory_bytes=int(parts[2]) * MiB,
                                          core_fraction=cores / 100 if cores else None))


def _gpushare(annotations: Mapping[str, object], grants: list[FractionalGrant],
              errors: list[str]) -> None:
    raw = {k: annotations.get(k) for k in (GPUSHARE_IDX, GPUSHARE_POD, GPUSHARE_DEV)}
    if not all(isinstance(v, str) and v.isdigit() for v in raw.values()):
        errors.append(f"{GPUSHARE_IDX}/_POD/_DEV: not all three are whole numbers "
                      f"({', '.join(f'{k}={str(v)[:20]!r}' for k, v in raw.items())})")
        return
    pod, dev = int(str(raw[GPUSHARE_POD])), int(str(raw[GPUSHARE_DEV]))
    if dev == 0 or pod > dev:
        errors.append(f"{GPUSHARE_POD}={pod} of {GPUSHARE_DEV}={dev} is not a fraction")
        return
    grants.append(FractionalGrant("", str(int(str(raw[GPUSHARE_IDX]))), GPUSHARE_RESOURCE,
                                  memory_fraction=pod / dev))
