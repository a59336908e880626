"""Fractional GPU grants that schedulers record in pod annotations (sharing mode `fractional`).

HAMi (`nvidia.com/gpumem`, `gpumem-percentage`, `gpucores`; Project-HAMi/HAMi
`pkg/device/devices.go` EncodePodSingleDevice / DecodePodDevices, `pkg/util/util.go` before
v2.7): the scheduler writes its decision to `hami.io/vgpu-devices-allocated` as one `;`-ended
group per container, devices in a group `:`-ended, each `<uuid>,<type>,<memory MiB>,<core %>`
(e.g. `GPU-0fc3...,NVIDIA,3000,30:;`). Memory is in MiB whichever resource asked for it (a
`gpumem-percentage` request is turned into MiB of the chosen GPU before it is written); HAMi
reads both numbers as int32 (`strconv.ParseInt(s, 10, 32)`). A core share of 0 means "not
limited". Which containers the groups are for depends on the scheduler's version:
- up to v2.8.x: one group per `spec.containers` entry (`Resourcereqs` walks those only);
- since v2.9.0 (#1650): `spec.initContainers` first, then `spec.containers`.
The scheduler writes a group, empty or not, for every container it walked (`calcScore` fills
the ones without a device since v2.7.0; before, those ahead of the first container with a
device could get none, and v2.4.x-v2.5.x wrote `,,0,0:` for one after it, so fewer groups
than containers are read by position, as HAMi's device plugin reads them). A pod without
init containers reads the same either way; with some, the group count says which encoding it
is (init + regular, or regular only); any other count is refused, since no position could be
trusted.
In HAMi's MIG mode the UUID carries the MIG template, `GPU-<uuid>[<template>-<position>]`:
the grant is attributed to the GPU.

Alibaba gpushare (`aliyun.com/gpu-mem`): `ALIYUN_COM_GPU_MEM_IDX` is the GPU's index,
`ALIYUN_COM_GPU_MEM_POD` the units the pod got and `ALIYUN_COM_GPU_MEM_DEV` the units the
device has (both GiB by default), so the memory fraction is POD / DEV; no core share.

Every number is read by `strict.ascii_uint` (ASCII digits, bounded, range-checked). Parsing
never raises: a HAMi annotation with any bad part gives no HAMi grant at all (a partly read
decision would be a wrong bill) and one error string; so does a bad gpushare triple. The
collector logs and counts a pod's errors once (gpu_exporter_fractional_errors_total).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.attribution.strict import INT32_MAX, ascii_uint

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
GPUSHARE_IDX, GPUSHARE_POD, GPUSHARE_DEV = (
    "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_POD", "ALIYUN_COM_GPU_MEM_DEV")
HAMI_RESOURCE, GPUSHARE_RESOURCE = "nvidia.com/gpumem", "aliyun.com/gpu-mem"
MiB = 1 << 20
# Longest HAMi annotation read: ~70 characters a device, so room for hundreds of containers
# with several GPUs each; a longer one is refused before it is split.
MAX_ANNOTATION = 64 * 1024
MAX_GPU_INDEX = 65535
# `GPU-<uuid>` as NVML spells it, optionally with HAMi's MIG template `[<t>-<p>]`
# v2.4.x-v2.5.x `calcScore` gives a container without a device after the first one with a
# device an empty ContainerDevice, encoded `,,0,0`
_PLACEHOLDER = re.compile(r",,0,0(?:,.*)?")
_HAMI_UUID = re.compile(r"(?P<uuid>[A-Za-z0-9-]{1,100})(?:\[[0-9]{1,4}-[0-9]{1,4}\])?")


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
    errors: tuple[str, ...] = ()  # at most one per scheduler, each naming its annotation


def parse_grants(annotations: Mapping[str, object], containers: tuple[str, ...],
                 init_containers: tuple[str, ...] = ()) -> ParsedGrants:
    """The grants of a pod whose spec lists `init_containers` and `containers` (names)."""
    grants: list[FractionalGrant] = []
    errors: list[str] = []
    if HAMI_ALLOCATED in annotations:
        hami = _hami(annotations[HAMI_ALLOCATED], containers, init_containers)
        if isinstance(hami, str):
            errors.append(f"{HAMI_ALLOCATED}: {hami}")
        else:
            grants.extend(hami)
    if GPUSHARE_IDX in annotations:
        share = _gpushare(annotations)
        if isinstance(share, str):
            errors.append(share)
        else:
            grants.append(share)
    return ParsedGrants(tuple(grants), tuple(errors))


def _hami(value: object, containers: tuple[str, ...], init_containers: tuple[str, ...]
          ) -> list[FractionalGrant] | str:
    """The grants, or what is wrong (the first problem found)."""
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    if len(value) > MAX_ANNOTATION:
        return f"{len(value)} characters, more than {MAX_ANNOTATION}"
    if not value.strip(";: \n"):
        return []  # nothing granted (what the device plugin leaves of -to-allocate)
    groups = value.split(";")
    if groups[-1] == "":
        groups.pop()  # the terminator after the last container
    if len(groups) == len(init_containers) + len(containers):
        names = init_containers + containers  # v2.9.0+ (or no init containers)
    elif len(groups) == len(containers) or (not init_containers and len(groups) < len(containers)):
        # up to v2.8.x: regular containers only. Fewer groups than containers (no writer of
        # HAMi's does that) are read as HAMi's device plugin reads them: by position.
        names = containers[:len(groups)]
    else:
        return (f"{len(groups)} container groups, but the pod has {len(init_containers)} init "
                f"and {len(containers)} containers")
    out: list[FractionalGrant] = []
    for name, group in zip(names, groups, strict=True):
        for dev in group.split(":"):
            if not dev or _PLACEHOLDER.fullmatch(dev):
                continue  # the terminator after a group's last device; v2.4-2.5's no device
            grant = _hami_device(dev, name)
            if isinstance(grant, str):
                return grant
            out.append(grant)
    return out


def _hami_device(dev: str, container: str) -> FractionalGrant | str:
    parts = dev.split(",")
    # HAMi's own decoder needs at least four fields and ignores any after them
    uuid = _HAMI_UUID.fullmatch(parts[0]) if len(parts) >= 4 else None
    memory = ascii_uint(parts[2], INT32_MAX) if len(parts) >= 4 else None
    cores = ascii_uint(parts[3], 100) if len(parts) >= 4 else None
    if uuid is None or not parts[1] or memory is None or cores is None:
        return (f"device entry {dev[:60]!r}{'...' if len(dev) > 60 else ''} is not "
                "<uuid>,<type>,<MiB 0-2147483647>,<core % 0-100>")
    return FractionalGrant(container, uuid["uuid"], HAMI_RESOURCE, memory_bytes=memory * MiB,
                           core_fraction=cores / 100 if cores else None)


def _gpushare(annotations: Mapping[str, object]) -> FractionalGrant | str:
    raw = {k: annotations.get(k) for k in (GPUSHARE_IDX, GPUSHARE_POD, GPUSHARE_DEV)}
    idx = ascii_uint(raw[GPUSHARE_IDX], MAX_GPU_INDEX)
    pod = ascii_uint(raw[GPUSHARE_POD], INT32_MAX)
    dev = ascii_uint(raw[GPUSHARE_DEV], INT32_MAX)
    if idx is None or pod is None or dev is None:
        shown = ", ".join(f"{k}={str(v)[:20]!r}" for k, v in raw.items())
        return f"{GPUSHARE_IDX}/_POD/_DEV: not all three are whole numbers ({shown})"
    if dev == 0 or pod > dev:
        return f"{GPUSHARE_POD}={pod} of {GPUSHARE_DEV}={dev} is not a fraction"
    return FractionalGrant("", str(idx), GPUSHARE_RESOURCE, memory_fraction=pod / dev)
