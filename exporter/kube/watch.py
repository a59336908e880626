"""A node-scoped list+watch of one resource kind, on its own daemon thread.

List with `fieldSelector=spec.nodeName=<node>`, then watch from the list's resourceVersion with
bookmarks; a watch the server ends on time resumes from the last version seen, without a relist.
A 410 Gone (HTTP status or an ERROR event) relists. Every other failure retries the watch from
the last version (or the list, if there is none yet).

Failures back off: the n-th failure in a row waits a random time in [(1-jitter)·d, d] with
d = min(cap, initial·2ⁿ), before at most one new list (so at most one relist per step). A streak
ends only when a watch has stayed up for `healthy_after` seconds: a server that answers every
watch with 410 right away is a storm, however fast it lists. A watch that ends cleanly but
sooner than that counts as a failure too (a server closing every stream would be a storm of
watches). Logging: the first failure of a streak, one line when it becomes a storm (with the
count so far), one line with the total when it ends.

Bounded: the cache holds at most `WatchedKind.max_items` objects of at most `max_bytes` in all
(their parsed form's approximate size, `retained_bytes`: what a cached object costs whatever
its JSON held); one more (a list past it, an ADDED past it, a MODIFIED that outgrows it) is not
cached but counted in `dropped()` (gpu_exporter_kube_objects_dropped_total) and logged once per
cache. A list may hold at most LIST_FACTOR times that many items in all
(objects that parse to nothing included), else it is refused. An event costs O(1): it changes a
private dict, and readers get a copy published at most every `publish_interval` seconds (at
once when the last publish is older), so a flood of events costs one copy per interval.
"""

from __future__ import annotations

import logging
import random
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from exporter.core import SourceStatus
from exporter.errors import ConfigError
from exporter.kube.client import (
    REQUEST_DEADLINE,
    ApiClient,
    ApiError,
    BadResponse,
    DeadlineExceeded,
    Skipped,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
GONE = 410
EXPIRED = "410-expired"
SHORT_WATCH = "watch-ended-early"
# Objects cached per node: running pods are at most the kubelet's --max-pods (110 by default,
# 250-737 on cloud maxima), but finished pods stay bound to the node until the pod garbage
# collector deletes them, at 12,500 finished pods cluster-wide by default
# (--terminated-pod-gc-threshold): a node can legitimately hold that many.
MAX_CACHED = 13_000
# The parsed objects' size: an ordinary pod is ~1.3 KB parsed (13,000: ~17 MiB). The process
# pays ~2.4x this estimate (the pod watch's indexes, the copy being built while readers hold
# the last, allocator overhead; bench/kube_hostile.py), and the DaemonSet's limit is 192 MiB.
MAX_CACHED_BYTES = 32 << 20
LIST_FACTOR = 4  # list items read per cache slot before a list is refused
PUBLISH_INTERVAL = 0.25

CACHE_FULL = "cache-full"
TOO_LARGE = "too-large"
# (node, noun, reason) -> objects not cached; by node, as the simulator runs many exporters
# in one process
_dropped: Counter[tuple[str, str, str]] = Counter()
_dropped_lock = threading.Lock()


def dropped(node: str) -> dict[tuple[str, str], int]:
    """Objects of each watched kind (noun) not cached for `node` since start, by reason:
    CACHE_FULL (the cache held max_items) or TOO_LARGE (over the client's per-object
    bounds)."""
    with _dropped_lock:
        return {(noun, reason): n for (at, noun, reason), n in _dropped.items() if at == node}


@dataclass(frozen=True)
class WatchedKind(Generic[T]):
    """What to watch: the collection's API path and how to read one object of it."""

    noun: str  # "pod", "ResourceSlice": in log lines and the thread's name
    path: str  # e.g. "/api/v1/pods", "/apis/resource.k8s.io/v1/resourceslices"
    parse: Callable[[dict[str, Any]], T | None]  # None: not usable (kept out of the cache)
    max_items: int = MAX_CACHED  # objects cached at most; past it, counted in dropped()
    max_bytes: int = MAX_CACHED_BYTES  # their retained_bytes in all, likewise


@dataclass(frozen=True)
class BackoffPolicy:
    initial: float = 0.5
    cap: float = 30.0
    jitter: float = 0.5  # fraction of a step's delay that is random
    healthy_after: float = 60.0  # a watch up this long ends a failure streak
    storm_after: int = 3  # failures in a row that make a storm (logged once)

    def step(self, n: int) -> float:
        """The longest wait before retry n (0-based) of a streak."""
        return min(self.cap, self.initial * 2.0 ** min(n, 64))

    def max_retries_within(self, seconds: float) -> int:
        """The most retries a streak can make in `seconds`: each waits at least its step's
        shortest delay. What a storm test bounds request counts with."""
        total, n = 0.0, 0
        while True:
            total += self.step(n) * (1.0 - self.jitter)
            if total > seconds:
                return n
            n += 1


DEFAULT_BACKOFF = BackoffPolicy()


class _Expired(Exception):
    """The resourceVersion is gone: relist."""


class _Streak:
    """Consecutive failures: the backoff schedule and the storm log lines."""

    def __init__(self, policy: BackoffPolicy, noun: str, rng: random.Random) -> None:
        self.policy, self.noun, self.rng = policy, noun, rng
        self.failures: Counter[str] = Counter()
        self.since = 0.0

    @property
    def count(self) -> int:
        return sum(self.failures.values())

    def fail(self, reason: str, err: object) -> float:
        """Record a failure; returns how long to wait before the next request."""
        n = self.count
        if n == 0:
            self.since = time.time()
        self.failures[reason] += 1
        longest = self.policy.step(n)
        delay = self.rng.uniform(longest * (1.0 - self.policy.jitter), longest)
        if n == 0:
            level = logging.INFO if reason in (EXPIRED, SHORT_WATCH) else logging.WARNING
            log.log(level, "%s watch: %s (%s); retrying in %.2fs", self.noun, reason, err, delay)
        elif n + 1 == self.policy.storm_after:
            log.warning("%s watch: storm: %d failures in a row since %s (%s); backing off up "
                        "to %.0fs with jitter, logging again when it ends", self.noun, n + 1,
                        _clock(self.since), self._summary(), self.policy.cap)
        else:
            log.debug("%s watch: %s (%s); retry %d in %.2fs", self.noun, reason, err, n + 1,
                      delay)
        return delay

    def end(self) -> None:
        if self.count >= self.policy.storm_after:
            log.warning("%s watch: healthy again after %d failures in a row over %.0fs (%s)",
                        self.noun, self.count, time.time() - self.since, self._summary())
        self.failures.clear()

    def _summary(self) -> str:
        return ", ".join(f"{reason} x{n}" for reason, n in self.failures.most_common())


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class NodeScopedWatch(Generic[T]):
    """Call start(); read `items` (metadata.uid → parsed object), `status` and `lists` from any
    thread. `items` is replaced whole on change, never mutated, so readers need no lock;
    `on_change` (if given) is called with each new mapping, one call at a time (on the watch
    thread, or on the timer that publishes the last changes of a burst)."""

    def __init__(self, kind: WatchedKind[T], node: str, connect: Callable[[], ApiClient], *,
                 on_change: Callable[[Mapping[str, T]], None] | None = None,
                 policy: BackoffPolicy = DEFAULT_BACKOFF, watch_timeout: int = 300,
                 rng: random.Random | None = None,
                 publish_interval: float = PUBLISH_INTERVAL,
                 request_deadline: float = REQUEST_DEADLINE) -> None:
        self.kind, self.node = kind, node
        self._connect = connect
        self._on_change = on_change
        self.policy = policy
        self.watch_timeout = watch_timeout
        self.items: Mapping[str, T] = {}
        self.status = SourceStatus(False, "starting")
        self.lists = 0  # completed lists (the first, then one per relist)
        self._streak = _Streak(policy, kind.noun, rng or random.Random())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._api: ApiClient | None = None
        self._version = ""  # resume from here; "" until a list succeeds, and after a 410
        self._watch_started = 0.0  # when the current watch request was answered
        # the cache as events change it (watch thread only, under _lock); published copies
        self._work: dict[str, T] = {}
        self._sizes: dict[str, int] = {}  # uid -> retained_bytes of its cached object
        self._bytes = 0  # their sum
        self._bytes_before = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._published_at = -1e9
        self._timer: threading.Timer | None = None
        self.publish_interval = publish_interval
        self.request_deadline = request_deadline  # a whole list, however slowly it arrives
        self._logged: set[str] = set()  # drop reasons logged already

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def version(self) -> str:
        """The resourceVersion the next watch resumes from ('' before a list, after a 410)."""
        return self._version

    @property
    def running(self) -> bool:
        """The watch thread is alive (false again after close())."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> NodeScopedWatch[T]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self.kind.noun}-watch",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
        api = self._api
        if api is not None:
            api.abort()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._watch_started = 0.0
            reason: str = ""
            err: object = None
            try:
                if self._api is None:
                    self._api = self._connect()
                    if self._stop.is_set():
                        return
                if not self._version:
                    self._list(self._api)
                self._watch(self._api)
            except _Expired as exc:
                self._version, reason, err = "", EXPIRED, exc
            except Exception as exc:  # anything else: report, back off, resume
                reason, err = failure_reason(exc), exc
                self.status = SourceStatus(False, reason)
                self._api = None  # re-read credentials: a rotated certificate, a fixed file
            if self._stop.is_set():
                return
            if self._healthy():
                self._streak.end()
                if not reason:
                    continue  # a watch the server ended on time: resume at once
            elif not reason:
                lasted = time.monotonic() - self._watch_started if self._watch_started else 0.0
                reason, err = SHORT_WATCH, f"after {lasted:.2f}s"
            self._stop.wait(self._streak.fail(reason, err))

    def _healthy(self) -> bool:
        """The current (or last) watch has been up long enough to end a failure streak; one
        that ran its full timeout counts, even when that is shorter (tests)."""
        if not self._watch_started:
            return False
        lasted = time.monotonic() - self._watch_started
        return lasted >= min(self.policy.healthy_after, 0.9 * self.watch_timeout)

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node}"}

    def _list(self, api: ApiClient) -> None:
        items: dict[str, T] = {}
        sizes: dict[str, int] = {}
        over = 0

        def keep(obj: Any) -> None:
            nonlocal over
            if isinstance(obj, Skipped):
                self._drop(1, TOO_LARGE)
            elif isinstance(obj, dict):
                uid, parsed = _uid(obj), self.kind.parse(obj)
                if uid and parsed is not None:
                    size = retained_bytes(parsed)
                    if self._fits(items, sizes, uid, size):
                        self._bytes += size - sizes.get(uid, 0)
                        items[uid], sizes[uid] = parsed, size
                    else:
                        over += 1

        self._bytes_before, self._bytes = self._bytes, 0
        try:
            body = api.get_list(self.kind.path, self._query(), keep,
                                max_items=LIST_FACTOR * self.kind.max_items,
                                deadline=self.request_deadline)
        except ApiError as err:
            self._bytes = self._bytes_before
            if err.status == GONE:
                raise _Expired(str(err)) from err
            raise
        except BaseException:
            self._bytes = self._bytes_before
            raise
        version = (body.get("metadata") or {}).get("resourceVersion")
        if not isinstance(version, str) or not version:
            self._bytes = self._bytes_before
            raise BadResponse(f"{self.kind.path}: a list without metadata.resourceVersion")
        self._drop(over, CACHE_FULL)
        with self._lock:
            self._work, self._sizes = items, sizes
            self._publish_locked()
        self._version = version
        self.lists += 1
        self.status = SourceStatus(True)

    def _watch(self, api: ApiClient) -> None:
        """One watch request from the last version seen until the server ends it. Raises
        _Expired on 410."""
        query = {**self._query(), "watch": "true", "resourceVersion": self._version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(self.watch_timeout)}
        try:
            with api.watch(self.kind.path, query,
                           read_timeout=self.watch_timeout + 30.0) as events:
                self._watch_started = time.monotonic()
                self.status = SourceStatus(True)
                for event in events:
                    self._apply(event)
                    if self._streak.count and self._healthy():
                        self._streak.end()  # a storm ends while the watch is still open
        except ApiError as err:  # the request's status, or an ERROR event's code
            if err.status == GONE:
                raise _Expired(str(err)) from err
            raise

    def _apply(self, event: dict[str, Any] | Skipped) -> None:
        if isinstance(event, Skipped):
            self._drop(1, TOO_LARGE)  # its object keeps its last state until a relist
            return
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            raise BadResponse(f"{self.kind.path}: a watch event without an object")
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiError(code if isinstance(code, int) else 500, str(obj.get("reason") or ""),
                           str(obj.get("message") or ""))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if isinstance(rv, str) and rv:
            self._version = rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            uid = _uid(obj)
            if uid:
                parsed = self.kind.parse(obj) if kind != "DELETED" else None
                size = retained_bytes(parsed) if parsed is not None else 0
                with self._lock:
                    work, sizes = self._work, self._sizes
                    if parsed is not None and self._fits(work, sizes, uid, size):
                        work[uid] = parsed
                        self._bytes += size - sizes.get(uid, 0)
                        sizes[uid] = size
                    else:
                        if parsed is not None:
                            self._drop(1, CACHE_FULL)
                        if work.pop(uid, None) is None:
                            return
                        self._bytes -= sizes.pop(uid)
                    self._changed_locked()
        # BOOKMARK (and a type this client does not know) only moves the version

    def _fits(self, items: Mapping[str, T], sizes: Mapping[str, int], uid: str,
              size: int) -> bool:
        """Whether `uid` at `size` fits the bounds (replacing what it had, if cached)."""
        if uid not in items and len(items) >= self.kind.max_items:
            return False
        return self._bytes - sizes.get(uid, 0) + size <= self.kind.max_bytes

    def _drop(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        with _dropped_lock:
            _dropped[self.node, self.kind.noun, reason] += n
        if reason not in self._logged:
            self._logged.add(reason)
            why = f"the cache holds its maximum of {self.kind.max_items}" \
                if reason == CACHE_FULL else "over the per-object bounds"
            log.warning("node %s: %d %s(s) not cached: %s; counted in "
                        "gpu_exporter_kube_objects_dropped_total{kind=%r,reason=%r}, "
                        "logged once", self.node, n, self.kind.noun, why, self.kind.noun,
                        reason)

    def _changed_locked(self) -> None:
        """Publish now if the last publish is older than the interval, else once it is."""
        self._dirty = True
        wait = self._published_at + self.publish_interval - time.monotonic()
        if wait <= 0:
            self._publish_locked()
        elif self._timer is None and not self._stop.is_set():
            self._timer = threading.Timer(wait, self._publish_later)
            self._timer.daemon = True
            self._timer.start()

    def _publish_later(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty and not self._stop.is_set():
                self._publish_locked()

    def _publish_locked(self) -> None:
        items = dict(self._work)
        self._dirty = False
        self._published_at = time.monotonic()
        self.items = items
        if self._on_change is not None:
            self._on_change(items)


def retained_bytes(obj: object, depth: int = 0) -> int:
    """An approximate upper bound on the memory `obj` holds: sys.getsizeof over it and what
    it contains (dataclass fields, mappings, sequences, sets), shared objects counted each
    time. Linear in the object's size, which its JSON's bounds already limit."""
    size = sys.getsizeof(obj)
    if depth > 32 or isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return size
    if isinstance(obj, dict):
        return size + sum(retained_bytes(k, depth + 1) + retained_bytes(v, depth + 1)
                          for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(retained_bytes(v, depth + 1) for v in obj)
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None:
        return size + sum(retained_bytes(getattr(obj, f), depth + 1) for f in fields)
    return size


def _uid(obj: dict[str, Any]) -> str:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""


def failure_reason(err: BaseException) -> str:
    """A short, low-cardinality reason for gpu_exporter_source_error_info."""
    if isinstance(err, ApiError):
        return {401: "unauthorized", 403: "forbidden", 404: "not-found"}.get(
            err.status, f"http-{err.status}")
    if isinstance(err, ConfigError):
        return "no-config"
    if isinstance(err, DeadlineExceeded):
        return "deadline"
    if isinstance(err, BadResponse):
        return "bad-response"
    if isinstance(err, ssl.SSLError):
        return "tls"
    if isinstance(err, (OSError, EOFError)) or type(err).__module__ == "http.client":
        return "unreachable"
    if isinstance(err, (ValueError, KeyError, TypeError)):
        return "bad-response"
    return "error"
