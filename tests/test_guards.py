"""Guards on the paths that replace metered facts (issue 26, deliverable 1): each fact family
is compared with what it replaces, and a shrink is refused (exit 6, one line naming the family
and the hours) unless --replace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import conftest_prom
import pytest

from metering.cli_meter import main
from metering.db import connect

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
DAY = ["--from", "2026-10-05", "--to", "2026-10-06"]
SIX = conftest_prom.DAY_TS + 6 * 3600


def filtered(src: Path, out: Path, drop: Callable[[str, int], bool]) -> Path:
    """`src` without the samples `drop(family, timestamp)` names."""
    lines = []
    for line in src.read_text().splitlines():
        if not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if drop(name, int(line.rsplit(" ", 1)[1])):
                continue
        lines.append(line)
    out.write_text("\n".join(lines) + "\n")
    return out


def _ledger(db: Path) -> tuple[object, ...]:
    with connect(db, read_only=True) as con:
        row = con.execute(
            "SELECT (SELECT count(*) FROM device_hours), (SELECT count(*) FROM "
            "allocation_hours), (SELECT count(*) FROM workload_hours), (SELECT sum(cost) "
            "FROM charges), (SELECT coalesce(sum(cost), 0) FROM charges WHERE team NOT IN "
            "('idle', 'down', 'adjustment'))").fetchone()
    assert row is not None
    return tuple(row)


def test_a_source_without_allocation_series_cannot_move_the_day_to_idle(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Repro 1: the store lost gpu_container_allocation but kept gpu_up. Device-hours are the
    same, so only a per-family guard sees that 121 allocation-hours would become 0."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q"]) == 0
    before = _ledger(db)
    assert before[1] == 121
    poor = filtered(fleet_om_file, tmp_path / "noalloc.om",
                    lambda name, _: name == "gpu_container_allocation")
    capsys.readouterr()
    rc = main(["--openmetrics", str(poor), *DAY, "--db", str(db), "-q"])
    err = capsys.readouterr().err
    assert rc == 6, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "allocation-hours where the ledger holds" in err and "--replace" in err
    assert "device-hours" not in err  # the family that shrank, not one that did not
    assert _ledger(db) == before
    # --replace accepts it: the source's poorer day is what the ledger then holds.
    assert main(["--openmetrics", str(poor), *DAY, "--db", str(db), "-q", "--replace"]) == 0
    after = _ledger(db)
    assert after[0] == before[0] and after[1] == 0
    assert after[3] == before[3] and before[4] > 0 and after[4] == 0  # no team pays now


def test_the_message_names_the_hours_each_family_loses(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q",
                 "--chunk", "24"]) == 0
    with connect(db, read_only=True) as con:
        held = con.execute("SELECT count(*) FROM allocation_hours").fetchone()
    poor = filtered(fleet_om_file, tmp_path / "noalloc.om",
                    lambda name, _: name == "gpu_container_allocation")
    capsys.readouterr()
    assert main(["--openmetrics", str(poor), *DAY, "--db", str(db), "-q", "--chunk",
                 "24"]) == 6
    err = capsys.readouterr().err
    assert held is not None
    assert (f"the source has 0 allocation-hours where the ledger holds {held[0]}; metering "
            f"would lose {held[0]}") in err


def test_a_source_missing_the_first_half_cannot_wipe_it(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store whose retention starts at 06:00: its first chunk is empty, and every family
    it would empty is named, each with its hours."""
    db = tmp_path / "m.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(db), "-q",
                 "--chunk", "6"]) == 0
    before = _ledger(db)
    late = filtered(fleet_om_file, tmp_path / "late.om", lambda _, t: t <= SIX)
    capsys.readouterr()
    rc = main(["--openmetrics", str(late), *DAY, "--db", str(db), "-q", "--chunk", "6"])
    err = capsys.readouterr().err
    assert rc == 6, err
    assert err.startswith("gpu-ledger meter: chunk 1/4 (2026-10-05T00:00Z .. "
                          "2026-10-05T06:00Z): the source has 0 allocation-hours"), err
    for family, held in (("allocation", 31), ("device", 36), ("MIG-instance", 12),
                         ("workload", 31)):
        assert f"the source has 0 {family}-hours where the ledger holds {held}; metering " \
               f"would lose {held}" in err
    assert "--replace" in err and len(err.strip().splitlines()) == 1
    assert _ledger(db) == before


def test_merge_cannot_replace_a_cluster_month_with_a_poorer_one(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ledger merge` replaces whole cluster-months: the same per-family guard as metering."""
    from metering.cli_ledger import main as ledger_main

    good, poor_db, fleet = tmp_path / "good.duckdb", tmp_path / "poor.duckdb", \
        tmp_path / "fleet.duckdb"
    assert main(["--openmetrics", str(fleet_om_file), *DAY, "--db", str(good), "-q"]) == 0
    poor = filtered(fleet_om_file, tmp_path / "noalloc.om",
                    lambda name, _: name == "gpu_container_allocation")
    assert main(["--openmetrics", str(poor), *DAY, "--db", str(poor_db), "-q"]) == 0
    assert ledger_main(["merge", "--into", str(fleet), str(good)]) == 0
    before = _ledger(fleet)
    capsys.readouterr()
    assert ledger_main(["merge", "--into", str(fleet), str(poor_db)]) == 6
    err = capsys.readouterr().err
    assert "cluster default: the source has 0 allocation-hours where the ledger holds 121" in err
    assert "--replace" in err and len(err.strip().splitlines()) == 1
    assert _ledger(fleet) == before
    assert ledger_main(["merge", "--into", str(fleet), str(poor_db), "--replace"]) == 0
    assert _ledger(fleet)[1] == 0


def test_an_empty_first_chunk_cannot_wipe_clusters_of_a_label(tmp_path: Path) -> None:
    """With --cluster-label an empty chunk names no cluster, so its own check compares nothing;
    it is written as hours without data for the run's clusters once a later chunk has facts:
    that write is guarded too (the clusters' facts of the hour are kept)."""
    import re

    from test_clusters import H100, gpu_hour, meter, om

    from metering.cluster import ClusterScope
    from metering.ingest import IngestError

    def later(text: str) -> str:  # the same samples an hour later
        return re.sub(r" (\d+)$", lambda m: f" {int(m.group(1)) + 3600}", text, flags=re.M)

    parts = [gpu_hour(H100, 30, f',cluster="{c}"') for c in ("east", "west")]
    both = om(tmp_path, "both.om", *parts, *(later(p) for p in parts))
    late = om(tmp_path, "late.om", *(later(p) for p in parts))
    scope = ClusterScope("default", "cluster")
    con = connect(tmp_path / "m.duckdb")
    try:
        assert meter(con, both, scope, end="2026-10-05T02:00", chunk_hours=1) == {"east", "west"}
        held = con.execute("SELECT count(*) FROM device_hours").fetchall()
        with pytest.raises(IngestError, match=r"chunk 2026-10-05T00:00Z .. 2026-10-05T01:00Z: "
                           r"cluster east: the source has 0 allocation-hours where the ledger "
                           r"holds 1"):
            meter(con, late, scope, end="2026-10-05T02:00", chunk_hours=1)
        assert con.execute("SELECT count(*) FROM device_hours").fetchall() == held == [(4,)]
        meter(con, late, scope, end="2026-10-05T02:00", chunk_hours=1, replace=True,
              resume=False)
        assert con.execute("SELECT count(*) FROM device_hours").fetchall() == [(2,)]
    finally:
        con.close()
