"""Where the API server is and how to authenticate: the in-cluster service account, or a
kubeconfig file.

Supported kubeconfig forms (what a DaemonSet and a developer's test cluster need): a cluster
`server` (https or http), `certificate-authority` / `-data`, `insecure-skip-tls-verify`,
`tls-server-name`; a user with `token`, `tokenFile`, or `client-certificate` / `-data` +
`client-key` / `-data`, or no credentials. Refused with a one-line error naming the key: `exec`
credential plugins, `auth-provider`, `username`/`password`, impersonation (`as*`), `proxy-url`,
and a $KUBECONFIG list of several files.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER = "in-cluster service account"

_UNSUPPORTED_USER_KEYS = {
    "exec": "exec credential plugins",
    "auth-provider": "auth providers",
    "username": "basic auth",
    "password": "basic auth",
    "as": "impersonation",
    "as-uid": "impersonation",
    "as-groups": "impersonation",
    "as-user-extra": "impersonation",
}
_SUPPORTED = "a token, tokenFile or client certificate"


@dataclass(frozen=True)
class Credentials:
    """How to reach one API server. PEM material is held as bytes whether it came from a file
    or from `*-data`, so the TLS context is built the same way for both."""

    server: str  # scheme://host[:port], no trailing slash
    source: str  # the kubeconfig path or IN_CLUSTER, for messages
    token: str = ""
    token_file: str = ""  # read on each request: projected service-account tokens rotate
    ca_pem: bytes = b""
    cert_pem: bytes = b""
    key_pem: bytes = b""
    insecure: bool = False
    tls_server_name: str = ""

    def bearer(self) -> str:
        """The token to send now ('' for none)."""
        if self.token_file:
            with open(self.token_file, encoding="utf-8") as f:
                return f.read().strip()
        return self.token


def load_credentials(kubeconfig: str | None, *, environ: Mapping[str, str] = os.environ,
                     service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Credentials:
    """An explicit kubeconfig, else the in-cluster service account, else ~/.kube/config.
    Raises ConfigError naming the file (or the service account) and what is wrong."""
    if kubeconfig:
        return load_kubeconfig(kubeconfig)
    if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
        return load_in_cluster(environ, service_account_dir)
    home = Path(environ.get("HOME") or Path.home()) / ".kube" / "config"
    if home.is_file():
        return load_kubeconfig(str(home))
    raise ConfigError(IN_CLUSTER, "", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                      "(running in a pod), or --kubeconfig PATH")


def load_in_cluster(environ: Mapping[str, str] = os.environ,
                    service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Credentials:
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        raise ConfigError(IN_CLUSTER, "KUBERNETES_SERVICE_HOST/PORT", "a host and a port",
                          f"{host}:{port}")
    sa = Path(service_account_dir)
    token_file = sa / "token"
    try:
        ca = (sa / "ca.crt").read_bytes()
        token_file.read_text(encoding="utf-8")  # fail now, not on the first request
    except OSError as err:
        raise ConfigError(IN_CLUSTER, "", f"a readable token and ca.crt in {sa} "
                          f"({err.strerror or err})") from err
    if ":" in host:
        host = f"[{host}]"  # an IPv6 service address
    return Credentials(server=f"https://{host}:{port}", source=IN_CLUSTER,
                       token_file=str(token_file), ca_pem=ca)


def load_kubeconfig(path: str) -> Credentials:
    """The current context of the kubeconfig at `path` (YAML or JSON)."""
    if os.pathsep in path:
        raise ConfigError(path, "", "a single kubeconfig file (lists are not merged)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(path, "", f"a readable kubeconfig ({err})") from err
    if text.lstrip().startswith("{"):  # JSON (`kubectl config view -o json`) needs no YAML
        with contextlib.suppress(ValueError):
            return _from_kubeconfig(json.loads(text), path)
    from gpu_ledger import safeyaml  # YAML, with the project's one loader (alias/depth limits)

    try:
        doc = safeyaml.load(text, path)
    except safeyaml.YamlError as err:
        raise ConfigError.from_yaml(err) from err
    return _from_kubeconfig(doc, path)


def _from_kubeconfig(doc: object, path: str) -> Credentials:
    if not isinstance(doc, dict):
        raise ConfigError(path, "", "a kubeconfig mapping", type(doc).__name__)
    context_name = doc.get("current-context")
    if not isinstance(context_name, str) or not context_name:
        raise ConfigError(path, "current-context", "the name of a context")
    context = _named(doc, "contexts", context_name, "context", path)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not isinstance(cluster_name, str):
        raise ConfigError(path, f"contexts[{context_name}].cluster", "a cluster name")
    cluster = _named(doc, "clusters", cluster_name, "cluster", path)
    user = _named(doc, "users", user_name, "user", path) if isinstance(user_name, str) else {}
    base = Path(path).resolve().parent
    ckey, ukey = f"clusters[{cluster_name}].cluster", f"users[{user_name}].user"

    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise ConfigError(path, f"{ckey}.server", "an http(s):// URL", server)
    if cluster.get("proxy-url"):
        raise ConfigError(path, f"{ckey}.proxy-url", "no proxy (not supported by the exporter)")
    for name, what in _UNSUPPORTED_USER_KEYS.items():
        if user.get(name):
            raise ConfigError(path, f"{ukey}.{name}",
                              f"{_SUPPORTED} ({what} are not supported by the exporter)")

    token = user.get("token") or ""
    token_file = user.get("tokenFile") or ""
    if not isinstance(token, str) or not isinstance(token_file, str):
        raise ConfigError(path, f"{ukey}.token", "a string")
    if token_file:
        token_file = str(base / token_file)
        try:
            Path(token_file).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(path, f"{ukey}.tokenFile",
                              f"a readable file ({err.strerror or err})", token_file) from err
    cert = _pem(user, "client-certificate", base, path, ukey)
    key = _pem(user, "client-key", base, path, ukey)
    if bool(cert) != bool(key):
        raise ConfigError(path, ukey, "client-certificate and client-key together")
    return Credentials(
        server=server.rstrip("/"), source=path, token=token, token_file=token_file,
        ca_pem=_pem(cluster, "certificate-authority", base, path, ckey), cert_pem=cert,
        key_pem=key, insecure=cluster.get("insecure-skip-tls-verify") is True,
        tls_server_name=str(cluster.get("tls-server-name") or ""))


def _named(doc: dict[str, Any], section: str, name: str, field: str,
           path: str) -> dict[str, Any]:
    """`doc[section]` is a list of {name, <field>: {...}}: the <field> mapping named `name`."""
    for entry in doc.get(section) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(field)
            if body is None:
                return {}
            if not isinstance(body, dict):
                raise ConfigError(path, f"{section}[{name}].{field}", "a mapping")
            return body
    raise ConfigError(path, section, f"an entry named {name!r}")


def _pem(section: dict[str, Any], key: str, base: Path, path: str, where: str) -> bytes:
    """`key` (a file, relative to the kubeconfig) or `key-data` (base64) as PEM bytes."""
    data, file = section.get(f"{key}-data"), section.get(key)
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as err:
            raise ConfigError(path, f"{where}.{key}-data", "base64 PEM") from err
    if file:
        try:
            return (base / str(file)).read_bytes()
        except OSError as err:
            raise ConfigError(path, f"{where}.{key}", f"a readable file ({err.strerror or err})",
                              str(file)) from err
    return b""
