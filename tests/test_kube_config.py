"""Credentials from a kubeconfig or the in-cluster service account (exporter/kube/config.py)."""

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from exporter.errors import ConfigError
from exporter.kube.config import IN_CLUSTER, load_credentials, load_in_cluster, load_kubeconfig

CA = b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None,
               *, name: str = "kc", yaml_text: bool = False) -> str:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "ctx",
           "clusters": [{"name": "c", "cluster": cluster or {"server": "https://api:6443"}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / name
    if yaml_text:
        import yaml
        path.write_text(yaml.safe_dump(doc))
    else:
        path.write_text(json.dumps(doc))
    return str(path)


def test_token_and_ca_data(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t0k"},
                      {"server": "https://api.example:6443/",
                       "certificate-authority-data": base64.b64encode(CA).decode(),
                       "tls-server-name": "kubernetes"}, yaml_text=True)
    creds = load_kubeconfig(path)
    assert (creds.server, creds.bearer(), creds.ca_pem) == ("https://api.example:6443", "t0k", CA)
    assert creds.tls_server_name == "kubernetes" and not creds.insecure
    assert creds.source == path


def test_files_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA)
    (tmp_path / "client.crt").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    (tmp_path / "token").write_text("first\n")
    path = kubeconfig(tmp_path, {"client-certificate": "client.crt", "client-key": "client.key",
                                 "tokenFile": "token"},
                      {"server": "https://api:6443", "certificate-authority": "ca.crt"})
    creds = load_kubeconfig(path)
    assert (creds.ca_pem, creds.cert_pem, creds.key_pem) == (CA, b"CERT", b"KEY")
    assert creds.bearer() == "first"
    (tmp_path / "token").write_text("rotated\n")  # read per request, not once
    assert creds.bearer() == "rotated"


@pytest.mark.parametrize(("user", "cluster", "key"), [
    ({"exec": {"command": "aws"}}, None, "users[u].user.exec"),
    ({"auth-provider": {"name": "gcp"}}, None, "users[u].user.auth-provider"),
    ({"username": "admin", "password": "x"}, None, "users[u].user.username"),
    ({"as": "someone"}, None, "users[u].user.as"),
    ({}, {"server": "https://api", "proxy-url": "http://proxy:3128"},
     "clusters[c].cluster.proxy-url"),
    ({"client-certificate-data": base64.b64encode(b"C").decode()}, None, "users[u].user"),
    ({"token": "t"}, {"server": "api:6443"}, "clusters[c].cluster.server"),
    ({"client-key-data": "not base64!"}, None, "users[u].user.client-key-data"),
    ({"tokenFile": "missing"}, None, "users[u].user.tokenFile"),
])
def test_unsupported_or_broken_forms_are_one_line_errors(tmp_path: Path, user: dict[str, Any],
                                                        cluster: dict[str, Any] | None,
                                                        key: str) -> None:
    path = kubeconfig(tmp_path, user, cluster)
    with pytest.raises(ConfigError) as err:
        load_kubeconfig(path)
    assert err.value.key == key
    assert str(err.value).startswith(f"{path}: {key}: expected")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("clusters: 3\n", "current-context: expected the name of a context"),
    ("current-context: x\n", "contexts: expected an entry named 'x'"),
    ("[1, 2]\n", "expected a kubeconfig mapping, got 'list'"),
    ("a: [\n", "invalid YAML"),
    ("a: &x [1, 2]\nb: [*x, *x]\n" + "c: " + "[" * 100 + "]" * 100 + "\n", "nest"),
])
def test_malformed_kubeconfig(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kc"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_kubeconfig(str(path))


def test_json_kubeconfig_is_read_without_yaml(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = kubeconfig(tmp_path, {"token": "t"})
    code = ("import sys; from exporter.kube.config import load_kubeconfig; "
            f"c = load_kubeconfig({path!r}); print(c.token, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["t", "False"]
    (tmp_path / "broken").write_text('{"current-context": "ctx",')  # not JSON: YAML decides
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_kubeconfig(str(tmp_path / "broken"))


def test_missing_file_and_lists(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a readable kubeconfig"):
        load_kubeconfig(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="a single kubeconfig file"):
        load_kubeconfig(f"{tmp_path}/a:{tmp_path}/b")


def service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "ca.crt").write_bytes(CA)
    return sa


def test_in_cluster(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = load_credentials(None, environ=env, service_account_dir=str(sa))
    assert (creds.server, creds.source, creds.ca_pem) == ("https://10.96.0.1:443", IN_CLUSTER, CA)
    assert creds.bearer() == "sa-token"
    v6 = load_in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
                         str(sa))
    assert v6.server == "https://[fd00::1]:443"


def test_in_cluster_without_a_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match="in-cluster service account: expected a readable token"):
        load_credentials(None, environ=env, service_account_dir=str(tmp_path / "nothing"))


def test_explicit_kubeconfig_wins_then_in_cluster_then_home(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "HOME": str(tmp_path)}
    explicit = kubeconfig(tmp_path, {"token": "explicit"})
    assert load_credentials(explicit, environ=env, service_account_dir=str(sa)).token == "explicit"
    assert load_credentials(None, environ=env, service_account_dir=str(sa)).source == IN_CLUSTER
    (tmp_path / ".kube").mkdir()
    home = kubeconfig(tmp_path / ".kube", {"token": "home"}, name="config")
    creds = load_credentials(None, environ={"HOME": str(tmp_path)})
    assert (creds.source, creds.token) == (home, "home")
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        load_credentials(None, environ={"HOME": str(tmp_path / "nowhere")})
