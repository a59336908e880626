"""The attribution collector: GPU allocations and GPU process usage per container.

Per cycle: one PodResources List (which container holds which device), the cgroup of each
NVML process (which pod UID and container ID runs it, cached per pid) and the pod watch's cache
(UID → namespace, name, labels). No API call happens here; the watch runs on its own thread.

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
from typing import Any

from exporter.attribution.cgroup import CgroupRef, CgroupResolver
from exporter.attribution.deviceids import (
    EXCLUSIVE,
    FRACTIONAL,
    MIG,
    TIME_SLICING,
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
from exporter.attribution.resourceslices import ResourceSlice, resource_slice_watch
from exporter.core import (
    CycleContext,
    ExporterOptions,
    GpuRef,
    MigRef,
    PodLabels,
    SampleSink,
    SourceStatus,
)
from exporter.kube.watch import NodeScopedWatch

log = logging.getLogger(__name__)

DeviceKey = tuple[str, str]  # (uuid, mig_uuid)
Holder = tuple[str, str, str]  # (namespace, pod, container)
Owner = tuple[str, str, str, PodLabels]
_NOBODY: Owner = ("", "", "", ())


class AttributionCollector:
    name = "attribution"

    def __init__(self, options: ExporterOptions, nvml: Any = None, *,
                 pod_watch: PodWatch | None = None) -> None:
        self.options = options
        self._overrides = dict(options.sharing_modes)
        self._client = PodResourcesClient(options.pod_resources_socket, options.rpc_timeout)
        self._cgroups = CgroupResolver(options.proc_root)
        self._watch: PodWatch | None = None
        self._slices: NodeScopedWatch[ResourceSlice] | None = None
        if options.kubernetes:
            self._watch = pod_watch if pod_watch is not None else PodWatch(options)
            if not self._watch.started:
                self._watch.start()
            self._slices = resource_slice_watch(options).start()
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
    def collect(self, ctx: CycleContext, sink: SampleSink) -> None:
        index = self._device_index(ctx.gpus, ctx.migs)
        allocations = self._client.poll() or []
        ctx.sources["podresources"] = self._client.status
        ctx.sources["kubernetes"] = (self._watch.status if self._watch is not None
                                     else SourceStatus(False, "disabled"))
        watch = self._watch
        pods = watch.pods if watch is not None else {}
        by_name = watch.by_name if watch is not None else {}
        by_container = watch.by_container if watch is not None else {}

        units, holders = self._allocations(allocations, index)
        uuids = self._resource_slice_uuids()
        ctx.sources["resourceslices"] = (self._slices.status if self._slices is not None
                                         else SourceStatus(False, "disabled"))
        self._claims(self._client.claim_devices, index, uuids, units, holders)
        fractions = self._fractional(pods.values(), index, units, holders)
        replicas = self._replica_counts(index)
        node = ctx.node

        def labels_of(ns: str, pod: str) -> PodLabels:
            info = by_name.get((ns, pod))
            return info.labels if info is not None else ()

        def owner_of(ns: str, pod: str) -> tuple[str, str]:
            info = by_name.get((ns, pod))
            return info.owner if info is not None else ("", "")

        # gpu_container_allocation
        seen_ids: dict[DeviceKey, int] = {}
        for (_, _, _, uuid, mig, _, _), n in units.items():
            seen_ids[(uuid, mig)] = seen_ids.get((uuid, mig), 0) + n
        for key in sorted(units):
            ns, pod, ctr, uuid, mig, resource, mode = key
            if mode in (EXCLUSIVE, MIG):
                count = 1
            else:  # a share: how many the kubelet can hand out, else how many are handed out
                count = replicas.get((uuid, mig)) or max(seen_ids[(uuid, mig)], 1)
            sink.add("gpu_container_allocation",
                     (node, ns, pod, ctr, uuid, mig, resource, mode, str(count),
                      *owner_of(ns, pod)),
                     units[key], labels_of(ns, pod))

        memory_total = {g.uuid: g for g in ctx.gpus}
        for k, grant in sorted(fractions.items(), key=lambda kv: kv[0]):
            mem = grant.memory_fraction
            if mem is None and grant.memory_bytes is not None:
                total = self._memory_total(ctx, memory_total.get(k[3]))
                mem = min(grant.memory_bytes / total, 1.0) if total else None
            if mem is not None:
                sink.add("gpu_container_memory_fraction", (node, *k), mem,
                         labels_of(k[0], k[1]))
            if grant.core_fraction is not None:
                sink.add("gpu_container_core_fraction", (node, *k), grant.core_fraction,
                         labels_of(k[0], k[1]))

        # usage per container and device: [memory, sm sum, processes, processes with sm]
        usage: dict[tuple[str, str, str, str, str], list[float]] = {}
        owners: dict[tuple[str, str, str, str, str], PodLabels] = {}
        for dev, hs in holders.items():
            for ns, pod, ctr in hs:
                k = (ns, pod, ctr, dev[0], dev[1])
                usage[k] = [0.0, 0.0, 0, 0]
                owners[k] = labels_of(ns, pod)
        cgroups = self._cgroups.resolve(p.pid for p in ctx.processes)
        per_process: list[tuple[Any, Owner]] = []
        for proc in ctx.processes:
            owner = self._owner(proc.uuid, proc.mig_uuid, cgroups.get(proc.pid), pods,
                                by_container, holders, labels_of)
            k = (owner[0], owner[1], owner[2], proc.uuid, proc.mig_uuid)
            u = usage.get(k)
            if u is None:
                u = usage[k] = [0.0, 0.0, 0, 0]
                owners[k] = owner[3]
            u[0] += proc.memory_bytes
            u[2] += 1
            if proc.sm_util is not None:
                u[1] += proc.sm_util
                u[3] += 1
            if self.options.process_metrics:
                per_process.append((proc, owner))

        ordered = sorted(usage)
        for k in ordered:
            sink.add("gpu_container_memory_used_bytes", (node, *k), usage[k][0], owners[k])
        for k in ordered:
            _, sm, nproc, nsm = usage[k]
            # SM figures exist per process only outside MIG; an idle holder of a whole GPU
            # uses 0 of it, while an idle MIG holder's figure is unknown, not 0.
            if nsm or (nproc == 0 and not k[4]):
                sink.add("gpu_container_sm_utilization_ratio", (node, *k), sm, owners[k])
        for k in ordered:
            sink.add("gpu_container_processes", (node, *k), usage[k][2], owners[k])

        for resource in sorted(self.unknown_ids.by_resource):
            sink.add("gpu_exporter_unresolved_device_ids_total", (resource,),
                     self.unknown_ids.by_resource[resource])

        sink.add("gpu_exporter_fractional_errors_total", (), self._fractional_errors)
        sink.add("gpu_exporter_dra_fallback", (), 0.0 if uuids is not None else 1.0)

        for proc, (ns, pod, ctr, _) in per_process:
            labels = (node, str(proc.pid), proc.uuid, proc.mig_uuid, ns, pod, ctr)
            sink.add("gpu_process_memory_used_bytes", labels, proc.memory_bytes)
            if proc.sm_util is not None:
                sink.add("gpu_process_sm_utilization_ratio", labels, proc.sm_util)

    @property
    def pod_watch(self) -> PodWatch | None:
        """The pod watch (None with --no-kubernetes), for callers that wait on its first list."""
        return self._watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._slices is not None:
            self._slices.close()
        self._client.close()

    # --- helpers -------------------------------------------------------------------------------
    def _device_index(self, gpus: list[GpuRef], migs: list[MigRef]) -> DeviceIndex:
        key = (tuple(g.uuid for g in gpus), tuple(m.uuid for m in migs))
        if self._index is None or key != self._index_key:
            self._index, self._index_key = DeviceIndex(gpus, migs), key
            self._replicas_from = None  # IDs may resolve differently now
        return self._index

    def _allocations(self, allocations: Iterable[Allocation], index: DeviceIndex) -> tuple[
            dict[tuple[str, str, str, str, str, str, str], int], dict[DeviceKey, list[Holder]]]:
        units: dict[tuple[str, str, str, str, str, str, str], int] = {}
        holders: dict[DeviceKey, list[Holder]] = {}
        for a in allocations:
            if not is_gpu_resource(a.resource, self._overrides):
                continue
            for device_id in a.device_ids:
                refs = index.resolve_all(device_id)
                if not refs:
                    self.unknown_ids.report(a.resource, device_id)
                for ref in refs:
                    mode = sharing_mode(a.resource, ref, self._overrides)
                    k = (a.namespace, a.pod, a.container, ref.uuid, ref.mig_uuid, a.resource,
                         mode)
                    units[k] = units.get(k, 0) + 1
                    hs = holders.setdefault(ref.key, [])
                    holder = (a.namespace, a.pod, a.container)
                    if holder not in hs:
                        hs.append(holder)
        return units, holders

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
                units: dict[tuple[str, str, str, str, str, str, str], int],
                holders: dict[DeviceKey, list[Holder]]) -> None:
        """DRA devices as allocation units. A device whose claim several containers consume
        is one share per container, split like time-slicing (or as the driver's
        --sharing-mode override says, e.g. gpu.nvidia.com=mps)."""
        resolved: list[tuple[Holder, DeviceRef, str]] = []
        sharers: dict[DeviceKey, set[Holder]] = {}
        for c in claims:
            if not self._dra.is_gpu(c):
                continue
            ref = self._dra.resolve(c, uuids, index)
            if ref is None:
                self.unknown_ids.report(c.driver, f"{c.pool}/{c.device}")
                continue
            holder = (c.namespace, c.pod, c.container)
            resolved.append((holder, ref, c.driver))
            sharers.setdefault(ref.key, set()).add(holder)
        done: set[tuple[Holder, DeviceKey]] = set()
        for holder, ref, driver in resolved:
            if (holder, ref.key) in done:  # the same device twice in one container's claims
                continue
            done.add((holder, ref.key))
            if len(sharers[ref.key]) > 1:
                mode = self._overrides.get(driver) or TIME_SLICING
            else:
                mode = MIG if ref.mig_uuid else EXCLUSIVE
            k = (*holder, ref.uuid, ref.mig_uuid, driver, mode)
            units[k] = units.get(k, 0) + 1
            hs = holders.setdefault(ref.key, [])
            if holder not in hs:
                hs.append(holder)

    def _fractional_error(self, uid: str, pod: str, message: str) -> None:
        """Counted and logged once per pod and message: the annotation does not change."""
        if (uid, message) not in self._fractional_seen:
            self._fractional_seen.add((uid, message))
            self._fractional_errors += 1
            log.warning("fractional GPU grant of pod %s: %s; not attributed", pod, message)

    def _fractional(self, pods: Iterable[PodInfo], index: DeviceIndex,
                    units: dict[tuple[str, str, str, str, str, str, str], int],
                    holders: dict[DeviceKey, list[Holder]]
                    ) -> dict[tuple[str, str, str, str, str], FractionalGrant]:
        """HAMi / gpushare grants of this node's pods as `fractional` allocation units; the
        granted fractions by (namespace, pod, container, uuid, mig_uuid)."""
        out: dict[tuple[str, str, str, str, str], FractionalGrant] = {}
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
                k = (info.namespace, info.name, ctr, ref.uuid, ref.mig_uuid, grant.resource,
                     FRACTIONAL)
                units[k] = units.get(k, 0) + 1
                out[(info.namespace, info.name, ctr, ref.uuid, ref.mig_uuid)] = grant
                hs = holders.setdefault(ref.key, [])
                if (info.namespace, info.name, ctr) not in hs:
                    hs.append((info.namespace, info.name, ctr))
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

    @staticmethod
    def _owner(uuid: str, mig_uuid: str, ref: CgroupRef | None, pods: dict[str, PodInfo],
               by_container: dict[str, PodInfo], holders: dict[DeviceKey, list[Holder]],
               labels_of: Any) -> Owner:
        info: PodInfo | None = None
        if ref is not None:
            info = pods.get(ref.pod_uid) if ref.pod_uid else None
            if info is None and ref.container_id:
                info = by_container.get(ref.container_id)
        device_holders = holders.get((uuid, mig_uuid), ())
        if info is not None:
            ctr = info.containers.get(ref.container_id, "") if ref is not None else ""
            if not ctr:  # status not updated yet (fresh restart): infer from what we know
                mine = [c for ns, pod, c in device_holders
                        if ns == info.namespace and pod == info.name]
                if len(mine) == 1:
                    ctr = mine[0]
                elif len(info.container_names) == 1:
                    ctr = info.container_names[0]
            return (info.namespace, info.name, ctr, info.labels)
        if len(device_holders) == 1:
            ns, pod, ctr = device_holders[0]
            return (ns, pod, ctr, labels_of(ns, pod))
        return _NOBODY
