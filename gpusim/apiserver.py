"""A simulated Kubernetes API server: just enough of the pods, ResourceSlices and ResourceClaims
APIs for a client to list and watch them and get one object, on 127.0.0.1 with a free port, over
HTTP or TLS.

Collections: `/api/v1/pods`, `/api/v1/namespaces/<ns>/pods`,
`/apis/resource.k8s.io/v1/resourceslices`, `/apis/resource.k8s.io/v1/resourceclaims` and
`/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims`, with `fieldSelector` (`a=b`,
`a!=b`); one object of a namespaced kind at `.../namespaces/<ns>/<resource>/<name>` (404 if
there is none). Lists carry
metadata.resourceVersion; `?watch=true&resourceVersion=N` streams JSON lines of ADDED /
MODIFIED / DELETED events after N, and BOOKMARK events (from `bookmark()`) when the request says
`allowWatchBookmarks=true`. Failure modes, as a real server shows them:
- `expire()`: the next watch answers an ERROR event holding a 410 Gone Status (version
  compacted away);
- `gone = "event"` / `gone = "http"`: every watch answers 410, as an ERROR event or as an
  HTTP 410 status, until reset to "" (a watch storm);
- `end_watches()`: open watch streams end, as at their timeout;
- `forbidden`: resources (e.g. {"resourceclaims"}) every request for which answers 403, as
  for a service account whose role does not grant them;
- `hostile`: a function of a request's path?query that returns the body of a 200 answer as
  pieces (each sent as one chunk and flushed, so a generator can drip, sleep or never end),
  or None to answer as usual: a broken or hostile server's answers (bench, tests).
Authentication: the bearer token TOKEN, or with `tls` that verifies client certificates, a
verified certificate.
"""

from __future__ import annotations

import contextlib
import copy
import json
import ssl
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "gpu-ledger-fake-token"
_WAIT_TICK = 0.2  # how often an idle watch stream checks for shutdown
PODS = "pods"
SLICES = "resourceslices"
CLAIMS = "resourceclaims"


@dataclass(frozen=True)
class _Resource:
    name: str
    api_version: str
    kind: str
    namespaced: bool


_RESOURCES = {
    PODS: _Resource(PODS, "v1", "Pod", True),
    SLICES: _Resource(SLICES, "resource.k8s.io/v1", "ResourceSlice", False),
    CLAIMS: _Resource(CLAIMS, "resource.k8s.io/v1", "ResourceClaim", True),
}
_BOOKMARK = "BOOKMARK"


def _field(obj: dict[str, Any], dotted: str) -> str:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def _selector(text: str) -> list[tuple[str, bool, str]]:
    """fieldSelector `a=b,c!=d` as (field, equal, value) terms."""
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key, False, value))
        else:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key, True, value))
    return terms


def _matches(obj: dict[str, Any], terms: list[tuple[str, bool, str]]) -> bool:
    return all((_field(obj, key) == value) == equal for key, equal, value in terms)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _route(path: str) -> tuple[_Resource, str, str] | None:
    """URL path -> (resource, namespace or '', object name or '' for the collection); None if
    not served."""
    parts = [p for p in path.split("/") if p]
    for prefix in (["api", "v1"], ["apis", "resource.k8s.io", "v1"]):
        if parts[:len(prefix)] != prefix:
            continue
        rest = parts[len(prefix):]
        namespace, name = "", ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
            if len(rest) == 2:
                rest, name = rest[:1], rest[1]
        res = _RESOURCES.get(rest[0]) if len(rest) == 1 else None
        if res is None or res.api_version != "/".join(prefix[1:]) \
                or (namespace and not res.namespaced):
            return None
        return res, namespace, name
    return None


class FakeApiServer:
    def __init__(self, pods: list[dict[str, Any]] | None = None, *,
                 slices: list[dict[str, Any]] | None = None,
                 claims: list[dict[str, Any]] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._cond = threading.Condition()
        self._rv = 1
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            name: {} for name in _RESOURCES}
        # (resourceVersion, resource ('' for a bookmark), type, object)
        self._events: list[tuple[int, str, str, dict[str, Any]]] = []
        self._expire_next = False
        self.gone = ""  # "event" | "http": every watch answers 410 that way
        self._generation = 0  # bumped to end every open watch stream
        self._closed = False
        self.requests: list[str] = []  # path?query of every request, for tests
        self.forbidden: set[str] = set()  # resources answered with 403
        self.hostile: Callable[[str], Iterable[bytes] | None] | None = None
        for pod in pods or []:
            self._store(PODS, pod, record=False)
        for item in slices or []:
            self._store(SLICES, item, record=False)
        for item in claims or []:
            self._store(CLAIMS, item, record=False)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._tls = tls
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None

    # --- state -------------------------------------------------------------------------------
    def _store(self, resource: str, obj: dict[str, Any], record: bool,
               kind: str = "ADDED") -> dict[str, Any]:
        res = _RESOURCES[resource]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuidlib.uuid4()))
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        with self._cond:
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objects[resource][(meta.get("namespace", ""), meta["name"])] = obj
            if record:
                self._events.append((self._rv, resource, kind, copy.deepcopy(obj)))
                self._cond.notify_all()
        return obj

    def _modify(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        ns = meta.get("namespace", "default") if _RESOURCES[resource].namespaced else ""
        key = (ns, meta["name"])
        current = self._objects[resource].get(key)
        if current is None:
            raise KeyError(f"no {resource} {key[0]}/{key[1]}")
        if "uid" not in meta:
            obj = copy.deepcopy(obj)
            obj["metadata"]["uid"] = current["metadata"]["uid"]
        return self._store(resource, obj, record=True, kind="MODIFIED")

    def _delete(self, resource: str, namespace: str, name: str) -> None:
        with self._cond:
            obj = self._objects[resource].pop((namespace, name))
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._events.append((self._rv, resource, "DELETED", obj))
            self._cond.notify_all()

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod (uid filled in if absent) and push ADDED; returns the stored pod."""
        return self._store(PODS, pod, record=True, kind="ADDED")

    def modify_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Replace the pod with the same namespace/name and push MODIFIED."""
        return self._modify(PODS, pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._delete(PODS, namespace, name)

    def add_slice(self, item: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceSlice (cluster-scoped) and push ADDED."""
        return self._store(SLICES, item, record=True, kind="ADDED")

    def modify_slice(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._modify(SLICES, item)

    def delete_slice(self, name: str) -> None:
        self._delete(SLICES, "", name)

    def add_claim(self, item: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaim (namespaced) and push ADDED."""
        return self._store(CLAIMS, item, record=True, kind="ADDED")

    def modify_claim(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._modify(CLAIMS, item)

    def delete_claim(self, namespace: str, name: str) -> None:
        self._delete(CLAIMS, namespace, name)

    def bookmark(self) -> int:
        """Send a BOOKMARK at the current resourceVersion to watches that allow bookmarks;
        returns that version."""
        with self._cond:
            self._rv += 1  # what a change elsewhere in the cluster would do
            self._events.append((self._rv, "", _BOOKMARK, {}))
            self._cond.notify_all()
            return self._rv

    def expire(self) -> None:
        """End open watches; the next watch request gets a 410 Gone ERROR event."""
        with self._cond:
            self._expire_next = True
            self._generation += 1
            self._cond.notify_all()

    def end_watches(self) -> None:
        """End open watch streams cleanly, as a server does at timeoutSeconds."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    # --- lifecycle -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it ran
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: str, *, ca_file: str | None = None,
                   user: dict[str, Any] | None = None) -> str:
        """Write a kubeconfig pointing at this server (bearer token auth unless `user` says
        otherwise; `ca_file` for TLS); returns the path."""
        cluster: dict[str, Any] = {"server": self.url}
        if ca_file:
            cluster["certificate-authority"] = ca_file
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": user if user is not None else {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)  # JSON is YAML: clients read it as a kubeconfig
        return path

    # --- HTTP ----------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches stream in chunks, as a real server's do
            timeout = 10  # idle keep-alive connections end on their own

            def handle(self) -> None:
                if isinstance(self.connection, ssl.SSLSocket):
                    try:  # here, on the handler's thread, not in the accept loop
                        self.connection.do_handshake()
                    except (ssl.SSLError, OSError):
                        return  # a client that does not trust us, or has no certificate
                super().handle()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read api.requests instead

            def _authenticated(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                    return True
                conn = self.connection
                return isinstance(conn, ssl.SSLSocket) and bool(conn.getpeercert())

            def do_GET(self) -> None:
                api.requests.append(self.path)
                if not self._authenticated():
                    self._json(401, _status(401, "Unauthorized", "Unauthorized"))
                    return
                pieces = api.hostile(self.path) if api.hostile is not None else None
                if pieces is not None:
                    self._chunked(pieces)
                    return
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                route = _route(url.path)
                if route is None:
                    self._json(404, _status(404, "NotFound", f"{url.path} not found"))
                    return
                resource, namespace, name = route
                if resource.name in api.forbidden:
                    self._json(403, _status(403, "Forbidden", f"{resource.name} is forbidden: "
                                            "the service account cannot get it"))
                    return
                if name:
                    self._get(resource, namespace, name)
                    return
                terms = _selector(query.get("fieldSelector", ""))
                if namespace:
                    terms.append(("metadata.namespace", True, namespace))
                if query.get("watch", "").lower() in ("true", "1"):
                    self._watch(resource, terms, query)
                else:
                    self._list(resource, terms)

            def _start_chunked(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

            def _chunked(self, pieces: Iterable[bytes]) -> None:
                self._start_chunked()
                with contextlib.suppress(OSError):  # the client gave up: that is the point
                    for piece in pieces:
                        if api._closed:
                            return
                        if piece:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _get(self, res: _Resource, namespace: str, name: str) -> None:
                with api._cond:
                    obj = api._objects[res.name].get((namespace, name))
                if obj is None:
                    self._json(404, _status(404, "NotFound",
                                            f'{res.name} "{name}" not found'))
                else:
                    self._json(200, obj)

            def _list(self, res: _Resource, terms: list[tuple[str, bool, str]]) -> None:
                with api._cond:
                    items = [o for o in api._objects[res.name].values() if _matches(o, terms)]
                    body = {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(api._rv)}, "items": items}
                self._json(200, body)

            def _watch(self, res: _Resource, terms: list[tuple[str, bool, str]],
                       query: dict[str, str]) -> None:
                if api.gone == "http":
                    rv = query.get("resourceVersion", "")
                    self._json(410, _status(410, "Expired",
                                            f"too old resource version: {rv} ({api._rv})"))
                    return
                timeout = float(query.get("timeoutSeconds") or 1800)
                deadline = time.monotonic() + timeout
                self._start_chunked()
                try:
                    self._stream(res, terms, query, deadline)
                finally:
                    with contextlib.suppress(OSError):
                        self.wfile.write(b"0\r\n\r\n")

            def _stream(self, res: _Resource, terms: list[tuple[str, bool, str]],
                        query: dict[str, str], deadline: float) -> None:
                bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
                with api._cond:
                    generation = api._generation
                    if api._expire_next or api.gone == "event":
                        api._expire_next = False
                        rv = query.get("resourceVersion", "")
                        err = _status(410, "Expired", f"too old resource version: {rv} "
                                                      f"({api._rv})")
                        self._send([("ERROR", err)])
                        return
                    since = query.get("resourceVersion", "")
                    if since in ("", "0"):  # no version: start with the current state
                        initial = [("ADDED", o) for o in api._objects[res.name].values()
                                   if _matches(o, terms)]
                        last = api._rv
                    else:
                        initial, last = [], int(since)
                if initial:
                    self._send(initial)
                while True:
                    with api._cond:
                        pending = [e for e in api._events if e[0] > last]
                        if not pending:
                            api._cond.wait(_WAIT_TICK)
                        if (api._closed or api._generation != generation
                                or time.monotonic() >= deadline):
                            return
                    if pending:
                        last = pending[-1][0]
                        out = []
                        for version, name, kind, obj in pending:
                            if kind == _BOOKMARK and bookmarks:
                                meta = {"resourceVersion": str(version)}
                                out.append((kind, {"kind": res.kind, "metadata": meta,
                                                   "apiVersion": res.api_version}))
                            elif name == res.name and _matches(obj, terms):
                                out.append((kind, obj))
                        if out and not self._send(out):
                            return

            def _send(self, events: list[tuple[str, dict[str, Any]]]) -> bool:
                try:
                    for kind, obj in events:  # one chunk per event
                        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    return True
                except OSError:  # the client went away
                    return False

        return Handler
