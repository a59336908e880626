"""The exporter's HTTP server and web config, over real sockets on loopback."""

from __future__ import annotations

import asyncio.base_events
import base64
import gzip
import http.client
import logging
import os
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from exporter import __version__
from exporter.errors import ConfigError
from exporter.web import OPENMETRICS_TYPE, TEXT_TYPE, WebServer, start_server
from exporter.webconfig import WebConfig, load_web_config

TEXT_BODY = b"# TYPE gpu_up gauge\ngpu_up{gpu=\"0\"} 1\n"
OM_BODY = b"# TYPE gpu_up gauge\ngpu_up{gpu=\"0\"} 1\n# EOF\n"


class FakeSource:
    def __init__(self) -> None:
        self.ok, self.reason = True, ""

    def exposition(self, openmetrics: bool, gzipped: bool) -> bytes:
        body = OM_BODY if openmetrics else TEXT_BODY
        return gzip.compress(body) if gzipped else body

    def health(self) -> tuple[bool, str]:
        return self.ok, self.reason


@contextmanager
def serving(cfg: WebConfig | None = None, host: str = "127.0.0.1",
            source: FakeSource | None = None) -> Iterator[WebServer]:
    server = start_server(source or FakeSource(), host, 0, cfg)
    try:
        yield server
    finally:
        server.shutdown()


def fetch(server: WebServer, path: str = "/metrics", method: str = "GET",
          headers: dict[str, str] | None = None, ctx: ssl.SSLContext | None = None,
          body: bytes | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=ctx)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


# --- certificates, made with the openssl CLI -----------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, ca: str, san: str, usage: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(
        f"basicConstraints=CA:FALSE\nsubjectAltName={san}\nextendedKeyUsage={usage}\n"
        "keyUsage=critical,digitalSignature\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
             cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _leaf(d, "server", "ca", "IP:127.0.0.1,IP:::1,DNS:localhost", "serverAuth")
    _leaf(d, "server2", "ca", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(d, "client", "ca", "DNS:scraper", "clientAuth")
    _leaf(d, "rogue", "rogue-ca", "DNS:scraper", "clientAuth")
    return d


def client_ctx(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web-config.yml"
    path.write_text(text)
    return path


def tls_config(tmp_path: Path, pki: Path, extra: str = "") -> WebConfig:
    return load_web_config(write_config(tmp_path, (
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n" + extra)))


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


# --- /metrics ------------------------------------------------------------------------------

PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


@pytest.mark.parametrize(("accept", "openmetrics"), [
    (None, False),
    ("application/openmetrics-text; version=1.0.0", True),
    ("application/openmetrics-text", True),
    (PROMETHEUS_3_ACCEPT, True),
    ("application/openmetrics-text; version=0.0.1", False),
    ("application/openmetrics-text;version=1.0.0;q=0", False),
    ("text/plain;q=1, application/openmetrics-text;q=0.5", False),
    ("text/plain;version=0.0.4", False),
    ("*/*", False),
])
def test_metrics_content_negotiation(accept: str | None, openmetrics: bool) -> None:
    with serving() as server:
        status, headers, body = fetch(server, headers={"Accept": accept} if accept else {})
    assert status == 200
    assert headers["Content-Type"] == (OPENMETRICS_TYPE if openmetrics else TEXT_TYPE)
    assert body == (OM_BODY if openmetrics else TEXT_BODY)
    assert int(headers["Content-Length"]) == len(body)
    assert headers["Content-Encoding"] is None


@pytest.mark.parametrize(("accept_encoding", "gzipped"), [
    ("gzip", True),
    ("br, gzip;q=0.5", True),
    ("*", True),
    ("gzip;q=0", False),
    ("gzip;q=0, *", False),
    ("identity", False),
    ("deflate, br", False),
])
def test_metrics_gzip_respects_q_values(accept_encoding: str, gzipped: bool) -> None:
    with serving() as server:
        status, headers, body = fetch(server, headers={"Accept-Encoding": accept_encoding})
    assert status == 200
    assert int(headers["Content-Length"]) == len(body)
    if gzipped:
        assert headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(body) == TEXT_BODY
    else:
        assert headers["Content-Encoding"] is None
        assert body == TEXT_BODY


def test_head_sends_headers_without_body() -> None:
    with serving() as server:
        _, get_headers, get_body = fetch(server, headers={"Accept-Encoding": "gzip"})
        status, headers, body = fetch(server, method="HEAD", headers={"Accept-Encoding": "gzip"})
    assert status == 200
    assert body == b""
    assert headers["Content-Length"] == get_headers["Content-Length"] == str(len(get_body))
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == TEXT_TYPE
    assert headers["Server"] == f"gpu-ledger-exporter/{__version__}"


def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    with serving() as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            for path in ("/metrics", "/healthz", "/metrics"):
                conn.request("GET", path)
                resp = conn.getresponse()
                assert resp.status == 200
                resp.read()
        finally:
            conn.close()


def test_unknown_path_is_404_and_other_methods_405() -> None:
    with serving() as server:
        assert fetch(server, "/nope")[0] == 404
        assert fetch(server, "/metrics/extra")[0] == 404
        status, headers, _ = fetch(server, method="POST", body=b"x=1")
        assert status == 405
        assert headers["Allow"] == "GET, HEAD"
        assert fetch(server, "/healthz", method="DELETE")[0] == 405
        # Query strings do not change the route.
        assert fetch(server, "/metrics?debug=1")[0] == 200


def test_healthz_reports_source_health() -> None:
    source = FakeSource()
    with serving(source=source) as server:
        status, headers, body = fetch(server, "/healthz")
        assert (status, body) == (200, b"ok")
        assert headers["Content-Type"].startswith("text/plain")
        source.ok, source.reason = False, "NVML init failed: driver not loaded"
        status, _, body = fetch(server, "/healthz")
        assert (status, body) == (503, b"NVML init failed: driver not loaded")


def test_landing_page_links_endpoints_and_version() -> None:
    with serving() as server:
        status, headers, body = fetch(server, "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    page = body.decode()
    assert 'href="metrics"' in page and 'href="healthz"' in page
    assert __version__ in page


def test_render_failure_is_500_not_a_dropped_connection() -> None:
    class Broken(FakeSource):
        def exposition(self, openmetrics: bool, gzipped: bool) -> bytes:
            raise RuntimeError("boom")

    with serving(source=Broken()) as server:
        status, _, body = fetch(server)
    assert status == 500
    assert b"boom" not in body


def test_requests_are_not_logged_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with serving() as server:
        fetch(server)
        fetch(server, "/nope")
        # A client that connects and drops must not print a traceback either.
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        fetch(server, "/healthz")
    out, err = capfd.readouterr()
    assert err == ""
    assert out == ""


def test_a_stalled_client_does_not_block_others() -> None:
    with serving() as server:
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finish
            assert fetch(server)[0] == 200
        finally:
            stalled.close()


def test_port_url_and_shutdown_closes_socket() -> None:
    server = start_server(FakeSource(), "127.0.0.1", 0, None)
    port = server.port
    assert port > 0
    assert server.url == f"http://127.0.0.1:{port}/"
    assert fetch(server)[0] == 200
    server.shutdown()
    server.shutdown()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_ipv6_wildcard_serves_ipv6_and_ipv4() -> None:
    with serving(host="::") as server:
        assert server.url == f"http://[::1]:{server.port}/"
        conn = http.client.HTTPConnection("::1", server.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
        finally:
            conn.close()
        assert fetch(server, "/healthz")[0] == 200  # 127.0.0.1 on the same socket


def test_extra_headers_from_config(tmp_path: Path) -> None:
    cfg = load_web_config(write_config(tmp_path, (
        "http_server_config:\n"
        "  http2: false\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
        "    Strict-Transport-Security: max-age=31536000\n"
        "    X-XSS-Protection: ''\n")))
    with serving(cfg) as server:
        for path in ("/metrics", "/nope"):
            _, headers, _ = fetch(server, path)
            assert headers["X-Frame-Options"] == "deny"
            assert headers["Strict-Transport-Security"] == "max-age=31536000"
            assert headers["X-XSS-Protection"] is None  # blank means unset


# --- TLS -----------------------------------------------------------------------------------


def test_tls_serves_https_and_refuses_plain_http(tmp_path: Path, pki: Path) -> None:
    with serving(tls_config(tmp_path, pki)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        status, headers, body = fetch(server, ctx=client_ctx(pki))
        assert (status, body) == (200, TEXT_BODY)
        assert headers["Content-Type"] == TEXT_TYPE
        with pytest.raises((http.client.HTTPException, OSError)):
            fetch(server)
        # The plain-HTTP attempt must not have hurt the server.
        assert fetch(server, "/healthz", ctx=client_ctx(pki))[0] == 200


def test_tls_handshake_stall_does_not_block_others(tmp_path: Path, pki: Path) -> None:
    with serving(tls_config(tmp_path, pki)) as server:
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            assert fetch(server, ctx=client_ctx(pki))[0] == 200
        finally:
            stalled.close()


def test_tls_min_version_is_enforced(tmp_path: Path, pki: Path) -> None:
    with serving(tls_config(tmp_path, pki, "  min_version: TLS13\n")) as server:
        old = client_ctx(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            fetch(server, ctx=old)
        assert fetch(server, ctx=client_ctx(pki))[0] == 200


def test_require_and_verify_client_cert(tmp_path: Path, pki: Path) -> None:
    cfg = tls_config(tmp_path, pki, (
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {pki / 'ca.crt'}\n"))
    with serving(cfg) as server:
        # TLS 1.3 reports the rejection on the first read rather than in the handshake.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            fetch(server, ctx=client_ctx(pki))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            fetch(server, ctx=client_ctx(pki, "rogue"))
        status, _, body = fetch(server, ctx=client_ctx(pki, "client"))
        assert (status, body) == (200, TEXT_BODY)


# CPython's StreamWriter.__del__ reads the transport that start_tls left as None: its own
# complaint when the writer is collected, not the server's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_gone_as_its_tls_handshake_ends_is_dropped_quietly(
        tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """loop.start_tls returns None where the connection was lost while the handshake
    completed (CPython issue 105993: by design), and StreamWriter.start_tls keeps that None
    as the writer's transport. Such a connection is dropped without a logged traceback, and
    the next client is served."""
    real = asyncio.base_events.BaseEventLoop.start_tls
    calls: list[int] = []

    async def lost_first(self: asyncio.base_events.BaseEventLoop, transport: Any,
                         *args: Any, **kwargs: Any) -> Any:
        tls = await real(self, transport, *args, **kwargs)
        calls.append(1)
        if len(calls) > 1:
            return tls
        tls.abort()  # the client gone: what start_tls then returns
        return None

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "start_tls", lost_first)
    caplog.set_level(logging.DEBUG)
    with serving(tls_config(tmp_path, pki)) as server:
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            fetch(server, ctx=client_ctx(pki))
        status, _, body = fetch(server, ctx=client_ctx(pki))
    assert (status, body) == (200, TEXT_BODY) and len(calls) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in caplog.records]
    assert any("closed as its TLS handshake ended" in r.getMessage() for r in caplog.records)


def test_client_allowed_sans(tmp_path: Path, pki: Path) -> None:
    base = ("  client_auth_type: RequireAndVerifyClientCert\n"
            f"  client_ca_file: {pki / 'ca.crt'}\n"
            "  client_allowed_sans:\n")
    with serving(tls_config(tmp_path, pki, base + "    - scraper\n")) as server:
        assert fetch(server, ctx=client_ctx(pki, "client"))[0] == 200
    with serving(tls_config(tmp_path, pki, base + "    - someone-else\n")) as server, \
            pytest.raises((http.client.HTTPException, OSError)):
        fetch(server, ctx=client_ctx(pki, "client"))


def test_verify_client_cert_if_given(tmp_path: Path, pki: Path) -> None:
    cfg = tls_config(tmp_path, pki, (
        "  client_auth_type: VerifyClientCertIfGiven\n"
        f"  client_ca_file: {pki / 'ca.crt'}\n"))
    with serving(cfg) as server:
        assert fetch(server, ctx=client_ctx(pki))[0] == 200
        assert fetch(server, ctx=client_ctx(pki, "client"))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            fetch(server, ctx=client_ctx(pki, "rogue"))


def test_rotated_certificate_is_picked_up(tmp_path: Path, pki: Path) -> None:
    (tmp_path / "tls.crt").write_bytes((pki / "server.crt").read_bytes())
    (tmp_path / "tls.key").write_bytes((pki / "server.key").read_bytes())
    cfg = load_web_config(write_config(tmp_path, (
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")))  # relative paths

    def served_cn(server: WebServer) -> str:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                client_ctx(pki).wrap_socket(raw, server_hostname="localhost") as tls:
            cert = tls.getpeercert()
        assert cert is not None
        subject: Any = cert["subject"]  # ((("commonName", "server"),), ...)
        names = {name: value for rdn in subject for name, value in rdn}
        return str(names["commonName"])

    with serving(cfg) as server:
        assert served_cn(server) == "server"
        (tmp_path / "tls.key").write_bytes((pki / "server2.key").read_bytes())
        (tmp_path / "tls.crt").write_bytes((pki / "server2.crt").read_bytes())
        st = os.stat(tmp_path / "tls.crt")
        os.utime(tmp_path / "tls.crt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert served_cn(server) == "server2"
        # A broken rotation keeps the last good certificate.
        (tmp_path / "tls.key").write_text("garbage")
        assert served_cn(server) == "server2"


# --- basic auth ----------------------------------------------------------------------------


def test_basic_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alice = bcrypt.hashpw(b"wonderland", bcrypt.gensalt(rounds=4)).decode()
    bob = bcrypt.hashpw(b"builder", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    cfg = load_web_config(write_config(
        tmp_path, f"basic_auth_users:\n  alice: '{alice}'\n  bob: '{bob}'\n"))
    calls: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting_checkpw)  # the module web.py calls
    with serving(cfg) as server:
        for path in ("/metrics", "/healthz", "/", "/nope"):
            status, headers, _ = fetch(server, path)
            assert status == 401, path
            assert headers["WWW-Authenticate"] == 'Basic realm="gpu-ledger"'
        assert fetch(server, headers=basic("alice", "wrong"))[0] == 401
        assert fetch(server, headers=basic("mallory", "wonderland"))[0] == 401
        assert fetch(server, headers={"Authorization": "Basic !!notbase64"})[0] == 401
        assert fetch(server, headers={"Authorization": "Bearer abc"})[0] == 401
        assert fetch(server, method="HEAD")[0] == 401

        calls.clear()
        status, _, body = fetch(server, headers=basic("alice", "wonderland"))
        assert (status, body) == (200, TEXT_BODY)
        assert fetch(server, "/healthz", headers=basic("alice", "wonderland"))[0] == 200
        assert calls == [b"wonderland"]  # the second scrape hit the cache, not bcrypt
        # The cache never lets a different password through.
        assert fetch(server, headers=basic("alice", "wonderland2"))[0] == 401
        assert fetch(server, headers=basic("bob", "builder"))[0] == 200  # $2y$ hashes work


# --- config errors -------------------------------------------------------------------------


def _bad_configs(pki: Path) -> list[tuple[str, str]]:
    cert, key, ca = pki / "server.crt", pki / "server.key", pki / "ca.crt"
    tls = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    return [
        ("listen: 9400\n", "listen"),
        ("- a\n- b\n", ""),
        ("tls_server_config: [unclosed\n", ""),
        ("tls_server_config:\n  certfile: x\n", "tls_server_config.certfile"),
        (f"tls_server_config:\n  cert_file: {pki / 'missing.crt'}\n  key_file: {key}\n",
         "tls_server_config.cert_file"),
        (f"tls_server_config:\n  key_file: {key}\n", "tls_server_config.cert_file"),
        (f"tls_server_config:\n  cert_file: {cert}\n  key_file: {pki / 'server.ext'}\n",
         "tls_server_config.key_file"),
        (f"tls_server_config:\n  cert_file: {cert}\n  key_file: {pki / 'client.key'}\n",
         "tls_server_config.key_file"),
        (tls + "  client_auth_type: RequireCertPlease\n", "tls_server_config.client_auth_type"),
        (tls + "  client_auth_type: RequireAndVerifyClientCert\n",
         "tls_server_config.client_ca_file"),
        (tls + f"  client_ca_file: {ca}\n", "tls_server_config.client_auth_type"),
        (tls + "  client_auth_type: VerifyClientCertIfGiven\n"
         f"  client_ca_file: {key}\n", "tls_server_config.client_ca_file"),
        (tls + "  min_version: TLS9\n", "tls_server_config.min_version"),
        (tls + "  min_version: TLS13\n  max_version: TLS12\n", "tls_server_config.max_version"),
        (tls + "  prefer_server_cipher_suites: maybe\n",
         "tls_server_config.prefer_server_cipher_suites"),
        ("http_server_config:\n  headers:\n    Content-Type: text/html\n",
         "http_server_config.headers.Content-Type"),
        ("http_server_config:\n  http3: true\n", "http_server_config.http3"),
        ("basic_auth_users:\n  alice: wonderland\n", "basic_auth_users.alice"),
        ("basic_auth_users: [alice]\n", "basic_auth_users"),
    ]


def test_malformed_configs_name_the_key(tmp_path: Path, pki: Path) -> None:
    for text, key in _bad_configs(pki):
        path = write_config(tmp_path, text)
        with pytest.raises(ConfigError) as info:
            load_web_config(path)
        assert info.value.file == str(path), text
        assert info.value.key == key, text
        assert "wonderland" not in str(info.value)  # never echo a plain-text password


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, "basic_auth_users:\n  alice: 'x\n  bob: y\n")
    with pytest.raises(ConfigError, match=r"line \d+"):
        load_web_config(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_web_config(tmp_path / "absent.yml")
    assert info.value.file == str(tmp_path / "absent.yml")


def test_accepted_but_ignored_settings_warn(tmp_path: Path, pki: Path) -> None:
    cfg = tls_config(tmp_path, pki, (
        "  cipher_suites:\n"
        "    - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\n"
        "    - TLS_AES_128_GCM_SHA256\n"
        "    - TLS_RSA_WITH_RC4_128_SHA\n"
        "  prefer_server_cipher_suites: false\n"
        "  client_auth_type: RequestClientCert\n"))
    assert cfg.tls is not None
    assert cfg.tls.openssl_ciphers == "ECDHE-ECDSA-AES128-GCM-SHA256"
    assert any("TLS_RSA_WITH_RC4_128_SHA" in w for w in cfg.warnings)
    assert not any("TLS_AES_128_GCM_SHA256" in w for w in cfg.warnings)
    assert any("RequestClientCert" in w for w in cfg.warnings)
    # The mapped suite is really in force for TLS 1.2.
    with serving(cfg) as server:
        ctx = client_ctx(pki)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            cipher = tls.cipher()
        assert cipher is not None and cipher[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"


def test_empty_config_is_plain_http(tmp_path: Path) -> None:
    cfg = load_web_config(write_config(tmp_path, "# nothing\n"))
    assert cfg.tls is None and not cfg.basic_auth_users and cfg.headers == ()
    cfg = load_web_config(write_config(tmp_path, "tls_server_config: {}\n"))
    assert cfg.tls is None


def test_port_in_use_is_a_clear_oserror() -> None:
    with serving() as server, pytest.raises(OSError, match=rf"127\.0\.0\.1:{server.port}"):
        start_server(FakeSource(), "127.0.0.1", server.port, None)


def test_documented_example_config_loads(tmp_path: Path, pki: Path) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "web-config.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    for src, dst in (("server.crt", "tls.crt"), ("server.key", "tls.key"), ("ca.crt", "ca.crt")):
        (tmp_path / dst).write_bytes((pki / src).read_bytes())
    cfg = load_web_config(write_config(tmp_path, example))
    assert cfg.tls is not None and cfg.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert set(cfg.basic_auth_users) == {"prometheus"}
    assert ("X-Frame-Options", "deny") in cfg.headers
