"""A small Prometheus HTTP API client: instant and range queries with auth, TLS and retries.

Only the standard library: the metering job runs as a CronJob and should not need an HTTP stack
beyond http.client. Every failure is a PromError whose message names the URL (never with its
password) and what went wrong, in one line.

Each request has one deadline (`timeout`) covering connect, headers and the whole body; transport
failures (refused, reset, cut mid-body, timeout) and 429/5xx are retried with exponential backoff.
HTTP proxies come from the environment (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY;
metering/proxy.py): https:// through a CONNECT tunnel, http:// as absolute-URI requests.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from metering.errors import SourceError
from metering.proxy import Proxy, proxy_for

# Statuses worth another try: the server or a proxy in front of it is overloaded or restarting.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# One answer larger than this is refused: a 72-hour chunk of 100,000 series is ~40 MiB.
MAX_BODY = 1 << 30


@dataclass(frozen=True)
class Answer:
    """An HTTP answer of the API, not decoded yet."""

    body: bytes
    ctype: str
    status: int


class PromError(SourceError):
    """Prometheus could not answer, or the URL is not a Prometheus API."""


def redact(url: str) -> str:
    """`url` with any password replaced by `***`, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None and "@" not in parts.netloc:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    userinfo = f"{user}:***" if parts.password is not None else user
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


@dataclass
class PromClient:
    """`url` may carry credentials (`http://user:pass@host:9090`): they become basic auth and
    are removed from `url`, which is what every message shows."""

    url: str
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    ca_file: str | None = None
    timeout: float = 30.0  # seconds for a whole request: connect, headers and body
    retries: int = 4
    backoff: float = 0.5  # first wait; doubles on every retry
    sleep: Callable[[float], None] = time.sleep
    # Told one line before each retry's wait (what failed, how long it waits), so a wrong URL
    # is not a silent minute; None: say nothing.
    on_retry: Callable[[str], None] | None = field(default=None, repr=False)
    queries: int = 0  # PromQL queries answered successfully (instant + range)
    max_body: int = MAX_BODY
    _ssl: ssl.SSLContext | None = field(default=None, repr=False)
    proxy: Proxy | None = field(default=None, init=False)  # from the environment, or None
    _gave_up: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        shown = redact(self.url.rstrip("/"))
        try:
            parsed = urllib.parse.urlsplit(self.url.rstrip("/"))
            port = parsed.port
        except ValueError:
            raise PromError(f"{shown}: expected an http:// or https:// URL of Prometheus "
                            "with a valid host and port") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise PromError(f"{shown}: expected an http:// or https:// URL of Prometheus")
        if parsed.username is not None or parsed.password is not None:
            if self.bearer_token or self.basic_auth is not None:
                raise PromError(f"{shown}: credentials in the URL and another authentication "
                                "option: expected one of them")
            self.basic_auth = (urllib.parse.unquote(parsed.username or ""),
                               urllib.parse.unquote(parsed.password or ""))
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = port
        self._base_path = parsed.path
        host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
        netloc = host if port is None else f"{host}:{port}"
        self.url = urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))
        self._origin = urllib.parse.urlunsplit((parsed.scheme, netloc, "", "", ""))
        self.proxy = proxy_for(parsed.scheme, parsed.hostname, port)
        if self.ca_file is not None:
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise PromError(f"{self.ca_file}: cannot load CA certificates: {exc}") from None

    # --- public API ---------------------------------------------------------------------------

    def query(self, promql: str, at: datetime | float | None = None) -> list[dict[str, Any]]:
        """Instant query; returns the vector's series ({"metric": {...}, "value": [t, v]})."""
        params = {"query": promql}
        if at is not None:
            params["time"] = _ts(at)
        data = self._api("/api/v1/query", params)
        self.queries += 1
        return _result(data, self.url, promql)

    def query_range(self, promql: str, start: datetime | float, end: datetime | float,
                    step_s: float) -> list[dict[str, Any]]:
        """Range query; returns the matrix's series ({"metric": {...}, "values": [[t, v], ...]})."""
        data = self._api("/api/v1/query_range", _range_params(promql, start, end, step_s))
        self.queries += 1
        return _result(data, self.url, promql)

    def query_range_answer(self, promql: str, start: datetime | float, end: datetime | float,
                           step_s: float) -> Answer:
        """Range query, its answer undecoded (metering.matrix decodes it in columns)."""
        answer = self._fetch(self._target("/api/v1/query_range",
                                          _range_params(promql, start, end, step_s)))
        self.queries += 1
        return answer

    def export_answer(self, path: str, params: list[tuple[str, str]]) -> Answer:
        """A bulk export of stored samples (VictoriaMetrics' /api/v1/export,
        metering.vmexport, or /api/v1/export/native, metering.vmnative), undecoded."""
        answer = self._fetch(self._base_path + path + "?" + urllib.parse.urlencode(params))
        self.queries += 1
        return answer

    def page(self, path: str) -> Answer:
        """A page of the server that is not an API answer (VictoriaMetrics' /metrics, whose
        vm_app_version says its version: metering.vmnative), undecoded; not a query."""
        return self._fetch(self._base_path + path)

    def matrix(self, answer: Answer, promql: str) -> list[dict[str, Any]]:
        """data.result of an answer decoded by Python's json: the PromError of an answer that
        is not a success, not Prometheus, or has no result list."""
        return _result(self._envelope(answer.body, answer.ctype, answer.status), self.url, promql)

    def label_values(self, label: str, match: list[str], start: float, end: float
                     ) -> list[str]:
        """Values of `label` on the series matching any of `match` within [start, end]: an
        index lookup (no samples read); stores may answer a superset of the range."""
        params = urllib.parse.urlencode(
            [*(("match[]", m) for m in match), ("start", _ts(start)), ("end", _ts(end))])
        data = self._api(f"/api/v1/label/{urllib.parse.quote(label)}/values?{params}", {})
        if not isinstance(data, list):
            raise PromError(f"{self.url}: label values of {label!r} is not a list")
        return [str(v) for v in data]

    def series(self, match: list[str], start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching any of `match` within [start, end] (an index
        lookup: no samples read)."""
        params = urllib.parse.urlencode(
            [*(("match[]", m) for m in match), ("start", _ts(start)), ("end", _ts(end))])
        data = self._api(f"/api/v1/series?{params}", {})
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise PromError(f"{self.url}: the series list is not a list of label sets")
        return [{str(k): str(v) for k, v in d.items()} for d in data]

    def major_version(self) -> int | None:
        """Prometheus major version from /api/v1/status/buildinfo; None where it is not served
        (some Prometheus-compatible servers lack it)."""
        try:
            data = self._api("/api/v1/status/buildinfo", {})
        except PromError:
            return None
        version = str(data.get("version", "")) if isinstance(data, dict) else ""
        head = version.lstrip("v").split(".", 1)[0]
        return int(head) if head.isdigit() else None

    # --- transport ----------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "gpu-ledger-meter",
                   "Accept-Encoding": "identity"}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.basic_auth is not None:
            raw = f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
        return headers

    def _target(self, path: str, params: dict[str, str]) -> str:
        return self._base_path + path + ("?" + urllib.parse.urlencode(params) if params else "")

    def _api(self, path: str, params: dict[str, str]) -> Any:
        """GET an API path, retrying transient failures with exponential backoff; returns the
        envelope's `data`."""
        answer = self._fetch(self._target(path, params))
        return self._envelope(answer.body, answer.ctype, answer.status)

    def _fetch(self, target: str) -> Answer:
        """GET `target`, retrying transient failures with exponential backoff."""
        attempt = 0
        # After one request gave up, the next ones try once until one succeeds: a wrong URL
        # costs one round of retries, not one per query of the run.
        retries = 0 if self._gave_up else self.retries
        while True:
            try:
                answer = self._get_once(target)
                self._gave_up = False
                return answer
            except _Transient as exc:
                if attempt >= retries:
                    self._gave_up = True
                    raise PromError(f"{self.url}: {exc} (gave up after {attempt + 1} attempts)"
                                    ) from None
                wait = self.backoff * (2 ** attempt)
                if self.on_retry is not None:
                    self.on_retry(f"{self.url}: {exc}; retry {attempt + 1} of {retries} "
                                  f"in {wait:g} s")
                self.sleep(wait)
                attempt += 1

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        proxy = self.proxy
        if self._scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            if proxy is None:
                return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                   context=ctx)
            # TLS runs end to end inside the tunnel, checked against Prometheus' host name.
            conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=timeout,
                                               context=ctx)
            conn.set_tunnel(self._host, self._port or 443, headers=proxy.headers())
            return conn
        if proxy is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)

    def _request(self, target: str) -> tuple[str, dict[str, str]]:
        """The request line's target and the headers: through an http:// proxy, a plain-HTTP
        request names the whole URL and carries the proxy's credentials."""
        headers = self._headers()
        if self.proxy is None or self._scheme == "https":
            return target, headers
        return self._origin + target, {**headers, **self.proxy.headers()}

    def _via(self) -> str:
        return "" if self.proxy is None else f" through proxy {self.proxy.shown}"

    def _get_once(self, target: str) -> Answer:
        """One request under one deadline: `timeout` bounds connect + headers + the whole
        body, not each read, so a server that drips a byte every few seconds cannot hold the
        run. A watchdog shuts the socket down at the deadline; every read also waits at most
        the time left."""
        deadline = time.monotonic() + self.timeout
        conn = self._connection(self.timeout)
        expired = threading.Event()

        def cut() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(self.timeout, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            line, headers = self._request(target)
            conn.request("GET", line, headers=headers)
            resp = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                block = resp.read1(1 << 20)  # what has arrived, up to 1 MiB: fewer loops
                if not block:
                    if resp.length:  # read1 ends quietly where the Content-Length is unmet
                        raise http.client.IncompleteRead(b"".join(chunks), resp.length)
                    break
                size += len(block)
                if size > self.max_body:
                    raise PromError(f"{self.url}: answer larger than {self.max_body >> 20} MiB; "
                                    "meter a shorter --chunk")
                chunks.append(block)
            if expired.is_set():
                raise TimeoutError
            body = b"".join(chunks)
            status = resp.status
            ctype = resp.getheader("Content-Type", "") or ""
            location = resp.getheader("Location", "") or ""
        except PromError:
            raise
        except ssl.SSLCertVerificationError as exc:
            raise PromError(f"{self.url}: TLS error: {exc.verify_message or exc}") from None
        except ssl.SSLError as exc:
            if expired.is_set():
                raise _Transient(f"no complete answer within {self.timeout:g}s") from None
            raise PromError(f"{self.url}: TLS error: {exc}") from None
        except TimeoutError:
            raise _Transient(f"no complete answer within {self.timeout:g}s") from None
        except http.client.IncompleteRead as exc:
            if expired.is_set():
                raise _Transient(f"no complete answer within {self.timeout:g}s") from None
            raise _Transient(f"connection cut mid-answer ({len(exc.partial)} bytes read)"
                             ) from None
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            if expired.is_set():
                raise _Transient(f"no complete answer within {self.timeout:g}s") from None
            refused = _TUNNEL_REFUSED.match(str(exc))
            if refused and not 500 <= int(refused.group(1)) < 600:  # 403, 407: not worth a retry
                raise PromError(f"{self.url}: proxy {self.proxy.shown if self.proxy else ''} "
                                f"refused the tunnel: HTTP {refused.group(1)} "
                                f"{refused.group(2)}".rstrip() + _PROXY_HINT) from None
            if isinstance(exc, ConnectionRefusedError | socket.gaierror):
                raise _Transient(f"cannot connect{self._via()}: {_reason(exc)}") from None
            raise _Transient(f"connection failed{self._via()}: {_reason(exc)}") from None
        finally:
            watchdog.cancel()
            conn.close()
        if status == 407 and self.proxy is not None:
            raise PromError(f"{self.url}: proxy {self.proxy.shown} refused the request: HTTP "
                            "407 Proxy Authentication Required" + _PROXY_HINT)
        if status in RETRY_STATUSES:
            raise _Transient(f"HTTP {status} {http.client.responses.get(status, '')}".rstrip())
        if 300 <= status < 400 and location:
            # Not followed: credentials would go wherever the redirect points.
            where = redact(urllib.parse.urljoin(self.url + "/", location))
            raise PromError(f"{self.url}: HTTP {status}: redirected to {where}; give the URL "
                            "Prometheus answers at (redirects are not followed)")
        return Answer(body, ctype, status)

    def _envelope(self, body: bytes, ctype: str, status: int) -> Any:
        """Unwrap Prometheus's {"status": ..., "data": ...}; anything else is not Prometheus."""
        if status in (401, 403):
            raise PromError(f"{self.url}: HTTP {status}: not authorised (check the bearer token "
                            "or basic auth)")
        what = "HTML" if b"<html" in body[:512].lower() or "html" in ctype else None
        doc: Any = None
        try:
            doc = json.loads(body) if what is None else None
        except ValueError:
            what = "a non-JSON answer"
        if not isinstance(doc, dict) or "status" not in doc:
            what = what or "JSON without a Prometheus status field"
            raise PromError(f"{self.url}: does not look like the Prometheus HTTP API "
                            f"(HTTP {status}, got {what}); expected the server's base URL, "
                            "e.g. http://prometheus:9090")
        if doc["status"] != "success":
            raise PromError(f"{self.url}: Prometheus error ({doc.get('errorType', 'unknown')}): "
                            f"{doc.get('error', 'no message')}")
        return doc.get("data")


# http.client's message when a proxy answers CONNECT with anything but 200.
_TUNNEL_REFUSED = re.compile(r"Tunnel connection failed: (\d{3}) ?(.*)")
_PROXY_HINT = (" (check the proxy's user and password in $HTTPS_PROXY / $HTTP_PROXY, or list "
               "the host in $NO_PROXY)")


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


class _Transient(Exception):
    """A failure worth retrying (timeout, connection refused, 5xx)."""


def _range_params(promql: str, start: datetime | float, end: datetime | float,
                  step_s: float) -> dict[str, str]:
    """A range query's parameters, `end` sent 1 ms late: VictoriaMetrics (1.79.5) leaves out a
    series whose only samples in the range are at exactly `end` (a pod that starts on a chunk's
    last hour: its first sample would be billed by no chunk). The instants evaluated,
    start + k * step <= end, are the same on every store."""
    stop = end.timestamp() if isinstance(end, datetime) else float(end)
    return {"query": promql, "start": _ts(start), "end": _ts(stop + 0.001),
            "step": f"{step_s:g}"}


def _ts(value: datetime | float) -> str:
    if isinstance(value, datetime):
        return f"{value.timestamp():.3f}"
    return f"{float(value):.3f}"


def _result(data: Any, url: str, promql: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PromError(f"{url}: answer to {promql!r} has no data.result list")
    result: list[dict[str, Any]] = data["result"]
    return result
