"""A throwaway PKI for tests, made with the openssl CLI: a CA, server and client certificates."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    """`<name>.crt` / `<name>.key` in `d`: a self-signed EC CA valid for two days."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d: Path, name: str, ca: str, san: str, usage: str) -> None:
    """`<name>.crt` / `<name>.key` signed by CA `ca`; usage serverAuth or clientAuth."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(
        f"basicConstraints=CA:FALSE\nsubjectAltName={san}\nextendedKeyUsage={usage}\n"
        "keyUsage=critical,digitalSignature\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
             cwd=d)
