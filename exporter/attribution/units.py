"""Allocation rows and the one merge step (the seam dcgm-exporter calls `Transform`).

Every allocation source (sources.py: device plugin, DRA, fractional grants, vGPU; a new
vendor is one more function) turns its inputs into `Unit` rows: one row per unit a container
holds of a device. `merge` is the only place that counts units, lists a device's holders,
decides replicas and keeps grants, so every source is billed by the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gpu_ledger.sharing import SharingMode

DeviceKey = tuple[str, str]  # (GPU uuid, MIG uuid or '')


class Holder(NamedTuple):
    """A container, as PodResources and the pod watch name it."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Grant:
    """What a share was granted of its device: a fractional scheduler's memory and core grant,
    a vGPU type's framebuffer. `memory_bytes` becomes a fraction of the GPU's framebuffer
    when emitted."""

    memory_bytes: int | None = None
    memory_fraction: float | None = None
    core_fraction: float | None = None


@dataclass(frozen=True)
class InstanceUse:
    """Use figures the host has only per device instance, not per process (a vGPU VM)."""

    sm_util: float | None = None  # 0-1 of the GPU; None: no sample
    memory_used: int | None = None  # bytes; None: unknown


@dataclass(frozen=True)
class Unit:
    """One unit of `resource` that `holder` holds on `device`, in sharing `mode`."""

    holder: Holder
    device: DeviceKey
    resource: str
    mode: SharingMode
    grant: Grant | None = None
    use: InstanceUse | None = None


class UnitKey(NamedTuple):
    """One line of gpu_container_allocation: a container's units of one resource on a device."""

    holder: Holder
    uuid: str
    mig_uuid: str
    resource: str
    sharing: SharingMode


class UsageKey(NamedTuple):
    """A container on a device: the labels of gpu_container_{memory,sm,processes}."""

    holder: Holder
    uuid: str
    mig_uuid: str

    def labels(self, node: str) -> tuple[str, ...]:
        return (node, *self.holder, self.uuid, self.mig_uuid)


@dataclass(frozen=True)
class Merged:
    units: dict[UnitKey, int]  # how many units each line holds
    replicas: dict[UnitKey, int]  # the line's `replicas` label
    holders: dict[DeviceKey, list[Holder]]  # each device's holders, each once
    grants: dict[UsageKey, Grant]  # the last row's grant for a container on a device
    uses: dict[UsageKey, InstanceUse]


def merge(rows: Iterable[Unit], allocatable: Mapping[DeviceKey, int]) -> Merged:
    """Rows of every source → lines. `allocatable`: IDs per device in the kubelet's
    GetAllocatableResources (the device plugin's replicas).

    Replicas: 1 for `exclusive` and `mig`; for a `fractional` grant, the number of containers
    with a fractional grant on the device (the scheduler's slots, e.g. HAMi's ten kubelet
    IDs per GPU, are not shares); for other shares, the device's allocatable IDs, else every
    unit handed out on it."""
    units: dict[UnitKey, int] = {}
    holders: dict[DeviceKey, list[Holder]] = {}
    grants: dict[UsageKey, Grant] = {}
    uses: dict[UsageKey, InstanceUse] = {}
    handed_out: dict[DeviceKey, int] = {}
    fractional: dict[DeviceKey, set[Holder]] = {}
    for row in rows:
        uuid, mig_uuid = row.device
        key = UnitKey(row.holder, uuid, mig_uuid, row.resource, row.mode)
        units[key] = units.get(key, 0) + 1
        handed_out[row.device] = handed_out.get(row.device, 0) + 1
        hs = holders.setdefault(row.device, [])
        if row.holder not in hs:
            hs.append(row.holder)
        if row.mode == SharingMode.FRACTIONAL:
            fractional.setdefault(row.device, set()).add(row.holder)
        usage = UsageKey(row.holder, uuid, mig_uuid)
        if row.grant is not None:
            grants[usage] = row.grant
        if row.use is not None:
            uses[usage] = row.use
    replicas: dict[UnitKey, int] = {}
    for key in units:
        dev = (key.uuid, key.mig_uuid)
        if key.sharing in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            replicas[key] = 1
        elif key.sharing == SharingMode.FRACTIONAL:
            replicas[key] = len(fractional[dev])
        else:
            replicas[key] = allocatable.get(dev) or max(handed_out[dev], 1)
    return Merged(units, replicas, holders, grants, uses)
