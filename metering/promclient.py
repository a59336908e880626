"""A small Prometheus HTTP API client: instant and range queries with auth, TLS and retries.

Only the standard library: the metering job runs as a CronJob and should not need an HTTP stack
beyond urllib. Every failure is a PromError whose message names the URL and what went wrong.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Statuses worth another try: the server or a proxy in front of it is overloaded or restarting.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class PromError(Exception):
    """Prometheus could not answer, or the URL is not a Prometheus API."""


@dataclass
class PromClient:
    url: str
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    timeout: float = 30.0
    retries: int = 4
    backoff: float = 0.5  # first wait; doubles on every retry
    sleep: Callable[[float], None] = time.sleep
    queries: int = 0  # PromQL queries answered successfully (instant + range)
    _ssl: ssl.SSLContext | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PromError(f"{self.url}: expected an http:// or https:// URL of Prometheus")
        if self.ca_file is not None:
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise PromError(f"{self.ca_file}: cannot load CA certificates: {exc}") from exc

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
        params = {"query": promql, "start": _ts(start), "end": _ts(end), "step": f"{step_s:g}"}
        data = self._api("/api/v1/query_range", params)
        self.queries += 1
        return _result(data, self.url, promql)

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
        headers = {"Accept": "application/json", "User-Agent": "gpu-ledger-meter"}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.basic_auth is not None:
            raw = f"{self.basic_auth[0]}:{self.basic_auth[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
        return headers

    def _api(self, path: str, params: dict[str, str]) -> Any:
        """GET an API path, retrying transient failures with exponential backoff; returns the
        envelope's `data`."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        attempt = 0
        while True:
            try:
                return self._get_once(url)
            except _Transient as exc:
                if attempt >= self.retries:
                    raise PromError(f"{self.url}: {exc} (gave up after {attempt + 1} attempts)"
                                    ) from None
                self.sleep(self.backoff * (2 ** attempt))
                attempt += 1

    def _get_once(self, url: str) -> Any:
        req = urllib.request.Request(url, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                body = resp.read()
                ctype = resp.headers.get("Content-Type", "")
                status = resp.status
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if exc.code in RETRY_STATUSES:
                raise _Transient(f"HTTP {exc.code} {exc.reason}") from None
            ctype = exc.headers.get("Content-Type", "") if exc.headers else ""
            status = exc.code
        except TimeoutError:
            raise _Transient(f"no answer within {self.timeout:g}s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError):
                raise PromError(f"{self.url}: TLS error: {exc.reason}") from None
            if isinstance(exc.reason, TimeoutError):
                raise _Transient(f"no answer within {self.timeout:g}s") from None
            raise _Transient(f"cannot connect: {exc.reason}") from None
        except (ConnectionError, OSError) as exc:  # reset mid-body, etc.
            raise _Transient(f"connection failed: {exc}") from None
        return self._envelope(body, ctype, status)

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


class _Transient(Exception):
    """A failure worth retrying (timeout, connection refused, 5xx)."""


def _ts(value: datetime | float) -> str:
    if isinstance(value, datetime):
        return f"{value.timestamp():.3f}"
    return f"{float(value):.3f}"


def _result(data: Any, url: str, promql: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PromError(f"{url}: answer to {promql!r} has no data.result list")
    result: list[dict[str, Any]] = data["result"]
    return result
