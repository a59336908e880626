"""Allocation sources: each a function from its inputs to `Unit` rows (units.py merges them).

A source resolves its own IDs, decides the sharing mode of what it hands out and reports what
it cannot resolve; it never counts units, lists holders or decides replicas (that is `merge`).
Adding a source (AMD, Intel) is one more function here and one line in the collector.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping

from exporter.attribution.amdids import AMD_DRA_DRIVER, AmdDeviceIndex, AmdRef, is_amd_resource
from exporter.attribution.deviceids import DeviceIndex, UnknownIds, is_gpu_resource, sharing_mode
from exporter.attribution.dra import ClaimDevice, DraResolver, SliceKey
from exporter.attribution.podresources import Allocation
from exporter.attribution.podwatch import PodInfo
from exporter.attribution.resourceclaims import ClaimConfig, ClaimKey
from exporter.attribution.units import DeviceKey, Grant, Holder, InstanceUse, Unit
from exporter.attribution.vgpu import VgpuInstance
from gpu_ledger.sharing import SharingMode

Overrides = Mapping[str, SharingMode]


def _vgpu_id(device_id: str) -> str:
    return device_id.strip().lower()


def device_plugin_units(allocations: Iterable[Allocation], index: DeviceIndex,
                        overrides: Overrides, unknown: UnknownIds,
                        vgpu_ids: Collection[str] = ()) -> list[Unit]:
    """PodResources device IDs of GPU resources: one row per device an ID names. HAMi's
    kubelet slots are recognised and left to the fractional source; IDs in `vgpu_ids` (mdev
    UUIDs) to the vGPU source; `amd.com/*` to the AMD source (`amd_units`: partitions, VFs);
    anything else that names nothing here is reported."""
    rows: list[Unit] = []
    for a in allocations:
        if (not is_gpu_resource(a.resource, overrides) or is_amd_resource(a.resource)
                or a.resource.startswith(INTEL_PREFIX)):
            continue  # amd.com/*: amd_units; Intel's plugin: intel_plugin_units
        holder = Holder(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            refs = index.resolve_all(device_id)
            if not refs:
                if _vgpu_id(device_id) not in vgpu_ids:
                    unknown.report(a.resource, device_id)
                continue
            rows.extend(Unit(holder, ref.key, a.resource, sharing_mode(a.resource, ref, overrides))
                        for ref in refs if not ref.slot)
    return rows


def vgpu_units(allocations: Iterable[Allocation], index: DeviceIndex,
               vgpus: Mapping[str, VgpuInstance], overrides: Overrides) -> list[Unit]:
    """KubeVirt vGPUs and mediated devices: a device ID that is the mdev UUID of an active
    instance (an NVIDIA vGPU, an Intel GVT-g mdev) is a `vgpu` unit of its physical GPU, with
    the instance's share as its grant and its use figures as the holder's. Any resource name
    counts: KubeVirt names mdev resources as its CR says, and an mdev UUID of this node's GPUs
    names nothing else."""
    rows: list[Unit] = []
    if not vgpus:
        return rows
    for a in allocations:
        if is_amd_resource(a.resource):
            continue  # amd.com/*: the AMD source
        holder = Holder(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            vgpu = vgpus.get(_vgpu_id(device_id))
            if vgpu is None or index.resolve_all(device_id):
                continue
            rows.append(Unit(holder, (vgpu.gpu_uuid, ""), a.resource, SharingMode.VGPU,
                             Grant(memory_fraction=vgpu.framebuffer_fraction),
                             InstanceUse(vgpu.sm_util, vgpu.memory_used)))
    return rows


def dra_units(claims: Iterable[ClaimDevice], dra: DraResolver, uuids: dict[SliceKey, str] | None,
              index: DeviceIndex, overrides: Overrides,
              configs: Callable[[set[ClaimKey]], Mapping[ClaimKey, ClaimConfig]],
              unknown: UnknownIds, *, count_unresolved: bool = True) -> list[Unit]:
    """DRA devices. A device whose claim several containers consume is one share per
    container: MPS or time-slicing as the --sharing-mode override for the driver says, else as
    the claim's config says (MPS, else time-slicing). `configs` is asked only for the claims
    of shared devices without an override. A device named twice in one container's claims is
    one unit. `count_unresolved` False: a device that resolves to nothing is not reported
    (the node's ResourceSlices are not listed yet)."""
    resolved: list[tuple[Holder, DeviceKey, bool, ClaimDevice]] = []
    sharers: dict[DeviceKey, set[Holder]] = {}
    for c in claims:
        if not dra.is_gpu(c):
            continue
        ref = dra.resolve(c, uuids, index)
        if ref is None:
            if count_unresolved:
                unknown.report(c.driver, f"{c.pool}/{c.device}")
            continue
        holder = Holder(c.namespace, c.pod, c.container)
        resolved.append((holder, ref.key, bool(ref.mig_uuid), c))
        sharers.setdefault(ref.key, set()).add(holder)
    # Only a shared device's claim decides anything (one holder is exclusive whatever its
    # config says), and an override makes reading it moot.
    read = configs({(c.claim_namespace, c.claim_name) for _, dev, _, c in resolved
                    if len(sharers[dev]) > 1 and c.driver not in overrides})
    rows: list[Unit] = []
    done: set[tuple[Holder, DeviceKey]] = set()
    for holder, dev, is_mig, c in resolved:
        if (holder, dev) in done:
            continue
        done.add((holder, dev))
        if len(sharers[dev]) > 1:
            config = read.get((c.claim_namespace, c.claim_name))
            mode = overrides.get(c.driver) or (
                SharingMode.MPS if config is not None and config.is_mps(
                    SliceKey(c.driver, c.pool, c.device), mig=is_mig)
                else SharingMode.TIME_SLICING)
        else:
            mode = SharingMode.MIG if is_mig else SharingMode.EXCLUSIVE
        rows.append(Unit(holder, dev, c.driver, mode))
    return rows


def amd_units(allocations: Iterable[Allocation], claims: Iterable[ClaimDevice],
              index: AmdDeviceIndex, slices: Mapping[SliceKey, Mapping[str, str]] | None,
              overrides: Overrides, unknown: UnknownIds) -> list[Unit]:
    """AMD: `amd.com/*` device plugin IDs (a GPU or partition 0 by PCI address, a partition by
    `amdgpu_xcp_<n>`, MxGPU VFs by IOMMU group) and `gpu.amd.com` DRA devices. Partitions are
    `mig`-like units priced by their fraction, VFs `vgpu`-like units with their framebuffer
    share as grant; a device several containers hold is time-slicing unless overridden."""
    # (holder, resource, ref, what makes it one unit: the plugin's ID; a DRA device named
    # twice in one container's claims is one unit)
    held: list[tuple[Holder, str, AmdRef, str]] = []
    for a in allocations:
        if not is_amd_resource(a.resource):
            continue
        holder = Holder(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            refs = index.resolve(device_id)
            if not refs:
                unknown.report(a.resource, device_id)
            held.extend((holder, a.resource, r, f"{device_id}/{r.vf}") for r in refs)
    for c in claims:
        if c.driver != AMD_DRA_DRIVER:
            continue
        ref = index.resolve_claim(c, slices)
        if ref is None:
            unknown.report(c.driver, f"{c.pool}/{c.device}")
            continue
        held.append((Holder(c.namespace, c.pod, c.container), c.driver, ref, ""))
    sharers: dict[tuple[str, str], set[Holder]] = {}
    for holder, _, ref, _ in held:
        sharers.setdefault(ref.key, set()).add(holder)
    rows: list[Unit] = []
    done: set[tuple[Holder, tuple[str, str], str]] = set()
    for holder, resource, ref, unit in held:
        if (holder, ref.key, unit) in done:
            continue
        done.add((holder, ref.key, unit))
        if ref.vf:  # the VM's use, which the host sees only per VF
            rows.append(Unit(holder, ref.key, resource, SharingMode.VGPU,
                             Grant(memory_fraction=ref.vf_fraction),
                             InstanceUse(ref.vf_use.utilization, ref.vf_use.memory_used_bytes)
                             if ref.vf_use is not None else None))
            continue
        shared = len(sharers[ref.key]) > 1
        mode = overrides.get(resource) or (SharingMode.TIME_SLICING if shared else ref.mode)
        rows.append(Unit(holder, ref.key, resource, mode))
    return rows


def fractional_units(pods: Iterable[PodInfo], index: DeviceIndex,
                     on_error: Callable[[PodInfo, str], None]) -> list[Unit]:
    """HAMi / gpushare grants of this node's pods as `fractional` units. A pod whose
    annotations could not be read, or whose grant names no GPU of this node, is reported
    through `on_error` (its readable grants on this node's GPUs still count)."""
    rows: list[Unit] = []
    for info in pods:
        try:
            rows.extend(_pod_units(info, index, on_error))
        except Exception as e:  # one tenant's pod never costs another's grant
            on_error(info, f"grant unreadable ({type(e).__name__})")
    return rows


def _pod_units(info: PodInfo, index: DeviceIndex,
               on_error: Callable[[PodInfo, str], None]) -> list[Unit]:
    if info.grants.errors:
        on_error(info, "; ".join(info.grants.errors))
    rows: list[Unit] = []
    for grant in info.grants.grants:
        ref = index.resolve(grant.device)
        if ref is None or ref.slot:
            on_error(info, f"{grant.resource} device {grant.device[:80]!r} is no GPU of this "
                           "node")
            continue
        ctr = grant.container or (info.container_names[0] if info.container_names else "")
        rows.append(Unit(Holder(info.namespace, info.name, ctr), ref.key, grant.resource,
                         SharingMode.FRACTIONAL,
                         Grant(grant.memory_bytes, grant.memory_fraction, grant.core_fraction)))
    return rows


# intel/intel-device-plugins-for-kubernetes cmd/gpu_plugin/gpu_plugin.go (scan, at 94a91bc,
# after v0.36.0): each card under /sys/class/drm is registered `-shared-dev-num` times (1 by
# default) as `<card>-<n>`, under resource `gpu.intel.com/<driver>`; a PF with VFs is skipped
# (its VFs, bound to the host's driver, are cards of their own).
# Its `<driver>_monitoring` / `monitoring` resources (ID `all`) open every GPU to a monitoring
# agent: access, not a unit, so they are ignored.
INTEL_PREFIX = "gpu.intel.com/"
INTEL_RESOURCES = ("gpu.intel.com/i915", "gpu.intel.com/xe")
_INTEL_ID = re.compile(r"^(?P<card>card[0-9]{1,6})-[0-9]{1,6}$")


def intel_card(device_id: str) -> str | None:
    """The card an Intel GPU plugin device ID names (`card0-3` -> `card0`), or None."""
    m = _INTEL_ID.match(device_id.strip())
    return m["card"] if m else None


def intel_shares(allocatable: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Device IDs per card in GetAllocatableResources: the plugin's -shared-dev-num."""
    shares: dict[str, int] = {}
    for resource, device_id in allocatable:
        card = intel_card(device_id) if resource in INTEL_RESOURCES else None
        if card is not None:
            shares[card] = shares.get(card, 0) + 1
    return shares


def intel_replicas(cards: Mapping[str, str], shares: Mapping[str, int],
                   index: DeviceIndex) -> dict[DeviceKey, int]:
    """Shares per GPU that the Intel plugin registers (merge's `allocatable` for them)."""
    out: dict[DeviceKey, int] = {}
    for card, n in shares.items():
        ref = index.resolve(cards[card]) if card in cards else None
        if ref is not None and not ref.mig_uuid:
            out[ref.key] = n
    return out


# (GPU uuid, GT id) -> the tile's partition uuid (intel_subdevice MigRefs)
IntelTiles = Mapping[tuple[str, int], str]


def _tiles_held(allocations: Iterable[Allocation], pods: Mapping[tuple[str, str], PodInfo]
                ) -> dict[Holder, dict[str, tuple[int, ...]]]:
    """Per container holding an Intel card: card -> the GT ids GPU Aware Scheduling gave it
    (inteltiles.py: the n-th entry is the pod's n-th container, in spec order, that holds
    the plugin's resource)."""
    using: dict[tuple[str, str], set[str]] = {}
    for a in allocations:
        if a.resource in INTEL_RESOURCES:
            using.setdefault((a.namespace, a.pod), set()).add(a.container)
    out: dict[Holder, dict[str, tuple[int, ...]]] = {}
    for (ns, pod), containers in using.items():
        info = pods.get((ns, pod))
        if info is None or not info.intel_tiles:
            continue
        ordered = [c for c in info.container_names if c in containers]
        for name, entry in zip(ordered, info.intel_tiles, strict=False):
            cards: dict[str, tuple[int, ...]] = {}
            for card, gt in entry:
                cards[card] = (*cards.get(card, ()), gt)
            out[Holder(ns, pod, name)] = cards
    return out


def intel_plugin_units(allocations: Iterable[Allocation], cards: Mapping[str, str],
                       index: DeviceIndex, shares: Mapping[str, int],
                       virtuals: Mapping[str, VgpuInstance], unknown: UnknownIds,
                       tiles: IntelTiles | None = None,
                       pods: Mapping[tuple[str, str], PodInfo] | None = None) -> list[Unit]:
    """Intel GPU plugin devices. `cards`: card name -> the PCI address of its function (sysfs).
    A card of a GPU is `exclusive`, or `time-slicing` when the plugin shares it
    (`shares` > 1: containers share the GPU, replicas = shares); a card of an SR-IOV VF is a
    `vgpu` unit of its PF with the VF's share. On a multi-tile GPU a container GPU Aware
    Scheduling gave tiles of the card (`pods`' annotation, `tiles` of the inventory) holds
    those tiles instead: a `mig` unit each, priced as its fraction, `time-slicing` on a tile
    several containers hold. Anything else is reported."""
    allocations = list(allocations)
    held = _tiles_held(allocations, pods or {}) if tiles else {}
    rows: list[Unit] = []
    on_tiles: list[tuple[Holder, tuple[str, str], str]] = []
    for a in allocations:
        if a.resource not in INTEL_RESOURCES:
            continue
        holder = Holder(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            card = intel_card(device_id)
            bdf = cards.get(card, "") if card is not None else ""
            ref = index.resolve(bdf) if bdf else None
            vf = virtuals.get(bdf) if bdf else None
            gts = held.get(holder, {}).get(card or "", ())
            parts = [(ref.uuid, tiles[(ref.uuid, gt)]) for gt in gts
                     if ref is not None and tiles and (ref.uuid, gt) in tiles]
            if ref is not None and not ref.mig_uuid and parts:
                on_tiles.extend((holder, part, a.resource) for part in parts)
            elif ref is not None and not ref.mig_uuid:
                mode = SharingMode.TIME_SLICING if shares.get(card or "", 1) > 1 \
                    else SharingMode.EXCLUSIVE
                rows.append(Unit(holder, ref.key, a.resource, mode))
            elif vf is not None:
                rows.append(Unit(holder, (vf.gpu_uuid, ""), a.resource, SharingMode.VGPU,
                                 Grant(memory_fraction=vf.framebuffer_fraction),
                                 InstanceUse(vf.sm_util, vf.memory_used)))
            else:
                unknown.report(a.resource, device_id)
    sharers: dict[tuple[str, str], set[Holder]] = {}
    for holder, part, _ in on_tiles:
        sharers.setdefault(part, set()).add(holder)
    done: set[tuple[Holder, tuple[str, str]]] = set()
    for holder, part, resource in on_tiles:
        if (holder, part) not in done:  # two cards' IDs naming one tile are one unit
            done.add((holder, part))
            rows.append(Unit(holder, part, resource, SharingMode.TIME_SLICING
                             if len(sharers[part]) > 1 else SharingMode.MIG))
    return rows
