"""requirements.lock pins every runtime dependency with hashes, so two image builds install the
same files (issue 14). It is refreshed with `make lock` after pyproject.toml changes; this test
says when that was forgotten."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes), from pip-compile's --generate-hashes format."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match.group(1))
            assert current not in out, f"{current} pinned twice"
            out[current] = (match.group(2), [])
        elif line.strip().startswith("--hash=sha256:"):
            digest = line.strip().removeprefix("--hash=sha256:").rstrip(" \\")
            assert re.fullmatch(r"[0-9a-f]{64}", digest), line
            out[current][1].append(digest)
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"unexpected line in requirements.lock: {line!r}")
    return out


def runtime_requirements() -> list[Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [Requirement(r) for r in doc["project"]["dependencies"]]


def test_every_runtime_dependency_is_pinned_within_its_range() -> None:
    pins = locked()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is missing from requirements.lock: run `make lock`"
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), \
            f"{req.name}=={version} does not satisfy {req} in pyproject.toml: run `make lock`"


def test_every_pin_has_hashes() -> None:
    pins = locked()
    assert pins
    assert {n: v for n, (v, hashes) in pins.items() if not hashes} == {}


def test_image_installs_the_lock_with_hashes_required() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "--require-hashes" in dockerfile and "requirements.lock" in dockerfile
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    # Every stage starts from an image pinned by digest.
    assert bases and all(re.search(r"@sha256:[0-9a-f]{64}$", b) for b in bases), bases
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "\nlock:" in makefile and "--generate-hashes" in makefile  # the refresh command


def test_the_suite_runs_on_the_locked_runtime_dependencies() -> None:
    """The Makefile installs requirements.lock before the dev extras: what is tested here is
    what the image ships, not the newest release within pyproject.toml's ranges."""
    pins = locked()
    installed = {name: importlib.metadata.version(name) for name in pins}
    differ = {n: (v, installed[n]) for n, (v, _) in pins.items() if installed[n] != v}
    assert differ == {}, ("installed runtime dependencies differ from requirements.lock "
                          "(pin, installed): rm .venv/.installed-stamp && make test")
