"""The dashboards type-check against Grafana's own dashboard schema: each board becomes a typed
`Dashboard` literal (npm `@grafana/schema`, pinned in dashboards/typecheck/package-lock.json)
checked by `tsc --strict --noEmit`, so a field Grafana's schema lacks, or a value of the wrong
type, fails here. The npm packages come from `npm ci --prefix dashboards/typecheck` (.ci/run
runs it); without them these tests fail with that command, never skip."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dashboards.generate import BOARDS

ROOT = Path(__file__).resolve().parent.parent
TYPECHECK = ROOT / "dashboards" / "typecheck"
TSC = TYPECHECK / "node_modules" / ".bin" / "tsc"
SCHEMA = TYPECHECK / "node_modules" / "@grafana" / "schema" / "package.json"
TSCONFIG = {"compilerOptions": {
    "strict": True, "noEmit": True, "target": "es2022",
    "module": "nodenext", "moduleResolution": "nodenext",
}}


def _require_tools() -> None:
    if not TSC.is_file() or not SCHEMA.is_file():
        pytest.fail(f"{TSC.relative_to(ROOT)} or @grafana/schema missing: run "
                    "`npm ci --prefix dashboards/typecheck` (needs node and npm; .ci/run does)")


def _board_ts(doc: dict[str, Any]) -> str:
    return ('import type { Dashboard } from "@grafana/schema";\n\n'
            f"export const board: Dashboard = {json.dumps(doc, indent=2, ensure_ascii=False)};\n")


def _tsc(boards: dict[str, dict[str, Any]], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Writes one .ts per board into `tmp` and runs tsc over them; returns its result."""
    _require_tools()
    (tmp / "node_modules").symlink_to(TYPECHECK / "node_modules", target_is_directory=True)
    (tmp / "tsconfig.json").write_text(
        json.dumps({**TSCONFIG, "files": [f"{n}.ts" for n in boards]}), encoding="utf-8")
    for name, doc in boards.items():
        (tmp / f"{name}.ts").write_text(_board_ts(doc), encoding="utf-8")
    return subprocess.run([str(TSC), "--project", str(tmp / "tsconfig.json")], cwd=tmp,
                          capture_output=True, text=True, timeout=300, check=False)


def _committed() -> dict[str, dict[str, Any]]:
    return {Path(name).stem: json.loads((ROOT / "dashboards" / name).read_text(encoding="utf-8"))
            for name in BOARDS}


def test_schema_is_the_pinned_major() -> None:
    _require_tools()
    version = json.loads(SCHEMA.read_text(encoding="utf-8"))["version"]
    assert version.split(".")[0] == "13", version


def test_dashboards_type_check_against_grafana_schema(tmp_path: Path) -> None:
    boards = _committed()
    assert set(boards) == {"fleet", "node", "workloads", "cost"}
    result = _tsc(boards, tmp_path)
    assert result.returncode == 0, f"tsc --strict found errors:\n{result.stdout}{result.stderr}"


def test_planted_errors_are_reported(tmp_path: Path) -> None:
    """The check can fail: an unknown field on a variable and a string where the schema wants
    a number each give a tsc error naming the board."""
    boards = _committed()
    fleet, cost = boards["fleet"], boards["cost"]
    fleet["templating"]["list"][1]["auto_count"] = 30  # what the SDK used to write
    cost["graphTooltip"] = "crosshair"  # DashboardCursorSync is 0 | 1 | 2
    result = _tsc(boards, tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    errors = [line for line in out.splitlines() if "error TS" in line]
    assert any(line.startswith("fleet.ts(") and "auto_count" in line for line in errors), out
    assert any(line.startswith("cost.ts(") and "DashboardCursorSync" in line
               for line in errors), out
    assert not any(line.startswith(("node.ts(", "workloads.ts(")) for line in errors), out
