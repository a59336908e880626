"""The Prometheus HTTP client against loopback servers that misbehave on purpose."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from promtools import http_server

from metering.promclient import PromClient, PromError

OK = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"uuid": "GPU-1"}, "values": [[1791162000, "60"]]}]}}).encode()
JSON = "application/json"


def client(url: str, **kw: object) -> PromClient:
    waits: list[float] = []
    c = PromClient(url, sleep=waits.append, **kw)  # type: ignore[arg-type]
    c.waits = waits  # type: ignore[attr-defined]
    return c


def test_retries_5xx_with_exponential_backoff_then_succeeds() -> None:
    calls: list[str] = []

    def respond(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        calls.append(path)
        return (503, "text/plain", b"busy") if len(calls) <= 3 else (200, JSON, OK)

    with http_server(respond) as url:
        c = client(url, retries=4, backoff=0.5)
        result = c.query_range("count_over_time(gpu_up[1h])", 1791158400, 1791162000, 3600)
    assert result[0]["metric"] == {"uuid": "GPU-1"}
    assert len(calls) == 4 and c.waits == [0.5, 1.0, 2.0]  # type: ignore[attr-defined]
    assert calls[0].startswith("/api/v1/query_range?") and "step=3600" in calls[0]
    assert c.queries == 1


def test_always_5xx_gives_a_clear_error_after_the_retries() -> None:
    with http_server(lambda p, h: (503, "text/plain", b"down")) as url:
        c = client(url, retries=2)
        with pytest.raises(PromError, match=r"HTTP 503 .*gave up after 3 attempts") as exc:
            c.query("up")
    assert url in str(exc.value) and c.queries == 0


def test_html_is_not_prometheus() -> None:
    page = b"<!doctype html><html><body>Grafana</body></html>"
    with http_server(lambda p, h: (200, "text/html; charset=utf-8", page)) as url, \
            pytest.raises(PromError, match=r"does not look like the Prometheus HTTP API.*HTML"):
        client(url).query("up")


def test_json_without_status_is_not_prometheus() -> None:
    with http_server(lambda p, h: (200, JSON, b'{"hello": "world"}')) as url, \
            pytest.raises(PromError, match="JSON without a Prometheus status"):
        client(url).query("up")


def test_prometheus_error_is_reported_with_its_message() -> None:
    body = json.dumps({"status": "error", "errorType": "bad_data",
                       "error": "parse error at char 5"}).encode()
    with http_server(lambda p, h: (400, JSON, body)) as url:
        c = client(url)
        with pytest.raises(PromError, match=r"\(bad_data\): parse error at char 5"):
            c.query("up{")
    assert c.waits == []  # type: ignore[attr-defined]  # a 400 is not retried


def test_timeout_is_retried_then_reported() -> None:
    def slow(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        time.sleep(1.0)
        return 200, JSON, OK

    with http_server(slow) as url:
        c = client(url, timeout=0.2, retries=1)
        with pytest.raises(PromError, match=r"no complete answer within 0.2s .*2 attempts"):
            c.query("up")
    assert c.waits == [0.5]  # type: ignore[attr-defined]


def test_connection_refused_is_an_error_naming_the_url() -> None:
    with http_server(lambda p, h: (200, JSON, OK)) as url:
        pass  # closed: nothing listens on that port now
    with pytest.raises(PromError, match="cannot connect"):
        client(url, retries=1).query("up")


def test_bearer_token_and_basic_auth_headers() -> None:
    seen: list[str] = []

    def respond(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        seen.append(headers.get("Authorization", ""))
        return 200, JSON, OK

    with http_server(respond) as url:
        client(url, bearer_token="s3cret").query("up")
        client(url, basic_auth=("meter", "pa:ss")).query("up")
    assert seen[0] == "Bearer s3cret"
    assert base64.b64decode(seen[1].removeprefix("Basic ")) == b"meter:pa:ss"


def test_unauthorised_is_not_retried() -> None:
    with http_server(lambda p, h: (401, "text/plain", b"Unauthorized")) as url:
        c = client(url)
        with pytest.raises(PromError, match="HTTP 401: not authorised"):
            c.query("up")
    assert c.waits == []  # type: ignore[attr-defined]


def test_bad_url_and_ca_file(tmp_path: object) -> None:
    with pytest.raises(PromError, match="expected an http:// or https:// URL"):
        PromClient("prometheus:9090")
    with pytest.raises(PromError, match="cannot load CA certificates"):
        PromClient("https://127.0.0.1:1", ca_file="/nonexistent/ca.pem")


@pytest.mark.parametrize("body", [OK[:40], b"abc", b"", b"404 page not found"],
                         ids=["truncated-json", "text", "empty", "wrong-route"])
def test_non_json_answer_is_one_line_error(body: bytes) -> None:
    """Issue 13: truncated JSON or a wrong route gave UnboundLocalError."""
    with http_server(lambda p, h: (200, JSON, body)) as url, \
            pytest.raises(PromError, match="does not look like the Prometheus HTTP API") as exc:
        client(url).query("up")
    assert "\n" not in str(exc.value)


def test_non_numeric_and_non_finite_values_are_dropped_and_counted() -> None:
    """"abc", null, NaN and +Inf values are never priced: 4 of the 6 points are dropped."""
    from datetime import UTC, datetime

    from metering.facts import signal_table
    from metering.period import Period
    from metering.prometheus_source import PrometheusSource

    values = [[1791162000, "abc"], [1791165600, None], [1791169200, "NaN"],
              [1791172800, "+Inf"], [1791176400, "1"], [1791180000, "0.5"]]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"node": "n", "uuid": "GPU-1"}, "values": values}]}}).encode()
    with http_server(lambda p, h: (200, JSON, body)) as url:
        src = PrometheusSource(client(url))
        src._window = "1h"
        start = datetime(2026, 10, 5, tzinfo=UTC)
        signals = {s.name: signal_table(s, m)
                   for group in src.fetch(Period(start, start.replace(hour=6)))
                   for s, m in group}
    assert src.dropped == 4 * len(signals)
    assert all(t.num_rows == 2 for t in signals.values())
    # counted against the hours they belong to (evaluation at T is the hour T-1h)
    assert sorted(src.screened.dropped) == [1791158400, 1791162000, 1791165600, 1791169200]


def test_out_of_range_values_are_dropped_and_counted() -> None:
    """A count of 1e308 and a ratio of 5 cannot come from the exporter: dropped, counted."""
    from datetime import UTC, datetime

    from metering.facts import signal_table
    from metering.period import Period
    from metering.prometheus_source import PrometheusSource
    from metering.signals import SIGNALS

    def respond(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        v = "1e308" if query.startswith("count_over_time") else \
            "5" if "ratio" in query and query.startswith("sum_over_time") else "0.5"
        return 200, JSON, json.dumps({"status": "success", "data": {
            "resultType": "matrix", "result": [{"metric": {"node": "n", "uuid": "G"},
                                                "values": [[1791162000, v]]}]}}).encode()

    with http_server(respond) as url:
        src = PrometheusSource(client(url))
        src._window = "1h"
        start = datetime(2026, 10, 5, tzinfo=UTC)
        signals = {s.name: signal_table(s, m)
                   for group in src.fetch(Period(start, start.replace(hour=6)))
                   for s, m in group}
    counts = [s.name for s in SIGNALS if s.func == "count"]
    # a sum of 5 ratio samples is plausible (5 samples of 1): only counts are out of range
    assert src.dropped == len(counts)
    assert all(signals[c].num_rows == 0 for c in counts)
    assert signals["util_sum"].num_rows == 1


def test_ratio_maxima_above_one_are_dropped() -> None:
    import numpy as np

    from metering.signals import SIGNALS, plausible

    spec = next(s for s in SIGNALS if s.family == "gpu_container_core_fraction")
    assert plausible(spec, np.array([0.0, 1.0, 1.5, np.nan, -0.1])).tolist() == \
        [True, True, False, False, False]


@contextlib.contextmanager
def raw_server(handle: Callable[[socket.socket, int], None]) -> Iterator[str]:
    """A loopback TCP server whose connections are handed to `handle(conn, n)` (n counts
    connections from 0): for answers no HTTP server library would send."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        n = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):
                    handle(conn, n)
            n += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def test_dripping_server_cannot_hold_the_run_past_the_deadline() -> None:
    """Issue 13: --timeout applied per read, so a byte every 2 s hung the run. One deadline per
    request: 2 attempts x 1 s deadline end in about 2 s, not 2 s x body length."""
    def drip(conn: socket.socket, n: int) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(OK))
        for byte in OK:
            conn.sendall(bytes([byte]))
            time.sleep(2)

    with raw_server(drip) as url:
        c = client(url, timeout=1.0, retries=1)
        t0 = time.monotonic()
        with pytest.raises(PromError, match=r"no complete answer within 1s .*2 attempts"):
            c.query("up")
        took = time.monotonic() - t0
    assert took < 5, took


def test_dripping_headers_are_under_the_same_deadline() -> None:
    def drip(conn: socket.socket, n: int) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
            conn.sendall(bytes([byte]))
            time.sleep(0.5)

    with raw_server(drip) as url:
        t0 = time.monotonic()
        with pytest.raises(PromError, match="no complete answer within 1s"):
            client(url, timeout=1.0, retries=0).query("up")
    assert time.monotonic() - t0 < 4


def test_connection_cut_mid_body_is_retried() -> None:
    """Issue 13: IncompleteRead was not retried. The first answer stops after half its body;
    the retry gets the whole answer."""
    def cut_first(conn: socket.socket, n: int) -> None:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(OK))
        conn.sendall(head + (OK[: len(OK) // 2] if n == 0 else OK))

    with raw_server(cut_first) as url:
        c = client(url, retries=2)
        result = c.query("up")
    assert result[0]["metric"] == {"uuid": "GPU-1"}
    assert c.waits == [0.5]  # type: ignore[attr-defined]


def test_connection_cut_every_time_is_one_line_error() -> None:
    def cut(conn: socket.socket, n: int) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"status\"")

    with raw_server(cut) as url, \
            pytest.raises(PromError, match=r"connection cut mid-answer .*3 attempts") as exc:
        client(url, retries=2).query("up")
    assert "\n" not in str(exc.value)


def test_credentials_in_the_url_become_basic_auth_and_are_never_shown() -> None:
    seen: list[str] = []

    def respond(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        seen.append(headers.get("Authorization", ""))
        return (200, JSON, OK) if len(seen) == 1 else (401, "text/plain", b"no")

    with http_server(respond) as url:
        with_creds = url.replace("http://", "http://meter:p%40ss-Hunter2@")
        c = client(with_creds)
        assert "Hunter2" not in c.url and "Hunter2" not in repr(c)
        c.query("up")
        with pytest.raises(PromError) as exc:
            c.query("up")
    assert base64.b64decode(seen[0].removeprefix("Basic ")) == b"meter:p@ss-Hunter2"
    assert "Hunter2" not in str(exc.value)
    with pytest.raises(PromError, match="cannot connect") as exc:
        client(with_creds, retries=0).query("up")  # the server is gone
    assert "Hunter2" not in str(exc.value)
    for bad in ("ftp://meter:Hunter2@host", "http://meter:Hunter2@host:99999"):
        with pytest.raises(PromError) as exc:
            PromClient(bad)
        assert "Hunter2" not in str(exc.value) and "***" in str(exc.value)
    with pytest.raises(PromError, match="expected one of them") as exc:
        PromClient("http://meter:Hunter2@host", bearer_token="t")
    assert "Hunter2" not in str(exc.value)


def test_meter_never_prints_the_password(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`meter --prometheus http://user:pass@host` printed the password to stderr."""
    from metering.cli_meter import main

    with http_server(lambda p, h: (200, JSON, OK)) as url:
        pass  # nothing listens there now
    rc = main(["--prometheus", url.replace("http://", "http://meter:Hunter2@"), "--from",
               "2026-10-05T00:00", "--to", "2026-10-05T01:00", "--db",
               str(tmp_path / "m.duckdb"), "--retries", "0", "-v"])
    err = capsys.readouterr().err
    assert rc == 5 and "cannot connect" in err
    assert "Hunter2" not in err and "meter@" not in err.replace("meter:***@", "")


def test_redirects_are_named_not_followed() -> None:
    """A proxy redirecting elsewhere would receive the credentials: one-line error instead."""
    answer = (b"HTTP/1.1 302 Found\r\nLocation: https://u:Hunter2@elsewhere/prom/\r\n"
              b"Content-Length: 0\r\n\r\n")
    with raw_server(lambda conn, n: conn.sendall(answer)) as url, \
            pytest.raises(PromError, match=r"HTTP 302: redirected to https://u:\*\*\*@"
                                           r"elsewhere/prom/") as exc:
        client(url, retries=0).query("up")
    assert "Hunter2" not in str(exc.value) and "\n" not in str(exc.value)
