"""Which HTTP proxy a request to Prometheus goes through, from the environment, as curl,
requests and urllib read it: `https_proxy`/`HTTPS_PROXY` for https:// URLs, `http_proxy`/
`HTTP_PROXY` for http:// URLs, `all_proxy`/`ALL_PROXY` for either, and `no_proxy`/`NO_PROXY`
for the hosts reached directly (lower case wins; names, domain suffixes, `host:port`, `*`,
IP addresses and CIDR ranges, as curl and requests take them).

Only http:// proxies are supported: https:// targets go through a CONNECT tunnel (TLS is end
to end, the certificate checked against the Prometheus host), http:// targets as absolute-URI
requests. A proxy of another kind (https://, socks5://) is refused with a one-line error rather
than ignored: ignoring it would send the request directly and fail (or succeed) for the wrong
reason.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from metering.errors import SourceError


class ProxyError(SourceError):
    """A proxy variable that cannot be used (not an http:// proxy URL)."""


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    shown: str  # the proxy URL without its password, for messages
    variable: str  # the environment variable it came from
    authorization: str | None = field(default=None, repr=False)  # Proxy-Authorization value

    def headers(self) -> dict[str, str]:
        return {} if self.authorization is None else {"Proxy-Authorization": self.authorization}


def _variable(scheme: str, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable name, value) of the proxy for `scheme`, the scheme's own before ALL_PROXY."""
    for base in (f"{scheme}_proxy", "all_proxy"):
        for name in (base, base.upper()):
            value = environ.get(name, "").strip()
            if value:
                return name, value
    return None


def _bypassed(host: str, port: int | None, environ: Mapping[str, str]) -> bool:
    """Whether NO_PROXY names the host: `*`; a name or domain suffix (`prom`, `.corp`,
    `corp` all match `prom.corp`), optionally with `:port`; an IP address or CIDR range."""
    no_proxy = next((environ[n] for n in ("no_proxy", "NO_PROXY") if environ.get(n)), "")
    name = host.lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(name)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if not entry:
            continue
        if address is not None and "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        want_port = None
        if entry.count(":") == 1 or entry.startswith("["):  # host:port, [v6]:port
            entry, _, tail = entry.rpartition(":")
            entry = entry.strip("[]")
            if not tail.isdigit():
                continue
            want_port = int(tail)
        if want_port is not None and want_port != port:
            continue
        entry = entry.lstrip(".").rstrip(".")
        if name == entry or (address is None and name.endswith("." + entry)):
            return True
    return False


def proxy_for(scheme: str, host: str, port: int | None,
              environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy for a request to `scheme://host:port`, or None to connect directly."""
    env = os.environ if environ is None else environ
    found = _variable(scheme, env)
    if found is None or _bypassed(host, port, env):
        return None
    name, value = found
    url = value if "://" in value else f"http://{value}"
    try:
        parts = urllib.parse.urlsplit(url)
        proxy_port = parts.port
    except ValueError:
        raise ProxyError(f"${name}: expected a proxy URL like http://proxy:3128") from None
    shown = _redact(parts)
    if parts.scheme != "http" or not parts.hostname:
        raise ProxyError(f"${name}={shown}: only http:// proxies are supported (https:// and "
                         f"SOCKS proxies are not); or list {host} in $NO_PROXY to connect "
                         "directly")
    authorization = None
    if parts.username is not None:
        raw = (f"{urllib.parse.unquote(parts.username)}:"
               f"{urllib.parse.unquote(parts.password or '')}").encode()
        authorization = "Basic " + base64.b64encode(raw).decode("ascii")
    return Proxy(parts.hostname, proxy_port or 80, shown, name, authorization)


def _redact(parts: urllib.parse.SplitResult) -> str:
    host = parts.netloc.rpartition("@")[2]
    if parts.username is None:
        return urllib.parse.urlunsplit((parts.scheme, host, "", "", ""))
    user = parts.username + (":***" if parts.password is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, f"{user}@{host}", "", "", ""))
