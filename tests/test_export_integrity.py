"""Exports and merges with integrity (issue 26, repro 3): a manifest written last; `report`
and `ledger merge` refuse a directory whose files do not match it or that holds a
cluster-month twice; charges and facts cross-checked before a report is written."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_fleet_ledger import OCT, cluster_ledger

from metering import cli_ledger, export
from metering.db import connect
from metering.export import export_ledger
from metering.manifest import MANIFEST
from metering.report.builder import make_report
from metering.report.cli import main as report_main

PART = Path("cluster=east") / "month=2026-10"


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    out = tmp_path / "export"
    export_ledger(db, out)
    return db, out


def _report(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    out = Path(tempfile.mkdtemp(dir=tmp_path, prefix="report-"))
    rc = report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                      "--cost-model", str(tmp_path / "cost-model.yaml")])
    err = capsys.readouterr().err
    if rc:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not any(out.iterdir())
    return rc, err


def _merge(target: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_ledger.main(["merge", "--into", str(target), str(src)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _fleet_total(db: Path) -> Decimal:
    with connect(db, read_only=True) as con:
        row = con.execute("SELECT sum(cost) FROM charges").fetchone()
    assert row is not None
    return Decimal(row[0])


def test_the_manifest_names_every_file_with_rows_hashes_and_cost_models(
        exported: tuple[Path, Path]) -> None:
    _, out = exported
    doc = json.loads((out / MANIFEST).read_text())
    files = {f["path"]: f for f in doc["files"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*.parquet")}
    assert set(files) == on_disk
    charges = files[(Path("charges") / PART / "part-0.parquet").as_posix()]
    assert (charges["table"], charges["cluster"], charges["month"]) == (
        "charges", "east", "2026-10")
    assert charges["rows"] == pq.read_metadata(out / charges["path"]).num_rows
    assert len(charges["sha256"]) == 64
    assert set(doc["cost_models"]) == {"east/2026-10", "west/2026-10"}
    assert all(len(h) == 1 for h in doc["cost_models"].values())


@pytest.mark.parametrize("tamper", ["copy", "other-month", "changed", "removed"])
def test_a_directory_that_does_not_match_its_manifest_is_refused(
        exported: tuple[Path, Path], tmp_path: Path, tamper: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A copied part-1.parquet, the same file under another month= partition, a file
    rewritten or removed behind the export's back: report and merge refuse, exit 4."""
    _, out = exported
    part = out / "charges" / PART / "part-0.parquet"
    if tamper == "copy":
        shutil.copy(part, part.with_name("part-1.parquet"))
    elif tamper == "other-month":
        (out / "charges" / "cluster=east" / "month=2026-11").mkdir()
        shutil.copy(part, out / "charges" / "cluster=east" / "month=2026-11" / part.name)
    elif tamper == "changed":
        table = pq.read_table(part)
        pq.write_table(table.slice(0, 1), part)
    else:
        part.unlink()
    rc, err = _report(out, tmp_path, capsys)
    assert rc == 4 and MANIFEST in err, err
    target = tmp_path / "merged.duckdb"
    assert main_merge_refused(target, out, capsys)


def main_merge_refused(target: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> bool:
    rc, err = _merge(target, src, capsys)
    assert rc == 4 and MANIFEST in err, err
    return not target.exists() or not connect(target, read_only=True).execute(
        "SELECT count(*) FROM charges").fetchone()[0]  # type: ignore[index]


def test_merging_a_doubled_export_cannot_overwrite_a_correct_month(
        exported: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    db, out = exported
    target = tmp_path / "merged.duckdb"
    assert _merge(target, out, capsys)[0] == 0
    total = _fleet_total(target)
    assert total == _fleet_total(db)
    part = out / "charges" / PART / "part-0.parquet"
    shutil.copy(part, part.with_name("part-1.parquet"))
    assert _merge(target, out, capsys)[0] == 4
    assert _fleet_total(target) == total


def test_the_same_cluster_month_twice_is_refused_even_with_a_matching_manifest(
        exported: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Beyond the manifest: a file holding hours of another month than its partition's (an
    export rewritten by hand, manifest and all) is refused on its contents."""
    _, out = exported
    from metering import manifest
    src = out / "charges" / PART / "part-0.parquet"
    moved = out / "charges" / "cluster=east" / "month=2026-11" / "part-0.parquet"
    moved.parent.mkdir()
    shutil.copy(src, moved)
    doc = manifest.read(out)
    assert doc is not None
    entry = manifest.describe(out, moved, "charges", "east", "2026-11")
    doc.files[entry.path] = entry
    manifest.write(out, doc)
    rc, err = _report(out, tmp_path, capsys)
    assert rc == 4 and "counted twice" in err and "month=2026-11" in err, err


def test_a_wrong_typed_parquet_column_is_one_line(
        exported: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Repro 8: a charges file whose cost is text (written by another tool), with a manifest
    that matches it: one line, exit 4, no traceback."""
    from metering import manifest
    _, out = exported
    part = out / "charges" / PART / "part-0.parquet"
    table = pq.read_table(part)
    i = table.schema.get_field_index("cost")
    table = table.set_column(i, "cost", pa.array([str(v) for v in table.column("cost")
                                                  .to_pylist()], pa.string()))
    pq.write_table(table, part)
    doc = manifest.read(out)
    assert doc is not None
    entry = manifest.describe(out, part, "charges", "east", "2026-10")
    doc.files[entry.path] = entry
    manifest.write(out, doc)
    rc, err = _report(out, tmp_path, capsys)
    assert rc == 4 and "column cost is VARCHAR, the ledger's is DECIMAL(18,6)" in err, err


def _killed_after(n: int) -> Callable[..., None]:
    calls = {"n": 0}
    real = os.replace

    def replace(src: object, dst: object) -> None:
        real(src, dst)  # type: ignore[arg-type]
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    return replace


def test_an_export_killed_after_its_third_rename_is_not_read_as_whole(
        exported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Re-export after the facts changed; killed after three files were renamed in, the
    directory holds new facts beside old charges: refused until an export finishes."""
    db, out = exported
    with connect(db) as con:
        con.execute("DELETE FROM device_hours WHERE cluster = 'east'")
    with monkeypatch.context() as m:
        m.setattr(export.os, "replace", _killed_after(3))
        with pytest.raises(KeyboardInterrupt):
            export_ledger(db, out)
    rc, err = _report(out, tmp_path, capsys)
    assert rc == 4 and "did not finish" in err, err
    # The ledger itself now has charges without facts: the cross-check refuses it too.
    rc, err = _report(db, tmp_path, capsys)
    assert rc == 4 and "charges cover" in err and "where the facts hold 0" in err, err


def test_a_report_is_refused_when_charges_exceed_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Charges copied twice into a DuckDB ledger (no manifest to catch it): each device-hour
    charged twice; the report is refused instead of printing a total above capacity."""
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    assert _report(db, tmp_path, capsys)[0] == 0
    with connect(db) as con:
        con.execute("INSERT INTO charges SELECT * FROM charges WHERE cluster = 'east'")
    rc, err = _report(db, tmp_path, capsys)
    assert rc == 4 and "charges cover 2.00 device-hours where the facts hold 1" in err, err
    with pytest.raises(Exception, match="counted twice"):
        make_report(str(db), OCT, str(tmp_path / "cost-model.yaml"), 20)
    # Facts copied twice: the same.
    db2 = cluster_ledger(tmp_path, "fleet2.duckdb", ("east",))
    with connect(db2) as con:
        con.execute("INSERT INTO device_hours SELECT * FROM device_hours")
    rc, err = _report(db2, tmp_path, capsys)
    assert rc == 4 and "2 device facts for ~1 GPUs" in err, err


def test_a_report_is_refused_when_a_cluster_has_facts_and_no_charges(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster metered after the month was priced: its facts have no charges, and the
    fleet's totals would leave it out; refused, naming it (the first in name order)."""
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "north", "west"))
    with connect(db) as con:
        con.execute("DELETE FROM charges WHERE cluster IN ('west', 'north')")
    rc, err = _report(db, tmp_path, capsys)
    assert rc == 4 and "cluster north has facts but no charges for the month" in err, err


def test_a_partial_export_keeps_the_other_partitions_in_the_manifest(
        exported: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    db, out = exported
    export_ledger(db, out, clusters=["east"])
    assert _report(out, tmp_path, capsys)[0] == 0
    with duckdb.connect() as con:
        got = con.execute("SELECT count(*) FROM read_parquet(?)",
                          [str(out / "charges" / "**" / "*.parquet")]).fetchone()
    assert got is not None and got[0] > 0
