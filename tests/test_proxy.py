"""Metering behind an HTTP proxy (HTTPS_PROXY / HTTP_PROXY / NO_PROXY), through a real proxy
server on a loopback port (tests/httpproxy.py). The Prometheus URLs use a name under
`.invalid`, which never resolves: only the proxy, which maps it to 127.0.0.1, can reach it, so a
run that ignored the proxy fails instead of passing by accident."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import conftest_prom
import pytest
from conftest_prom import expected_facts, fact_rows
from httpproxy import http_proxy
from pki import make_ca, make_leaf
from promtools import free_port, proxy_to

from metering.cli_meter import main
from metering.db import connect
from metering.promclient import PromClient, PromError
from metering.proxy import Proxy, ProxyError, proxy_for

fleet_prom_url = conftest_prom.fleet_prom_url
fleet_om_file = conftest_prom.fleet_om_file
HOST = "prometheus.proxy-test.invalid"
DAY = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "24", "--retries", "1",
       "--retry-delay", "0"]
def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@contextmanager
def https_prometheus(target: str, pki: Path) -> Iterator[int]:
    """An https:// front for the real Prometheus at `target`, with a certificate for HOST
    only; yields its port."""
    make_ca(pki, "ca")
    make_leaf(pki, "server", "ca", f"DNS:{HOST}", "serverAuth")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, ctype, body = proxy_to(target, self.path, dict(self.headers.items()))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _facts(db: Path) -> list[tuple[object, ...]]:
    con = connect(db, read_only=True)
    try:
        return fact_rows(con, "device_hours")
    finally:
        con.close()


def _day(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [r for r in rows if str(r[0]).startswith("2026-10-05")]


def test_http_prometheus_through_http_proxy(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://{HOST}:{_port(fleet_prom_url)}"
    db = tmp_path / "m.duckdb"
    assert main(["--prometheus", url, *DAY, "--db", str(db), "-q"]) == 5  # no route without it
    assert "cannot connect" in capsys.readouterr().err
    with http_proxy({HOST: "127.0.0.1"}, credentials=("meter", "pw")) as (proxy, log):
        monkeypatch.setenv("HTTP_PROXY", proxy)  # no credentials: refused, not retried
        rc = main(["--prometheus", url, *DAY, "--db", str(db), "-q"])
        err = capsys.readouterr().err
        assert rc == 5 and err.count("\n") == 1, err
        assert f"proxy {proxy} refused the request: HTTP 407" in err
        log.requests.clear()
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://meter:pw@"))
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")  # not for http:// targets
        assert main(["--prometheus", url, *DAY, "--db", str(db)]) == 0, \
            capsys.readouterr().err
        err = capsys.readouterr().err
        assert "meter: connecting through proxy http://meter:***@127.0.0.1:" in err
        assert "($HTTP_PROXY;" in err and ":pw@" not in err
    assert _facts(db) == _day(expected_facts()["device_hours"])
    # absolute-URI requests, every one for the Prometheus host
    assert log.requests and all(m == "GET" and t.startswith(f"{url}/api/v1/")
                                for m, t in log.requests), log.requests[:3]


def test_https_prometheus_through_a_connect_tunnel_with_proxy_credentials(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """TLS runs end to end: the certificate names only HOST and is checked against it (the
    proxy sees CONNECT, never the queries); the proxy's password is sent, never printed."""
    with https_prometheus(fleet_prom_url, tmp_path) as port, \
            http_proxy({HOST: "127.0.0.1"}, credentials=("meter", "s3cr:et")) as (proxy, log):
        url = f"https://{HOST}:{port}"
        ca = str(tmp_path / "ca.crt")
        authed = proxy.replace("http://", "http://meter:s3cr%3Aet@")
        monkeypatch.setenv("https_proxy", authed)
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")  # lower case wins
        db = tmp_path / "m.duckdb"
        assert main(["--prometheus", url, "--ca-file", ca, *DAY, "--db", str(db)]) == 0, \
            capsys.readouterr().err
        assert _facts(db) == _day(expected_facts()["device_hours"])
        assert "s3cr" not in capsys.readouterr().err
        assert log.requests and set(log.requests) == {("CONNECT", f"{HOST}:{port}")}
        assert log.refused == 0

        # A wrong password: one line, no password; a 407 is not retried.
        monkeypatch.setenv("https_proxy", proxy.replace("http://", "http://meter:wrong@"))
        rc = main(["--prometheus", url, "--ca-file", ca, *DAY, "--db", str(db), "-q"])
        err = capsys.readouterr().err
        assert rc == 5 and err.count("\n") == 1, err
        assert "407" in err and "proxy http://meter:***@127.0.0.1" in err and "wrong" not in err
        refused = log.refused
        with pytest.raises(PromError, match="refused the tunnel: HTTP 407"):
            PromClient(url, ca_file=ca, retries=3, sleep=lambda s: None).query("up")
        assert log.refused == refused + 1


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1:{port}", "*",
                                      "10.0.0.0/8, 127.0.0.0/8"])
def test_no_proxy_connects_directly(fleet_prom_url: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, no_proxy: str) -> None:
    with http_proxy() as (proxy, log):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", no_proxy.format(port=_port(fleet_prom_url)))
        db = tmp_path / "m.duckdb"
        assert main(["--prometheus", fleet_prom_url, *DAY, "--db", str(db), "-q"]) == 0
    assert log.requests == []
    assert _facts(db) == _day(expected_facts()["device_hours"])


def test_a_proxy_that_is_down_is_named(fleet_prom_url: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    monkeypatch.setenv("HTTP_PROXY", f"127.0.0.1:{port}")  # no scheme: http://
    rc = main(["--prometheus", fleet_prom_url, *DAY, "--db", str(tmp_path / "m.duckdb"), "-q"])
    err = capsys.readouterr().err
    assert rc == 5 and err.count("\n") == 1, err
    assert f"cannot connect through proxy http://127.0.0.1:{port}" in err


@pytest.mark.parametrize("value", ["socks5://u:pw@proxy:1080", "https://u:pw@proxy:3128"])
def test_an_unsupported_proxy_is_refused_in_one_line(
        fleet_prom_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], value: str) -> None:
    monkeypatch.setenv("ALL_PROXY", value)
    db = tmp_path / "m.duckdb"
    rc = main(["--prometheus", fleet_prom_url, *DAY, "--db", str(db), "-q"])
    err = capsys.readouterr().err
    assert rc == 5 and err.count("\n") == 1, err
    assert "$ALL_PROXY=" in err and "only http:// proxies" in err and "pw" not in err
    assert not db.exists()


def _proxy(scheme: str, host: str, port: int | None, env: dict[str, str]) -> Proxy:
    found = proxy_for(scheme, host, port, env)
    assert found is not None
    return found


def test_which_variable_applies() -> None:
    env = {"HTTPS_PROXY": "http://s:1", "http_proxy": "http://h:2", "ALL_PROXY": "http://a:3",
           "NO_PROXY": ".corp.example, 192.168.0.0/16"}
    assert _proxy("https", "prom", 9090, env).port == 1
    assert _proxy("http", "prom", 9090, env).host == "h"
    assert proxy_for("https", "prom.corp.example", None, env) is None
    assert proxy_for("http", "192.168.4.2", 9090, env) is None
    assert _proxy("http", "192.169.4.2", 9090, env).port == 2
    assert _proxy("https", "prom", None, {"ALL_PROXY": "http://a:3"}).host == "a"
    assert _proxy("http", "prom", None, {"HTTP_PROXY": "proxy"}).port == 80
    assert proxy_for("https", "prom", None, {}) is None
    for no_proxy, host, port, bypassed in [
            ("corp.example", "prom.corp.example", 9090, True),
            ("corp.example", "prom.notcorp.example", 9090, False),
            ("prom:9090", "prom", 9090, True), ("prom:9091", "prom", 9090, False),
            ("PROM.", "prom", None, True), ("::1", "::1", 9090, True),
            ("[::1]:9090", "::1", 9090, True), ("fd00::/8", "fd12::5", 9090, True),
            ("1.2.3.4", "11.2.3.4", None, False), ("", "prom", None, False)]:
        found = proxy_for("http", host, port, {"HTTP_PROXY": "http://p:1", "no_proxy": no_proxy})
        assert (found is None) == bypassed, (no_proxy, host, port)
    with pytest.raises(ProxyError, match="expected a proxy URL"):
        proxy_for("http", "prom", None, {"HTTP_PROXY": "http://proxy:port"})
