"""The attribution collector: GPU allocations and GPU process usage per container.

Per cycle: one PodResources List (which container holds which device), the cgroup of each
NVML process (which pod UID and container ID runs it, cached per pid) and the pod watch's cache
(UID → namespace, name, labels). No API call happens here: the watches and the ResourceClaim
reader run on their own threads (a claim seen for the first time waits for its answer at most
CLAIM_FIRST_WAIT). Allocations come from the sources (sources.py: device plugin, DRA,
fractional grants, vGPU), each turning its inputs into `Unit` rows, merged once
(units.merge) into the allocation, grant and usage series.

Who a process belongs to, best source first:
1. its cgroup's pod UID (or container ID) found in the pod watch: the pod that really runs it,
   even on a device allocated to someone else (a privileged pod that sees every GPU);
2. otherwise the device's holder from PodResources, when exactly one container holds the device
   (exclusive GPUs and MIG instances): this is what still works with the API down;
3. otherwise nobody: counted under empty namespace/pod/container, so the per-device process
   totals stay whole. A pod UID known only from cgroups is not emitted (no label carries it).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from exporter.attribution.amdids import (
    AmdDeviceIndex,
    AmdSysfs,
    amd_slice_attributes,
    read_amd_sysfs,
)
from exporter.attribution.cgroup import CgroupRef, CgroupResolver
from exporter.attribution.deviceids import DeviceIndex, UnknownIds, is_gpu_resource
from exporter.attribution.dra import DraResolver, SliceKey, slice_uuids
from exporter.attribution.podresources import Allocation, PodResourcesClient
from exporter.attribution.podwatch import PodInfo, PodWatch
from exporter.attribution.resourceclaims import ClaimConfig, ClaimKey, ClaimReader
from exporter.attribution.resourceslices import ResourceSlice, resource_slice_watch
from exporter.attribution.sources import (
    INTEL_RESOURCES,
    amd_units,
    device_plugin_units,
    dra_units,
    fractional_units,
    intel_plugin_units,
    intel_replicas,
    intel_shares,
    vgpu_units,
)
from exporter.attribution.units import (
    DeviceKey,
    Holder,
    InstanceUse,
    Merged,
    Unit,
    UsageKey,
    merge,
)
from exporter.attribution.vgpu import vgpu_instances
from exporter.core import (
    CycleContext,
    ExporterOptions,
    GpuRef,
    GpuStatic,
    MigRef,
    PodLabels,
    ProcessSample,
    SampleSink,
)
from exporter.device.contract import DeviceLost, Inventory, Tally
from exporter.device.intel_sysfs import intel_cards
from exporter.kube.client import connector
from exporter.kube.watch import NodeScopedWatch

log = logging.getLogger(__name__)

# How long a cycle waits for the config of a shared claim it has no answer for yet: long enough
# for a GET to a healthy API server, short enough never to stall sampling.
CLAIM_FIRST_WAIT = 0.25
# How long the cycles after a start wait, in all, for the first ResourceSlice list when they
# hold DRA devices: a healthy API server lists them well within it. Until that list, a DRA
# device that does not resolve is not counted as unresolved (it may be in a slice not read yet).
SLICE_FIRST_WAIT = 2.0


class Owner(NamedTuple):
    """Who a GPU process is billed to, with the pod's allow-listed labels."""

    holder: Holder
    labels: PodLabels


_NOBODY = Owner(Holder("", "", ""), ())


@dataclass
class Usage:
    labels: PodLabels
    memory_bytes: float = 0.0
    sm_util: float = 0.0  # summed over the processes that have a figure
    processes: int = 0
    processes_with_sm: int = 0


@dataclass(frozen=True)
class PodDirectory:
    """What this cycle knows about pods: the pod watch's caches and the device holders."""

    by_uid: dict[str, PodInfo]
    by_name: dict[tuple[str, str], PodInfo]
    by_container: dict[str, PodInfo]
    holders: dict[DeviceKey, list[Holder]]

    def labels_of(self, namespace: str, pod: str) -> PodLabels:
        info = self.by_name.get((namespace, pod))
        return info.labels if info is not None else ()

    def owner_of(self, namespace: str, pod: str) -> tuple[str, str]:
        """(owner_kind, owner_name) of the pod's controller; empty when unknown."""
        info = self.by_name.get((namespace, pod))
        return info.owner if info is not None else ("", "")


class AttributionCollector:
    name = "attribution"
    needs_nvml = False  # allocations are reported even while NVML is down
    reads_processes = True

    def __init__(self, options: ExporterOptions, *, pod_watch: PodWatch | None = None,
                 claim_reader: ClaimReader | None = None) -> None:
        self.options = options
        self._overrides = dict(options.sharing_modes)
        self._client = PodResourcesClient(options.pod_resources_socket, options.rpc_timeout)
        self._cgroups = CgroupResolver(options.proc_root)
        self._watch: PodWatch | None = None
        self._slices: NodeScopedWatch[ResourceSlice] | None = None
        self._claim_reader: ClaimReader | None = None
        if options.kubernetes:
            self._watch = pod_watch if pod_watch is not None else PodWatch(options)
            if not self._watch.started:
                self._watch.start()
            self._slices = resource_slice_watch(options).start()
            self._claim_reader = claim_reader if claim_reader is not None else ClaimReader(
                connector(options.kubeconfig, 5.0))
        self._claims_unreadable = 0
        self._dra = DraResolver()
        self._slice_items: object = None
        self._slice_uuids: dict[SliceKey, str] = {}
        self._index: DeviceIndex | None = None
        self._index_key: tuple[tuple[tuple[str, str], ...], tuple[str, ...]] = ((), ())
        self._replicas_from: tuple[tuple[str, str], ...] | None = None
        self._replicas: dict[DeviceKey, int] = {}
        self.unknown_ids = UnknownIds()
        self._pod_errors_seen: set[str] = set()  # pod UIDs whose bad grant was reported
        self._pod_errors = 0
        self._slice_wait_left = SLICE_FIRST_WAIT
        self._sources_failed: set[str] = set()

    # --- per cycle -----------------------------------------------------------------------------
    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        """Returns the NVML calls that failed while listing processes: a partial process list
        means usage may be missing, so attribution does not report success then."""
        index = self._device_index(ctx.gpus, ctx.migs, ctx.static)
        allocations = self._client.poll() or []
        ctx.sources["podresources"] = self._client.status
        # --no-kubernetes turns the source off: it has no gpu_exporter_source_up series at all,
        # so GpuAttributionLost (source_up == 0) does not fire for a choice the operator made.
        if self._watch is not None:
            ctx.sources["kubernetes"] = self._watch.status
        vgpus = vgpu_instances(ctx)
        cards = self._intel_cards(allocations)
        shares = intel_shares(self._client.allocatable)
        claims = self._client.claim_devices
        slices_listed = self._await_slices(any(self._dra.is_gpu(c) for c in claims))
        uuids = self._resource_slice_uuids()
        if self._slices is not None:  # off with --no-kubernetes: no series, as for kubernetes
            ctx.sources["resourceslices"] = self._slices.status
        watch = self._watch
        pod_infos = watch.pods if watch is not None else {}
        rows: list[Unit] = [
            *self._source("device plugin", lambda: device_plugin_units(
                allocations, index, self._overrides, self.unknown_ids, vgpus)),
            *self._source("dra", lambda: dra_units(
                claims, self._dra, uuids, index, self._overrides, self._claim_configs,
                self.unknown_ids, count_unresolved=slices_listed)),
            *self._source("fractional", lambda: fractional_units(
                pod_infos.values(), index, self._pod_error)),
            *self._source("vgpu", lambda: vgpu_units(allocations, index, vgpus,
                                                     self._overrides)),
            *self._source("amd", lambda: amd_units(
                allocations, claims, self._amd_index(ctx), self._amd_slices(),
                self._overrides, self.unknown_ids)),
            *self._source("intel", lambda: intel_plugin_units(
                allocations, cards, index, shares, vgpus, self.unknown_ids,
                {(m.parent.uuid, m.compute_instance_id): m.uuid for m in ctx.migs
                 if m.kind == "intel_subdevice"},
                watch.by_name if watch is not None else {})),
        ]
        self._pod_errors_seen &= pod_infos.keys()  # forget pods that are gone
        merged = merge(rows, {**self._replica_counts(index),
                              **intel_replicas(cards, shares, index)})
        pods = PodDirectory(pod_infos, watch.by_name if watch is not None else {},
                            watch.by_container if watch is not None else {}, merged.holders)
        self._emit_allocations(ctx.node, sink, merged, pods)
        self._emit_grants(ctx, sink, merged, pods)
        # xe/i915 fdinfo engine shares are of the device's engines (capacity counts every
        # tile's); amdgpu's are of the one ring a context runs on, its partition's already
        usage, per_process = self._usage(ctx.processes, pods, {
            m.uuid: m.parent_slices / m.slices for m in ctx.migs
            if m.kind == "intel_subdevice" and m.slices > 0})
        self._emit_usage(ctx.node, sink, usage, merged.uses)
        for resource in sorted(self.unknown_ids.by_resource):
            sink.add("gpu_exporter_unresolved_device_ids_total", (resource,),
                     self.unknown_ids.by_resource[resource])
        sink.add("gpu_exporter_fractional_errors_total", (), self._pod_errors)
        sink.add("gpu_exporter_dra_fallback", (), 0.0 if uuids is not None else 1.0)
        if self._claim_reader is not None:  # with --no-kubernetes no claim is read: no series
            sink.add("gpu_exporter_dra_claims_unreadable", (), self._claims_unreadable)
        for proc, owner in per_process:
            labels = (ctx.node, str(proc.pid), proc.uuid, proc.mig_uuid, *owner.holder)
            sink.add("gpu_process_memory_used_bytes", labels, proc.memory_bytes)
            if proc.sm_util is not None:
                sink.add("gpu_process_sm_utilization_ratio", labels, proc.sm_util)
        return ctx.process_failures

    @staticmethod
    def _emit_allocations(node: str, sink: SampleSink, merged: Merged,
                          pods: PodDirectory) -> None:
        for key in sorted(merged.units):
            sink.add("gpu_container_allocation",
                     (node, *key.holder, key.uuid, key.mig_uuid, key.resource, key.sharing,
                      str(merged.replicas[key]),
                      *pods.owner_of(key.holder.namespace, key.holder.pod)),
                     merged.units[key], pods.labels_of(key.holder.namespace, key.holder.pod))

    def _emit_grants(self, ctx: CycleContext, sink: SampleSink, merged: Merged,
                     pods: PodDirectory) -> None:
        """The memory and core fractions granted (fractional schedulers, vGPU types)."""
        gpus = {g.uuid: g for g in ctx.gpus}
        for k, grant in sorted(merged.grants.items(), key=lambda kv: kv[0]):
            mem = grant.memory_fraction
            if mem is None and grant.memory_bytes is not None:
                total = self._memory_total(ctx, gpus.get(k.uuid))
                mem = min(grant.memory_bytes / total, 1.0) if total else None
            plabels = pods.labels_of(k.holder.namespace, k.holder.pod)
            if mem is not None:
                sink.add("gpu_container_memory_fraction", k.labels(ctx.node), mem, plabels)
            if grant.core_fraction is not None:
                sink.add("gpu_container_core_fraction", k.labels(ctx.node), grant.core_fraction,
                         plabels)

    def _usage(self, processes: list[ProcessSample], pods: PodDirectory,
               scale: dict[str, float]) -> tuple[
            dict[UsageKey, Usage], list[tuple[ProcessSample, Owner]]]:
        """Usage per container and device; every holder gets a row (0 when idle). A process
        the backend could not place in a partition (DRM fdinfo names the device only: Intel
        tiles, AMD partitions without amdsmi's process list) counts on the partition its
        container holds when it holds exactly one of that device, its SM share rescaled from
        the device to the partition where the share is of the device's engines (`scale`:
        partition uuid -> parent slices / slices; absent: 1)."""
        usage: dict[UsageKey, Usage] = {}
        parts: dict[tuple[Holder, str], list[str]] = {}
        for (uuid, mig_uuid), hs in pods.holders.items():
            for h in hs:
                usage[UsageKey(h, uuid, mig_uuid)] = Usage(pods.labels_of(h.namespace, h.pod))
                if mig_uuid:
                    parts.setdefault((h, uuid), []).append(mig_uuid)
        cgroups = self._cgroups.resolve(p.pid for p in processes)
        per_process: list[tuple[ProcessSample, Owner]] = []
        for proc in processes:
            owner = _owner(proc, cgroups.get(proc.pid), pods)
            held = parts.get((owner.holder, proc.uuid), []) if not proc.mig_uuid else []
            if len(held) == 1 and UsageKey(owner.holder, proc.uuid, "") not in usage:
                f = scale.get(held[0], 1.0)
                proc = replace(proc, mig_uuid=held[0], sm_util=None if proc.sm_util is None
                               else min(1.0, proc.sm_util * f))
            k = UsageKey(owner.holder, proc.uuid, proc.mig_uuid)
            u = usage.get(k)
            if u is None:
                u = usage[k] = Usage(owner.labels)
            u.memory_bytes += proc.memory_bytes
            u.processes += 1
            if proc.sm_util is not None:
                u.sm_util += proc.sm_util
                u.processes_with_sm += 1
            if self.options.process_metrics:
                per_process.append((proc, owner))
        return usage, per_process

    @staticmethod
    def _emit_usage(node: str, sink: SampleSink, usage: dict[UsageKey, Usage],
                    vgpus: dict[UsageKey, InstanceUse]) -> None:
        ordered = sorted(usage)
        for k in ordered:
            u, vgpu = usage[k], vgpus.get(k)
            memory = u.memory_bytes
            if vgpu is not None and u.processes == 0 and vgpu.memory_used is not None:
                memory = vgpu.memory_used  # the VM's framebuffer use, as for its SM figure
            sink.add("gpu_container_memory_used_bytes", k.labels(node), memory, u.labels)
        for k in ordered:
            u = usage[k]
            vgpu = vgpus.get(k)
            if vgpu is not None and u.processes == 0:
                # The VM's processes are out of the host NVML's sight: its vGPU instance's
                # SM figure is the holder's; without a sample it is unknown, not 0.
                if vgpu.sm_util is not None:
                    sink.add("gpu_container_sm_utilization_ratio", k.labels(node),
                             vgpu.sm_util, u.labels)
                continue
            # SM figures exist per process only outside MIG; an idle holder of a whole GPU
            # uses 0 of it, while an idle MIG holder's figure is unknown, not 0.
            if u.processes_with_sm or (u.processes == 0 and not k.mig_uuid):
                sink.add("gpu_container_sm_utilization_ratio", k.labels(node), u.sm_util,
                         u.labels)
        for k in ordered:
            sink.add("gpu_container_processes", k.labels(node), usage[k].processes,
                     usage[k].labels)

    @property
    def pod_watch(self) -> PodWatch | None:
        """The pod watch (None with --no-kubernetes), for callers that wait on its first list."""
        return self._watch

    @property
    def slice_watch(self) -> NodeScopedWatch[ResourceSlice] | None:
        """The ResourceSlice watch (None with --no-kubernetes), for callers that wait on its
        first list."""
        return self._slices

    @property
    def claim_reader(self) -> ClaimReader | None:
        """The ResourceClaim reader (None with --no-kubernetes), for callers that wait until
        the claims it was asked for are answered."""
        return self._claim_reader

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._slices is not None:
            self._slices.close()
        if self._claim_reader is not None:
            self._claim_reader.close()
        self._client.close()

    # --- helpers -------------------------------------------------------------------------------
    def _device_index(self, gpus: list[GpuRef], migs: list[MigRef],
                      static: dict[str, GpuStatic]) -> DeviceIndex:
        key = (tuple((g.uuid, s.pci_bdf if (s := static.get(g.uuid)) else "") for g in gpus),
               tuple(m.uuid for m in migs))
        if self._index is None or key != self._index_key:
            self._index, self._index_key = DeviceIndex(gpus, migs, static), key
            self._replicas_from = None  # IDs may resolve differently now
        return self._index

    def _amd_index(self, ctx: CycleContext) -> AmdDeviceIndex:
        """AMD IDs against this cycle's AMD GPUs, partitions and (MxGPU host) VFs; sysfs says
        which `amdgpu_xcp_<n>` and IOMMU group is which (docs/attribution.md, "AMD")."""
        amd = [g for g in ctx.gpus if ctx.static.get(g.uuid, GpuStatic()).vendor == "amd"]
        if not amd or ctx.backend is None:
            return AmdDeviceIndex(Inventory(), AmdSysfs())
        vfs = {}
        for g in amd:
            if ctx.static[g.uuid].virtualization_mode == "host" and g.uuid not in ctx.lost:
                with contextlib.suppress(DeviceLost):  # its VMs' IDs go unresolved this cycle
                    vfs[g.uuid] = ctx.backend.virtual_functions(g, Tally())
        inv = Inventory(gpus=tuple(amd), migs=tuple(m for m in ctx.migs if m.parent in amd),
                        static=ctx.static)
        return AmdDeviceIndex(inv, read_amd_sysfs(ctx.options.sysfs_root), vfs)

    def _amd_slices(self) -> dict[SliceKey, dict[str, str]] | None:
        w = self._slices
        return amd_slice_attributes(w.items.values()) if w is not None and w.status.up \
            else None

    def _resource_slice_uuids(self) -> dict[SliceKey, str] | None:
        """Device name → UUID from this node's ResourceSlices; None while they cannot be read
        (the `gpu-<n>` fallback then applies). Rebuilt only when the watch publishes."""
        w = self._slices
        if w is None or not w.status.up:
            return None
        items = w.items
        if items is not self._slice_items:
            self._slice_uuids, self._slice_items = slice_uuids(items.values()), items
        return self._slice_uuids

    def _claim_configs(self, keys: set[ClaimKey]) -> dict[ClaimKey, ClaimConfig]:
        """The configs of these claims the reader has; the rest are counted as unreadable."""
        reader = self._claim_reader
        if reader is None:
            return {}
        reader.want(keys)
        if reader.pending:
            reader.wait(keys, CLAIM_FIRST_WAIT)
        entries = reader.entries
        configs = {k: e.config for k in keys
                   if (e := entries.get(k)) is not None and e.config is not None}
        self._claims_unreadable = len(keys) - len(configs)
        return configs

    def _source(self, name: str, rows: Callable[[], list[Unit]]) -> list[Unit]:
        """One source's rows. Sources never raise by design; should one, its rows are lost
        for the cycle (logged once per source), not the other sources' nor the cycle."""
        try:
            return rows()
        except Exception:
            if name not in self._sources_failed:
                self._sources_failed.add(name)
                log.exception("attribution source %s failed; its allocations are skipped", name)
            return []

    def _pod_error(self, info: PodInfo, message: str) -> None:
        """A pod's unreadable or unplaceable grant: counted and logged once per pod, however
        many groups or cycles repeat it (the annotation does not change)."""
        if info.uid not in self._pod_errors_seen:
            self._pod_errors_seen.add(info.uid)
            self._pod_errors += 1
            log.warning("fractional GPU grant of pod %s/%s: %s; not attributed",
                        info.namespace, info.name, message[:300])

    def _await_slices(self, needed: bool) -> bool:
        """Whether this node's ResourceSlices have been listed (or cannot be: no watch, or its
        first try failed), so an unresolved DRA device is a fact worth counting. Before the
        first list, a cycle that holds DRA devices waits for it, SLICE_FIRST_WAIT in all."""
        w = self._slices
        if w is None or w.lists or w.status.reason != "starting":
            return True
        deadline = time.monotonic() + (self._slice_wait_left if needed else 0.0)
        while not w.lists and w.status.reason == "starting" and time.monotonic() < deadline:
            time.sleep(0.02)
        self._slice_wait_left = max(0.0, deadline - time.monotonic()) if needed \
            else self._slice_wait_left
        return bool(w.lists) or w.status.reason != "starting"

    @staticmethod
    def _memory_total(ctx: CycleContext, gpu: GpuRef | None) -> int | None:
        """The GPU's memory, for HAMi grants given in MiB; None when its backend cannot say."""
        static = ctx.static.get(gpu.uuid) if gpu is not None else None
        return (static.memory_bytes or None) if static is not None else None

    def _intel_cards(self, allocations: list[Allocation]) -> dict[str, str]:
        """Card name -> PCI address, read from sysfs only when a pod holds an Intel card."""
        if not any(a.resource in INTEL_RESOURCES for a in allocations):
            return {}
        return {c.card: c.bdf for c in intel_cards(self.options.sysfs_root) or []}

    def _replica_counts(self, index: DeviceIndex) -> dict[DeviceKey, int]:
        """IDs per device in GetAllocatableResources, recounted only when that answer changes."""
        allocatable = self._client.allocatable
        if allocatable is not self._replicas_from:
            counts: dict[DeviceKey, int] = {}
            for resource, device_id in allocatable:
                if not is_gpu_resource(resource, self._overrides):
                    continue
                # the counter exists at 0 for every GPU resource, so increase() sees the first
                self.unknown_ids.by_resource.setdefault(resource, 0)
                for ref in index.resolve_all(device_id):
                    if not ref.slot:  # HAMi's slots are not shares (units.merge)
                        counts[ref.key] = counts.get(ref.key, 0) + 1
            self._replicas, self._replicas_from = counts, allocatable
        return self._replicas


def _owner(proc: ProcessSample, ref: CgroupRef | None, pods: PodDirectory) -> Owner:
    """Who runs `proc`, best source first (see the module docstring)."""
    info: PodInfo | None = None
    if ref is not None:
        info = pods.by_uid.get(ref.pod_uid) if ref.pod_uid else None
        if info is None and ref.container_id:
            info = pods.by_container.get(ref.container_id)
    device_holders = pods.holders.get((proc.uuid, proc.mig_uuid), [])
    if info is not None:
        ctr = info.containers.get(ref.container_id, "") if ref is not None else ""
        if not ctr:  # status not updated yet (fresh restart): infer from what we know
            mine = [h.container for h in device_holders
                    if h.namespace == info.namespace and h.pod == info.name]
            if len(mine) == 1:
                ctr = mine[0]
            elif len(info.container_names) == 1:
                ctr = info.container_names[0]
        return Owner(Holder(info.namespace, info.name, ctr), info.labels)
    if len(device_holders) == 1:
        h = device_holders[0]
        return Owner(h, pods.labels_of(h.namespace, h.pod))
    return _NOBODY
