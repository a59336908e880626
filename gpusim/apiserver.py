"""A simulated Kubernetes API server: just enough of /api/v1/pods for the real `kubernetes`
client to list and watch pods, on 127.0.0.1 with a free port.

Lists carry metadata.resourceVersion; `?watch=true&resourceVersion=N` streams JSON lines of
ADDED / MODIFIED / DELETED events after N. `expire()` makes the next watch answer what a real
server sends when N has been compacted away: an ERROR event holding a 410 Gone Status.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "gpu-ledger-fake-token"
_WAIT_TICK = 0.2  # how often an idle watch stream checks for shutdown


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


def _matches(pod: dict[str, Any], terms: list[tuple[str, bool, str]]) -> bool:
    return all((_field(pod, key) == value) == equal for key, equal, value in terms)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self._cond = threading.Condition()
        self._rv = 1
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._expire_next = False
        self._generation = 0  # bumped to end every open watch stream
        self._closed = False
        self.requests: list[str] = []  # path?query of every request, for tests
        for pod in pods or []:
            self._store(pod, record=False)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- state -------------------------------------------------------------------------------
    def _store(self, pod: dict[str, Any], record: bool, kind: str = "ADDED") -> dict[str, Any]:
        pod = copy.deepcopy(pod)
        meta = pod.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuidlib.uuid4()))
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        with self._cond:
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._pods[(meta["namespace"], meta["name"])] = pod
            if record:
                self._events.append((self._rv, kind, copy.deepcopy(pod)))
                self._cond.notify_all()
        return pod

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod (uid filled in if absent) and push ADDED; returns the stored pod."""
        return self._store(pod, record=True, kind="ADDED")

    def modify_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Replace the pod with the same namespace/name and push MODIFIED."""
        meta = pod.get("metadata", {})
        key = (meta.get("namespace", "default"), meta["name"])
        if key not in self._pods:
            raise KeyError(f"no pod {key[0]}/{key[1]}")
        if "uid" not in meta:
            pod = copy.deepcopy(pod)
            pod["metadata"]["uid"] = self._pods[key]["metadata"]["uid"]
        return self._store(pod, record=True, kind="MODIFIED")

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            pod = self._pods.pop((namespace, name))
            self._rv += 1
            pod["metadata"]["resourceVersion"] = str(self._rv)
            self._events.append((self._rv, "DELETED", pod))
            self._cond.notify_all()

    def expire(self) -> None:
        """End open watches; the next watch request gets a 410 Gone ERROR event."""
        with self._cond:
            self._expire_next = True
            self._generation += 1
            self._cond.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    # --- lifecycle -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

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

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at this server (bearer token auth); returns the path."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)  # JSON is YAML: the client reads it as a kubeconfig
        return path

    # --- HTTP ----------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches stream in chunks, as a real server's do
            timeout = 10  # idle keep-alive connections end on their own

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read api.requests instead

            def do_GET(self) -> None:
                api.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._json(401, _status(401, "Unauthorized", "Unauthorized"))
                    return
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                parts = [p for p in url.path.split("/") if p]
                terms = _selector(query.get("fieldSelector", ""))
                if parts == ["api", "v1", "pods"]:
                    pass
                elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] \
                        and parts[4] == "pods":
                    terms.append(("metadata.namespace", True, parts[3]))
                else:
                    self._json(404, _status(404, "NotFound", f"{url.path} not found"))
                    return
                if query.get("watch", "").lower() in ("true", "1"):
                    self._watch(terms, query)
                else:
                    self._list(terms)

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _list(self, terms: list[tuple[str, bool, str]]) -> None:
                with api._cond:
                    items = [p for p in api._pods.values() if _matches(p, terms)]
                    body = {"kind": "PodList", "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(api._rv)}, "items": items}
                    data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self, terms: list[tuple[str, bool, str]], query: dict[str, str]) -> None:
                timeout = float(query.get("timeoutSeconds") or 1800)
                deadline = time.monotonic() + timeout
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    self._stream(terms, query, deadline)
                finally:
                    with contextlib.suppress(OSError):
                        self.wfile.write(b"0\r\n\r\n")

            def _stream(self, terms: list[tuple[str, bool, str]], query: dict[str, str],
                        deadline: float) -> None:
                with api._cond:
                    generation = api._generation
                    if api._expire_next:
                        api._expire_next = False
                        rv = query.get("resourceVersion", "")
                        err = _status(410, "Expired", f"too old resource version: {rv} "
                                                      f"({api._rv})")
                        self._send([("ERROR", err)])
                        return
                    since = query.get("resourceVersion", "")
                    if since in ("", "0"):  # no version: start with the current state
                        initial = [("ADDED", p) for p in api._pods.values()
                                   if _matches(p, terms)]
                        last = api._rv
                    else:
                        initial, last = [], int(since)
                if initial:
                    self._send(initial)
                while True:
                    with api._cond:
                        pending = [(rv, t, p) for rv, t, p in api._events if rv > last]
                        if not pending:
                            api._cond.wait(_WAIT_TICK)
                        if (api._closed or api._generation != generation
                                or time.monotonic() >= deadline):
                            return
                    if pending:
                        last = pending[-1][0]
                        if not self._send([(t, p) for _, t, p in pending if _matches(p, terms)]):
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
