"""The attribution collector: GPU allocations and GPU process usage per container.

Per cycle: one PodResources List (which container holds which device), the cgroup of each
NVML process (which pod UID and container ID runs it, cached per pid) and the pod watch's cache
(UID → namespace, name, labels). No API call happens here: the watches and the ResourceClaim
reader run on their own threads (a claim seen for the first time waits for its answer at most
CLAIM_FIRST_WAIT).

Who a process belongs to, best source first:
1. its cgroup's pod UID (or container ID) found in the pod watch: the pod that really runs it,
   even on a device allocated to someone else (a privileged pod that sees every GPU);
2. otherwise the device's holder from PodResources, when exactly one container holds the device
   (exclusive GPUs and MIG instances): this is what still works with the API down;
3. otherwise nobody: counted under empty namespace/pod/container, so the per-device process
   totals stay whole. A pod UID known only from cgroups is not emitted (no label carries it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from exporter.attribution.cgroup import CgroupRef, CgroupResolver
from exporter.attribution.deviceids import (
    DeviceIndex,
    DeviceRef,
    UnknownIds,
    is_gpu_resource,
    sharing_mode,
)
from exporter.attribution.dra import ClaimDevice, DraResolver, SliceKey, slice_uuids
from exporter.attribution.fractional import FractionalGrant
from exporter.attribution.podresources import Allocation, PodResourcesClient
from exporter.attribution.podwatch import PodInfo, PodWatch
from exporter.attribution.resourceclaims import ClaimConfig, ClaimKey, ClaimReader
from exporter.attribution.resourceslices import ResourceSlice, resource_slice_watch
from exporter.attribution.vgpu import VgpuInstance, vgpu_instances
from exporter.core import (
    CycleContext,
    ExporterOptions,
    GpuRef,
    MigRef,
    PodLabels,
    ProcessSample,
    SampleSink,
)
from exporter.kube.client import connector
from exporter.kube.watch import NodeScopedWatch
from gpu_ledger.sharing import SharingMode

log = logging.getLogger(__name__)

DeviceKey = tuple[str, str]  # DeviceRef.key: (uuid, mig_uuid)
# How long a cycle waits for the config of a shared claim it has no answer for yet: long enough
# for a GET to a healthy API server, short enough never to stall sampling.
CLAIM_FIRST_WAIT = 0.25


class Holder(NamedTuple):
    """A container, as PodResources and the pod watch name it."""

    namespace: str
    pod: str
    container: str


class Owner(NamedTuple):
    """Who a GPU process is billed to, with the pod's allow-listed labels."""

    holder: Holder
    labels: PodLabels


_NOBODY = Owner(Holder("", "", ""), ())


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
class VgpuGrant(FractionalGrant):
    """A vGPU instance a container holds: its framebuffer share, and the instance's SM and
    framebuffer use (the only use figures the host has for it)."""

    sm_util: float | None = None
    memory_used: int | None = None


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
        self._index_key: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._replicas_from: tuple[tuple[str, str], ...] | None = None
        self._replicas: dict[DeviceKey, int] = {}
        self.unknown_ids = UnknownIds()
        self._fractional_seen: set[tuple[str, str]] = set()
        self._fractional_errors = 0

    # --- per cycle -----------------------------------------------------------------------------
    def collect(self, ctx: CycleContext, sink: SampleSink) -> int:
        """Returns the NVML calls that failed while listing processes: a partial process list
        means usage may be missing, so attribution does not report success then."""
        index = self._device_index(ctx.gpus, ctx.migs)
        allocations = self._client.poll() or []
        ctx.sources["podresources"] = self._client.status
        # --no-kubernetes turns the source off: it has no gpu_exporter_source_up series at all,
        # so GpuAttributionLost (source_up == 0) does not fire for a choice the operator made.
        if self._watch is not None:
            ctx.sources["kubernetes"] = self._watch.status
        vgpus = vgpu_instances(ctx)
        units, holders, vgpu_grants = self._allocations(allocations, index, vgpus)
        uuids = self._resource_slice_uuids()
        if self._slices is not None:  # off with --no-kubernetes: no series, as for kubernetes
            ctx.sources["resourceslices"] = self._slices.status
        self._claims(self._client.claim_devices, index, uuids, units, holders)
        watch = self._watch
        fractions = self._fractional(watch.pods.values() if watch is not None else (), index,
                                     units, holders)
        fractions.update(vgpu_grants)
        pods = PodDirectory(watch.pods if watch is not None else {},
                            watch.by_name if watch is not None else {},
                            watch.by_container if watch is not None else {}, holders)
        self._emit_allocations(ctx.node, sink, units, self._replica_counts(index), pods)
        gpus = {g.uuid: g for g in ctx.gpus}
        for k, grant in sorted(fractions.items(), key=lambda kv: kv[0]):
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
        usage, per_process = self._usage(ctx.processes, pods)
        self._emit_usage(ctx.node, sink, usage, vgpu_grants)
        for resource in sorted(self.unknown_ids.by_resource):
            sink.add("gpu_exporter_unresolved_device_ids_total", (resource,),
                     self.unknown_ids.by_resource[resource])
        sink.add("gpu_exporter_fractional_errors_total", (), self._fractional_errors)
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
    def _emit_allocations(node: str, sink: SampleSink, units: dict[UnitKey, int],
                          replicas: dict[DeviceKey, int], pods: PodDirectory) -> None:
        handed_out: dict[DeviceKey, int] = {}
        for key, n in units.items():
            dev = (key.uuid, key.mig_uuid)
            handed_out[dev] = handed_out.get(dev, 0) + n
        for key in sorted(units):
            dev = (key.uuid, key.mig_uuid)
            if key.sharing in (SharingMode.EXCLUSIVE, SharingMode.MIG):
                count = 1
            else:  # a share: how many the kubelet can hand out, else how many are handed out
                count = replicas.get(dev) or max(handed_out[dev], 1)
            sink.add("gpu_container_allocation",
                     (node, *key.holder, key.uuid, key.mig_uuid, key.resource, key.sharing,
                      str(count), *pods.owner_of(key.holder.namespace, key.holder.pod)),
                     units[key], pods.labels_of(key.holder.namespace, key.holder.pod))

    def _usage(self, processes: list[ProcessSample], pods: PodDirectory) -> tuple[
            dict[UsageKey, Usage], list[tuple[ProcessSample, Owner]]]:
        """Usage per container and device; every holder gets a row (0 when idle)."""
        usage: dict[UsageKey, Usage] = {}
        for (uuid, mig_uuid), hs in pods.holders.items():
            for h in hs:
                usage[UsageKey(h, uuid, mig_uuid)] = Usage(pods.labels_of(h.namespace, h.pod))
        cgroups = self._cgroups.resolve(p.pid for p in processes)
        per_process: list[tuple[ProcessSample, Owner]] = []
        for proc in processes:
            owner = _owner(proc, cgroups.get(proc.pid), pods)
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
                    vgpus: dict[UsageKey, VgpuGrant] | None = None) -> None:
        ordered = sorted(usage)
        vgpus = vgpus or {}
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
    def _device_index(self, gpus: list[GpuRef], migs: list[MigRef]) -> DeviceIndex:
        key = (tuple(g.uuid for g in gpus), tuple(m.uuid for m in migs))
        if self._index is None or key != self._index_key:
            self._index, self._index_key = DeviceIndex(gpus, migs), key
            self._replicas_from = None  # IDs may resolve differently now
        return self._index

    def _allocations(self, allocations: Iterable[Allocation], index: DeviceIndex,
                     vgpus: dict[str, VgpuInstance]) -> tuple[
            dict[UnitKey, int], dict[DeviceKey, list[Holder]], dict[UsageKey, VgpuGrant]]:
        """Device plugin units per container, the holders of each device, and the vGPU
        instances held (as grants of their framebuffer share)."""
        units: dict[UnitKey, int] = {}
        holders: dict[DeviceKey, list[Holder]] = {}
        grants: dict[UsageKey, VgpuGrant] = {}
        for a in allocations:
            if not is_gpu_resource(a.resource, self._overrides):
                continue
            for device_id in a.device_ids:
                holder = Holder(a.namespace, a.pod, a.container)
                refs = index.resolve_all(device_id)
                vgpu = vgpus.get(device_id.strip().lower()) if not refs else None
                if vgpu is not None:  # a KubeVirt vGPU: its mdev UUID
                    k = UnitKey(holder, vgpu.gpu_uuid, "", a.resource, SharingMode.VGPU)
                    units[k] = units.get(k, 0) + 1
                    grants[UsageKey(holder, vgpu.gpu_uuid, "")] = VgpuGrant(
                        holder.container, device_id, a.resource,
                        memory_fraction=vgpu.framebuffer_fraction, sm_util=vgpu.sm_util,
                        memory_used=vgpu.memory_used)
                    hs = holders.setdefault((vgpu.gpu_uuid, ""), [])
                    if holder not in hs:
                        hs.append(holder)
                    continue
                if not refs:
                    self.unknown_ids.report(a.resource, device_id)
                for ref in refs:
                    mode = sharing_mode(a.resource, ref, self._overrides)
                    k = UnitKey(holder, ref.uuid, ref.mig_uuid, a.resource, mode)
                    units[k] = units.get(k, 0) + 1
                    hs = holders.setdefault(ref.key, [])
                    if holder not in hs:
                        hs.append(holder)
        return units, holders, grants

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

    def _claims(self, claims: Iterable[ClaimDevice], index: DeviceIndex,
                uuids: dict[SliceKey, str] | None,
                units: dict[UnitKey, int], holders: dict[DeviceKey, list[Holder]]) -> None:
        """DRA devices as allocation units. A device whose claim several containers consume
        is one share per container: MPS or time-slicing as the --sharing-mode override for the
        driver says, else as the claim's config says (MPS, else time-slicing)."""
        resolved: list[tuple[Holder, DeviceRef, ClaimDevice]] = []
        sharers: dict[DeviceKey, set[Holder]] = {}
        for c in claims:
            if not self._dra.is_gpu(c):
                continue
            ref = self._dra.resolve(c, uuids, index)
            if ref is None:
                self.unknown_ids.report(c.driver, f"{c.pool}/{c.device}")
                continue
            holder = Holder(c.namespace, c.pod, c.container)
            resolved.append((holder, ref, c))
            sharers.setdefault(ref.key, set()).add(holder)
        # Only a shared device's claim decides anything (one holder is exclusive whatever its
        # config says), and an override makes reading it moot.
        configs = self._claim_configs({
            (c.claim_namespace, c.claim_name) for _, ref, c in resolved
            if len(sharers[ref.key]) > 1 and c.driver not in self._overrides})
        done: set[tuple[Holder, DeviceKey]] = set()
        for holder, ref, c in resolved:
            if (holder, ref.key) in done:  # the same device twice in one container's claims
                continue
            done.add((holder, ref.key))
            if len(sharers[ref.key]) > 1:
                config = configs.get((c.claim_namespace, c.claim_name))
                mode = self._overrides.get(c.driver) or (
                    SharingMode.MPS if config is not None and config.is_mps(
                        SliceKey(c.driver, c.pool, c.device), mig=bool(ref.mig_uuid))
                    else SharingMode.TIME_SLICING)
            else:
                mode = SharingMode.MIG if ref.mig_uuid else SharingMode.EXCLUSIVE
            k = UnitKey(holder, ref.uuid, ref.mig_uuid, c.driver, mode)
            units[k] = units.get(k, 0) + 1
            hs = holders.setdefault(ref.key, [])
            if holder not in hs:
                hs.append(holder)

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

    def _fractional_error(self, uid: str, pod: str, message: str) -> None:
        """Counted and logged once per pod and message: the annotation does not change."""
        if (uid, message) not in self._fractional_seen:
            self._fractional_seen.add((uid, message))
            self._fractional_errors += 1
            log.warning("fractional GPU grant of pod %s: %s; not attributed", pod, message)

    def _fractional(self, pods: Iterable[PodInfo], index: DeviceIndex,
                    units: dict[UnitKey, int], holders: dict[DeviceKey, list[Holder]]
                    ) -> dict[UsageKey, FractionalGrant]:
        """HAMi / gpushare grants of this node's pods as `fractional` allocation units; the
        granted fractions by (namespace, pod, container, uuid, mig_uuid)."""
        out: dict[UsageKey, FractionalGrant] = {}
        for info in pods:
            where = f"{info.namespace}/{info.name}"
            for message in info.grants.errors:
                self._fractional_error(info.uid, where, message)
            for grant in info.grants.grants:
                ref = index.resolve(grant.device)
                if ref is None:
                    self._fractional_error(info.uid, where, f"{grant.resource} device "
                                           f"{grant.device!r} is no GPU of this node")
                    continue
                ctr = grant.container or (info.container_names[0]
                                          if info.container_names else "")
                holder = Holder(info.namespace, info.name, ctr)
                k = UnitKey(holder, ref.uuid, ref.mig_uuid, grant.resource, SharingMode.FRACTIONAL)
                units[k] = units.get(k, 0) + 1
                out[UsageKey(holder, ref.uuid, ref.mig_uuid)] = grant
                hs = holders.setdefault(ref.key, [])
                if holder not in hs:
                    hs.append(holder)
        return out

    @staticmethod
    def _memory_total(ctx: CycleContext, gpu: GpuRef | None) -> int | None:
        """The GPU's framebuffer, for HAMi grants given in MiB; None when NVML cannot say."""
        if gpu is None or ctx.nvml is None:
            return None
        try:
            return int(ctx.nvml.nvmlDeviceGetMemoryInfo(gpu.handle).total) or None
        except Exception:
            return None

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
