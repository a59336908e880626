"""The exporter's web config file, in the Prometheus exporter-toolkit format.

Keys: `tls_server_config`, `http_server_config`, `basic_auth_users` (and `rate_limit`, accepted
and ignored). Everything is checked when the file is loaded, including that the certificates
and keys load into an SSL context, so a bad file stops the exporter at start-up with a
ConfigError naming the file, the key path and what was expected.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError

log = logging.getLogger(__name__)

# Go's crypto/tls names -> OpenSSL names, for the suites Go's tls.CipherSuites() offers (TLS 1.2).
GO_CIPHERS: dict[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
}
# TLS 1.3 suites are not configurable in Go either; naming them is accepted silently.
TLS13_CIPHERS = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                           "TLS_CHACHA20_POLY1305_SHA256"})

TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                     "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

# Python's ssl cannot ask for a client certificate without verifying it against a CA, so:
# RequestClientCert (Go: ask, never verify, never require) grants nothing and maps to no request;
# RequireAnyClientCert (Go: require, never verify) is enforced as require-and-verify, which is
# stricter, and therefore needs client_ca_file.
_VERIFY_MODES: dict[str, ssl.VerifyMode] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the server sets itself; a config file must not override them.
RESERVED_HEADERS = frozenset({"allow", "connection", "content-encoding", "content-length",
                              "content-type", "date", "server", "transfer-encoding", "vary",
                              "www-authenticate"})

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = ("cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file",
             "client_ca", "client_allowed_sans", "min_version", "max_version", "cipher_suites",
             "prefer_server_cipher_suites", "curve_preferences")
_HTTP_KEYS = ("http2", "headers")


@dataclass(frozen=True)
class TlsConfig:
    """Validated `tls_server_config`. File paths are absolute; inline PEM is kept as text."""

    source: str  # the web config file, for error messages
    cert_file: str | None
    key_file: str | None
    cert_pem: str | None
    key_pem: str | None
    client_auth_type: str
    client_ca_file: str | None
    client_ca_pem: str | None
    client_allowed_sans: tuple[str, ...]
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    openssl_ciphers: str | None  # None: OpenSSL's defaults
    prefer_server_cipher_suites: bool

    def watched_files(self) -> tuple[str, ...]:
        """Files whose change means the context must be rebuilt (certificate rotation)."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def build_context(self) -> ssl.SSLContext:
        """A server-side SSLContext; ConfigError if a certificate or key does not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.openssl_ciphers:
            try:
                ctx.set_ciphers(self.openssl_ciphers)
            except ssl.SSLError:
                log.warning("%s: tls_server_config.cipher_suites: none is available in this "
                            "OpenSSL build; using the defaults", self.source)
        self._load_chain(ctx)
        ctx.verify_mode = _VERIFY_MODES[self.client_auth_type]
        if self.client_ca_file or self.client_ca_pem:
            key = "client_ca_file" if self.client_ca_file else "client_ca"
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file, cadata=self.client_ca_pem)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(self.source, f"tls_server_config.{key}",
                                  "PEM CA certificates", _reason(exc)) from None
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        # load_cert_chain only reads files, so inline PEM goes through a private temp dir.
        with tempfile.TemporaryDirectory(prefix="gpu-ledger-tls-") as tmp:
            cert = self.cert_file or _write_private(Path(tmp, "cert.pem"), self.cert_pem)
            key = self.key_file or _write_private(Path(tmp, "key.pem"), self.key_pem)
            try:
                ctx.load_cert_chain(cert, key)
            except (ssl.SSLError, OSError) as exc:
                name = "key_file" if self.key_file else "key"
                raise ConfigError(self.source, f"tls_server_config.{name}",
                                  "a private key matching the certificate", _reason(exc)) from None


@dataclass(frozen=True)
class WebConfig:
    """A loaded web config. `WebConfig()` is plain HTTP, no auth, no extra headers."""

    path: str = ""
    tls: TlsConfig | None = None
    headers: tuple[tuple[str, str], ...] = ()
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # also logged at load time


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and validate a web config file; ConfigError on any problem."""
    file = str(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(file, "", "a readable UTF-8 web config file", _reason(exc)) from None
    from gpu_ledger import safeyaml  # yaml only when a web config is given

    try:
        doc = safeyaml.load(text, file)
    except safeyaml.YamlError as exc:
        raise ConfigError.from_yaml(exc) from None
    if doc is None:
        doc = {}
    top = _mapping(doc, file, "", "a mapping with keys " + ", ".join(_TOP_KEYS))
    _known_keys(top, _TOP_KEYS, file, "")
    warnings: list[str] = []
    base = Path(file).resolve().parent
    tls = _parse_tls(top.get("tls_server_config"), file, base, warnings)
    headers = _parse_http(top.get("http_server_config"), file, warnings)
    users = _parse_users(top.get("basic_auth_users"), file)
    if top.get("rate_limit") is not None:
        warnings.append("rate_limit is not supported and is ignored")
    for w in warnings:
        log.warning("%s: %s", file, w)
    return WebConfig(file, tls, headers, users, tuple(warnings))


def _parse_tls(raw: Any, file: str, base: Path, warnings: list[str]) -> TlsConfig | None:
    if raw is None:
        return None
    tls = _mapping(raw, file, "tls_server_config", "a mapping")
    _known_keys(tls, _TLS_KEYS, file, "tls_server_config")
    if not tls:  # an empty block means plain HTTP, as in exporter-toolkit
        return None
    k = "tls_server_config."
    cert_file = _opt_file(tls, "cert_file", file, base)
    key_file = _opt_file(tls, "key_file", file, base)
    cert_pem = _opt_str(tls, "cert", file, k)
    key_pem = _opt_str(tls, "key", file, k)
    _one_of(cert_file, cert_pem, "cert_file", "cert", "a certificate", file)
    _one_of(key_file, key_pem, "key_file", "key", "a private key", file)
    _check_pem(cert_file, cert_pem, "CERTIFICATE", "cert_file", "cert", file)
    _check_pem(key_file, key_pem, "PRIVATE KEY", "key_file", "key", file)

    auth = tls.get("client_auth_type", "NoClientCert")
    if auth in ("", None):
        auth = "NoClientCert"
    if auth == "RequireClientCert":  # exporter-toolkit's old spelling
        auth = "RequireAnyClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(file, k + "client_auth_type", "one of " + ", ".join(CLIENT_AUTH_TYPES),
                          auth)
    ca_file = _opt_file(tls, "client_ca_file", file, base)
    ca_pem = _opt_str(tls, "client_ca", file, k)
    if ca_file and ca_pem:
        raise ConfigError(file, k + "client_ca", "either client_ca or client_ca_file, not both")
    _check_pem(ca_file, ca_pem, "CERTIFICATE", "client_ca_file", "client_ca", file)
    has_ca = bool(ca_file or ca_pem)
    if has_ca and auth == "NoClientCert":
        raise ConfigError(file, k + "client_auth_type",
                          "a client auth policy when client_ca_file is set", auth)
    if auth == "RequestClientCert":
        warnings.append("tls_server_config.client_auth_type: RequestClientCert asks for no "
                        "certificate here (Python's ssl cannot request one without verifying "
                        "it); it never authenticated anyone")
    if auth == "RequireAnyClientCert":
        warnings.append("tls_server_config.client_auth_type: RequireAnyClientCert is enforced "
                        "as RequireAndVerifyClientCert (Python's ssl verifies what it requires)")
    if _VERIFY_MODES[auth] != ssl.CERT_NONE and not has_ca:
        raise ConfigError(file, k + "client_ca_file",
                          f"a CA file to verify client certificates ({auth})")

    sans = _opt_str_list(tls, "client_allowed_sans", file, k)
    if sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise ConfigError(file, k + "client_auth_type",
                          "RequireAndVerifyClientCert or RequireAnyClientCert when "
                          "client_allowed_sans is set", auth)

    min_v = _tls_version(tls, "min_version", "TLS12", file)
    max_v = _tls_version(tls, "max_version", "TLS13", file)
    if min_v > max_v:
        raise ConfigError(file, k + "max_version", "a version not below min_version",
                          tls.get("max_version"))

    ciphers = _opt_str_list(tls, "cipher_suites", file, k)
    mapped: list[str] = []
    for name in ciphers:
        if name in GO_CIPHERS:
            mapped.append(GO_CIPHERS[name])
        elif name not in TLS13_CIPHERS:
            warnings.append(f"tls_server_config.cipher_suites: {name} cannot be mapped to an "
                            "OpenSSL cipher and is ignored")
    if ciphers and not mapped:
        warnings.append("tls_server_config.cipher_suites: no usable suite; using the defaults")

    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise ConfigError(file, k + "prefer_server_cipher_suites", "true or false", prefer)
    if _opt_str_list(tls, "curve_preferences", file, k):
        warnings.append("tls_server_config.curve_preferences is ignored (OpenSSL's defaults)")

    cfg = TlsConfig(file, cert_file, key_file, cert_pem, key_pem, auth, ca_file, ca_pem,
                    tuple(sans), min_v, max_v, ":".join(dict.fromkeys(mapped)) or None, prefer)
    cfg.build_context()  # fail now, not on the first scrape
    return cfg


def _parse_http(raw: Any, file: str, warnings: list[str]) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    http = _mapping(raw, file, "http_server_config", "a mapping")
    _known_keys(http, _HTTP_KEYS, file, "http_server_config")
    http2 = http.get("http2")
    if http2 is not None and not isinstance(http2, bool):
        raise ConfigError(file, "http_server_config.http2", "true or false", http2)
    if http2:
        warnings.append("http_server_config.http2 is ignored: the exporter serves HTTP/1.1")
    raw_headers = http.get("headers")
    if raw_headers is None:
        return ()
    headers = _mapping(raw_headers, file, "http_server_config.headers",
                       "a mapping of header name to value")
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        key = f"http_server_config.headers.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ConfigError(file, key, "an HTTP header name", name)
        if name.lower() in RESERVED_HEADERS:
            raise ConfigError(file, key, "a header the server does not set itself", name)
        if value is None or value == "":
            continue  # exporter-toolkit: blank means unset
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ConfigError(file, key, "a single-line string", value)
        out.append((name, value))
    return tuple(out)


def _parse_users(raw: Any, file: str) -> dict[str, str]:
    if raw is None:
        return {}
    users = _mapping(raw, file, "basic_auth_users", "a mapping of user name to bcrypt hash")
    out: dict[str, str] = {}
    for user, hashed in users.items():
        key = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(file, key, "a user name: a non-empty string without ':' "
                              "(quote it in YAML)", user)
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            # Never echo what may be a plain-text password.
            raise ConfigError(file, key, "a bcrypt hash like $2y$10$... (htpasswd -nBC 10 \"\")")
        out[user] = hashed
    return out


# --- small helpers -------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)


def _mapping(value: Any, file: str, key: str, expected: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ConfigError(file, key, expected, value)
    return value


def _known_keys(d: dict[Any, Any], allowed: tuple[str, ...], file: str, prefix: str) -> None:
    for name in d:
        if name not in allowed:
            key = f"{prefix}.{name}" if prefix else str(name)
            raise ConfigError(file, key, "a known key (one of " + ", ".join(allowed) + ")")


def _opt_str(d: dict[str, Any], name: str, file: str, prefix: str) -> str | None:
    value = d.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(file, prefix + name, "a string", value)
    return value


def _opt_str_list(d: dict[str, Any], name: str, file: str, prefix: str) -> list[str]:
    value = d.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(file, prefix + name, "a list of strings", value)
    return value


def _opt_file(d: dict[str, Any], name: str, file: str, base: Path) -> str | None:
    key = f"tls_server_config.{name}"
    rel = _opt_str(d, name, file, "tls_server_config.")
    if rel is None:
        return None
    path = base / rel  # relative paths are relative to the web config file, as in the toolkit
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(file, key, f"a readable file ({_reason(exc)})", str(path)) from None
    if not path.is_file():
        raise ConfigError(file, key, "a regular file", str(path))
    return str(path)


def _one_of(path: str | None, pem: str | None, fkey: str, ikey: str, what: str,
            file: str) -> None:
    if path and pem:
        raise ConfigError(file, f"tls_server_config.{ikey}", f"either {ikey} or {fkey}, not both")
    if not path and not pem:
        raise ConfigError(file, f"tls_server_config.{fkey}",
                          f"{what} ({fkey} or inline {ikey}) when tls_server_config is set")


def _check_pem(path: str | None, pem: str | None, label: str, fkey: str, ikey: str,
               file: str) -> None:
    """Cheap PEM framing check first, so the error names the right key and says what it is."""
    if path:
        text = Path(path).read_bytes().decode("ascii", "replace")
        key = fkey
    elif pem:
        text, key = pem, ikey
    else:
        return
    if f"{label}-----" not in text:
        found = path if path else None
        raise ConfigError(file, f"tls_server_config.{key}", f"PEM data with a {label} block",
                          found)


def _tls_version(d: dict[str, Any], name: str, default: str, file: str) -> ssl.TLSVersion:
    value = d.get(name) or default
    if not isinstance(value, str) or value not in TLS_VERSIONS:
        raise ConfigError(file, f"tls_server_config.{name}", "one of " + ", ".join(TLS_VERSIONS),
                          value)
    return TLS_VERSIONS[value]


def _write_private(path: Path, pem: str | None) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(pem or "")
    return str(path)
