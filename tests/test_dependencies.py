"""Every third-party module the tests and benchmarks import comes from a declared dependency
(runtime, `sim` or `dev` extra), and the installed DuckDB is inside the declared range the
tests cover (pyproject.toml: 2.x; 1.5.6 and 1.0.0 fail the metering tests)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
OWN = {"alerts", "bench", "dashboards", "exporter", "gpu_ledger", "gpusim", "metering", "tests"}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def _imported_modules() -> dict[str, str]:
    """top-level module -> first file importing it, over tests/ and bench/."""
    local = {p.stem for d in ("tests", "bench") for p in (ROOT / d).glob("*.py")}
    out: dict[str, str] = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN | local:
                    out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def test_every_imported_test_dependency_is_declared() -> None:
    declared = {canonicalize_name(r.name) for r in _requirements()}
    dists = packages_distributions()
    undeclared = {}
    for module, where in _imported_modules().items():
        names = {canonicalize_name(d) for d in dists.get(module, [])}
        assert names, f"{where}: imports {module}, which no installed distribution provides"
        if not names & declared:
            undeclared[module] = (where, sorted(names))
    assert undeclared == {}, f"declare these in pyproject.toml's dev extra: {undeclared}"


def test_installed_duckdb_is_in_the_declared_range() -> None:
    [duckdb] = [r for r in _requirements() if canonicalize_name(r.name) == "duckdb"]
    assert duckdb.specifier.contains(version("duckdb")), (version("duckdb"), str(duckdb))
    assert not duckdb.specifier.contains("1.5.6") and not duckdb.specifier.contains("3.0.0")
