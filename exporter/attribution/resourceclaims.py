"""Whether a shared DRA device is an MPS share: the sharing strategy the NVIDIA DRA driver
applies to it, read from its ResourceClaim (`resource.k8s.io/v1`).

The driver takes sharing from the claim's opaque device config: entries `{requests: [...],
opaque: {driver: gpu.nvidia.com, parameters: {apiVersion: resource.nvidia.com/v1beta1, kind:
GpuConfig | MigDeviceConfig, sharing: {strategy: MPS | TimeSlicing, ...}}}}`. The scheduler
copies the device class's config (`source: FromClass`) and the claim's own (`FromClaim`) into
`status.allocation.devices.config`, which is read first; `spec.devices.config` only for a claim
without an allocation. Which entry applies to a device, as the driver decides: the allocation
result names the device's request; of the driver's entries whose kind fits the device (GpuConfig
a GPU, MigDeviceConfig a MIG device) and whose `requests` is empty or names that request (or its
main request, `main/sub`), the last wins, the claim's entries after the class's. No entry, or
another strategy: not MPS.

How claims are read: one GET each (`/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/
<name>`), never a cluster-wide list or watch, on a thread of its own. Each cycle the collector
names the claims it needs (`want`); the thread GETs those with no answer, again `refresh`
seconds after a read (a claim deleted and made again under its name has another uid and maybe
another config) and `retry` seconds after a failure. Claims no longer named are dropped. The
cycle reads `entries`, which is replaced whole, never mutated. Needs `get` on `resourceclaims`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.attribution.dra import SliceKey
from exporter.kube.client import ApiClient, ApiError
from exporter.kube.watch import failure_reason

log = logging.getLogger(__name__)

ClaimKey = tuple[str, str]  # (namespace, name)
MPS = "MPS"  # the driver's strategy name (resource.nvidia.com/v1beta1 GpuSharing.strategy)
_GPU_KIND, _MIG_KIND = "GpuConfig", "MigDeviceConfig"
_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}  # class config first: the claim's wins


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque device config entry: the driver it is for, the requests it is scoped to
    (empty: all) and, from its parameters, the kind and sharing strategy."""

    driver: str
    requests: tuple[str, ...]
    kind: str
    strategy: str  # "" without a sharing section


@dataclass(frozen=True)
class ClaimConfig:
    uid: str
    requests: Mapping[SliceKey, str]  # allocated device -> the request it was allocated for
    configs: tuple[OpaqueConfig, ...]  # in precedence order: the last that applies wins

    def is_mps(self, device: SliceKey, mig: bool) -> bool:
        """Whether the driver runs `device` (a MIG device if `mig`) under MPS. A device the
        allocation does not list (a claim read from its spec) matches every scoped entry."""
        request = self.requests.get(device)
        kind = _MIG_KIND if mig else _GPU_KIND
        for c in reversed(self.configs):
            if c.driver != device.driver or c.kind != kind:
                continue
            if not c.requests or request is None or request in c.requests \
                    or request.split("/", 1)[0] in c.requests:
                return c.strategy == MPS
        return False


def _text(raw: object) -> str:
    return raw if isinstance(raw, str) else ""


def _dict(raw: object) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _dicts(raw: object) -> list[dict[str, Any]]:
    return [x for x in raw if isinstance(x, dict)] if isinstance(raw, list) else []


def _opaque(entry: dict[str, Any]) -> OpaqueConfig | None:
    opaque = entry.get("opaque")
    if not isinstance(opaque, dict):
        return None  # a structured config of a future API version: not the driver's sharing
    params = _dict(opaque.get("parameters"))
    strategy = _text(_dict(params.get("sharing")).get("strategy"))
    requests = entry.get("requests")
    names = tuple(r for r in requests if isinstance(r, str)) if isinstance(requests, list) else ()
    return OpaqueConfig(_text(opaque.get("driver")), names, _text(params.get("kind")), strategy)


def claim_config(obj: dict[str, Any]) -> ClaimConfig:
    """A ResourceClaim's JSON read field by field: a malformed part counts as absent."""
    allocation = _dict(obj.get("status")).get("allocation")
    requests: dict[SliceKey, str] = {}
    if isinstance(allocation, dict):
        devices = _dict(allocation.get("devices"))
        for r in _dicts(devices.get("results")):
            requests[SliceKey(_text(r.get("driver")), _text(r.get("pool")),
                              _text(r.get("device")))] = _text(r.get("request"))
        entries = _dicts(devices.get("config"))
    else:  # not allocated (yet): the claim's own config is all there is
        entries = _dicts(_dict(_dict(obj.get("spec")).get("devices")).get("config"))
    # sorted() is stable: within a source, the order the API lists them in
    ordered = sorted(entries, key=lambda e: _SOURCE_ORDER.get(_text(e.get("source")), 1))
    configs = tuple(c for e in ordered if (c := _opaque(e)) is not None)
    return ClaimConfig(_text(_dict(obj.get("metadata")).get("uid")), requests, configs)


@dataclass(frozen=True)
class Entry:
    """The last answer for one claim: its config, or why it could not be read."""

    at: float  # the reader's clock when it was read
    config: ClaimConfig | None
    reason: str = ""  # failure_reason() when config is None


class ClaimReader:
    """GETs the ResourceClaims named by `want` on its own daemon thread (started on the first
    claim wanted); `entries` maps each wanted claim to its last answer."""

    def __init__(self, connect: Callable[[], ApiClient], *, refresh: float = 300.0,
                 retry: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._connect = connect
        self.refresh, self.retry = refresh, retry
        self._clock = clock
        self.entries: Mapping[ClaimKey, Entry] = {}
        self._wanted: frozenset[ClaimKey] = frozenset()
        self._cond = threading.Condition()  # guards writes of entries; notified per answer
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._api: ApiClient | None = None
        self._warned: set[str] = set()  # failure reasons already logged at warning level

    @property
    def pending(self) -> frozenset[ClaimKey]:
        """Wanted claims with no answer yet."""
        entries = self.entries
        return frozenset(k for k in self._wanted if k not in entries)

    def want(self, keys: Iterable[ClaimKey]) -> None:
        """The claims the collector needs now: others are forgotten, and the thread is woken
        if any has no answer or an old one. Called once per cycle; cheap."""
        wanted = frozenset(keys)
        if wanted != self._wanted:
            with self._cond:
                self._wanted = wanted
                self.entries = {k: e for k, e in self.entries.items() if k in wanted}
        if any(self._due(k) for k in wanted):
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="resourceclaim-reader",
                                                daemon=True)
                self._thread.start()
            self._wake.set()

    def wait(self, keys: Iterable[ClaimKey], timeout: float) -> None:
        """Wait up to `timeout` seconds for a first answer for each of `keys` (the tight
        deadline a cycle gives claims it sees for the first time)."""
        wanted = frozenset(keys)
        with self._cond:
            self._cond.wait_for(lambda: wanted <= self.entries.keys(), timeout)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        api = self._api
        if api is not None:
            api.abort()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the reader thread ---------------------------------------------------------------------
    def _due(self, key: ClaimKey) -> bool:
        entry = self.entries.get(key)
        if entry is None:
            return True
        age = self._clock() - entry.at
        return age >= (self.refresh if entry.config is not None else self.retry)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            for key in sorted(k for k in self._wanted if self._due(k)):
                if self._stop.is_set():
                    return
                entry = self._read(key)
                with self._cond:
                    if key in self._wanted:  # still held: not forgotten while it was read
                        self.entries = {**self.entries, key: entry}
                    self._cond.notify_all()

    def _read(self, key: ClaimKey) -> Entry:
        namespace, name = key
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        try:
            if self._api is None:
                self._api = self._connect()
            config = claim_config(self._api.get_json(path, {}))
        except Exception as err:  # report and retry later; never a traceback
            if not isinstance(err, ApiError):
                self._api = None  # re-read credentials, reconnect
            reason = failure_reason(err)
            level = logging.DEBUG if reason in self._warned else logging.WARNING
            self._warned.add(reason)
            log.log(level, "ResourceClaim %s/%s: cannot read its sharing config (%s: %s); its "
                    "shares count as time-slicing (gpu_exporter_dra_claims_unreadable); "
                    "further claims failing so are logged at debug level",
                    namespace, name, reason, err)
            return Entry(self._clock(), None, reason)
        previous = self.entries.get(key)
        if previous is not None and previous.config is not None \
                and previous.config.uid != config.uid:
            log.debug("ResourceClaim %s/%s was replaced (uid %s -> %s)", namespace, name,
                      previous.config.uid, config.uid)
        return Entry(self._clock(), config)
