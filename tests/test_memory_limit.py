"""DuckDB's memory cap (--memory-limit, GPU_LEDGER_MEMORY_LIMIT): too small a cap is a one-line
error with its own exit status (8) naming the setting to raise, never a traceback and never a
half-written ledger or report; the waste statements that used to hold a month in memory give
the same figures from spillable SQL."""

from __future__ import annotations

import random
from pathlib import Path

import conftest_prom
import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_ledger.cli import main as gpu_ledger
from metering import db, ledgerview, sqlfile
from metering.errors import ExitCode
from metering.report import waste

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, fleet_om_file: Path) -> Path:
    path = tmp_path_factory.mktemp("mem") / "ledger.duckdb"
    assert gpu_ledger(["meter", "--openmetrics", str(fleet_om_file), *DAY, "--db", str(path),
                       "--quiet"]) == 0
    return path


def _charges(path: Path) -> list[tuple[object, ...]]:
    with db.connect(path, read_only=True) as con:
        return con.execute("SELECT * FROM charges ORDER BY ALL").fetchall()


def _one_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"gpu-ledger {command}: "), err
    return lines[0]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_report_over_the_cap_is_one_line_exit_8(ledger: Path, tmp_path: Path, how: str,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    argv = ["report", "--month", "2026-10", "--db", str(ledger), "--out", str(out)]
    if how == "option":
        argv += ["--memory-limit", "1MB"]
    else:
        monkeypatch.setenv(db.MEMORY_LIMIT_ENV, "1MB")
    rc = gpu_ledger(argv)
    line = _one_line(capsys.readouterr().err, "report")
    assert rc == ExitCode.OUT_OF_MEMORY
    assert "out of memory under DuckDB's 1MB cap" in line
    assert "--memory-limit" in line and db.MEMORY_LIMIT_ENV in line
    assert not out.exists()
    # The cap was the command's only: the next run, without it, writes the report.
    monkeypatch.delenv(db.MEMORY_LIMIT_ENV, raising=False)
    assert gpu_ledger(argv[:7]) == 0
    assert (out / "chargeback-2026-10.csv").is_file()


def test_pricing_over_the_cap_keeps_the_charges(ledger: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    before = _charges(ledger)
    rc = gpu_ledger(["meter", "--price-only", *DAY, "--db", str(ledger), "--memory-limit", "1MB"])
    line = _one_line(capsys.readouterr().err, "meter")
    assert rc == ExitCode.OUT_OF_MEMORY and "--memory-limit" in line, line
    assert _charges(ledger) == before


@pytest.mark.parametrize("argv", [
    ["report", "--month", "2026-10", "--memory-limit", "lots"],
    ["meter", "--price-only", *DAY, "--memory-limit", "2XB"],
])
def test_malformed_cap_is_a_usage_error(argv: list[str], ledger: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = gpu_ledger([*argv, "--db", str(ledger)])
    line = _one_line(capsys.readouterr().err, argv[0])
    assert rc == ExitCode.USAGE and "--memory-limit: expected a size" in line


def test_spill_directory_from_the_environment(ledger: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.TEMP_DIR_ENV, str(tmp_path / "spill"))  # made if missing
    con = ledgerview.open_ledger(ledger)
    try:
        where = con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
    finally:
        con.close()
    assert Path(where).parent == tmp_path / "spill"


def _histogram_p95(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, ...], object]:
    con.execute(sqlfile.load("waste.sql").query("p95"))
    rows = con.execute(f"SELECT * EXCLUDE (measure) FROM {waste._P95_TABLE} "
                       "WHERE measure = 'mem'").fetchall()
    return {tuple(r[:7]): r[7] for r in rows}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3),
                          st.one_of(st.none(), st.integers(0, 40)), st.booleans()),
                min_size=1, max_size=120))
def test_p95_is_quantile_disc(rows: list[tuple[str, int, int | None, bool]]) -> None:
    """The histogram nearest-rank percentile equals DuckDB's quantile_disc(x, 0.95) over the
    busy device-hours of each workload (of each cluster), NULLs left out, on every group
    size."""
    con = duckdb.connect()
    con.execute(f"CREATE TEMP TABLE {waste._TABLE} (cluster VARCHAR, namespace VARCHAR, "
                "owner_kind VARCHAR, owner_name VARCHAR, model VARCHAR, sharing VARCHAR, "
                "profile VARCHAR, mem_max DOUBLE, idle BOOLEAN, sm DOUBLE)")
    con.executemany(f"INSERT INTO {waste._TABLE} VALUES (?, 'ns', 'Job', ?, 'H100', "
                    "'exclusive', '', ?, ?, NULL)",
                    [(c, f"w{g}", v, idle) for c, g, v, idle in rows])
    expected = {(c, "ns", "Job", w, "H100", "exclusive", ""): q for c, w, q in con.execute(
        f"SELECT cluster, owner_name, quantile_disc(mem_max, 0.95) FROM {waste._TABLE} "
        "WHERE NOT idle AND mem_max IS NOT NULL GROUP BY ALL").fetchall()}
    assert _histogram_p95(con) == expected


def test_p95_is_quantile_disc_on_large_groups() -> None:
    rng = random.Random(5)
    con = duckdb.connect()
    con.execute(f"CREATE TEMP TABLE {waste._TABLE} AS SELECT 'c' AS cluster, 'ns' AS "
                "namespace, 'Job' AS owner_kind, 'w' || (i % 7) AS owner_name, 'H100' AS model, "
                "'exclusive' AS sharing, '' AS profile, NULL::DOUBLE AS mem_max, false AS idle, "
                "NULL::DOUBLE AS sm FROM range(0) t(i)")
    con.executemany(f"INSERT INTO {waste._TABLE} VALUES ('c', 'ns', 'Job', ?, 'H100', "
                    "'exclusive', '', ?, false, NULL)",
                    [(f"w{rng.randrange(7)}", float(rng.randrange(10_000)))
                     for _ in range(20_000)])
    expected = dict(((("c", "ns", "Job", w, "H100", "exclusive", ""), q) for w, q in con.execute(
        f"SELECT owner_name, quantile_disc(mem_max, 0.95) FROM {waste._TABLE} GROUP BY ALL"
    ).fetchall()))
    assert _histogram_p95(con) == expected
