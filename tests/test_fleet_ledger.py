"""Fleet ledgers: the report's fleet and per-cluster views, per-cluster ledgers merged into one,
and the ledger exported as hive-partitioned Parquet and read back (report and re-import) with
an identical bill."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from test_clusters import CLUSTER_MODEL, H100, bills, gpu_hour, meter, om, rows

from metering import cli_ledger
from metering.cluster import ClusterScope
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.export import MergeError, export_ledger, merge_ledgers
from metering.pricing import price_period
from metering.report import tidy
from metering.report.builder import make_report
from metering.report.cli import main as report_main
from metering.report.csvout import render_csv
from metering.report.model import Month

OCT = Month.parse("2026-10")
HOUR0, HOUR1 = datetime(2026, 10, 5), datetime(2026, 10, 5, 1)
# east: H100 held 30 min -> ml-research 2.00, idle 2.00 (top-level prices);
# west: H100 held 30 min at 3.00 /h -> west-ml 1.50 + 1.50 shared idle (clusters.west).
BILL = [("east", "idle", Decimal("2.000000")), ("east", "ml-research", Decimal("2.000000")),
        ("west", "west-ml", Decimal("3.000000"))]


def cluster_ledger(tmp_path: Path, name: str, clusters: tuple[str, ...]) -> Path:
    """A ledger holding `clusters`, metered and priced with CLUSTER_MODEL."""
    cm = tmp_path / "cost-model.yaml"
    cm.write_text(CLUSTER_MODEL)
    path = tmp_path / name
    con = connect(path)
    for c in clusters:
        meter(con, om(tmp_path, f"{c}.om", gpu_hour(H100, 30)), ClusterScope(c))
    price_period(con, load_cost_model(cm), HOUR0, HOUR1)
    con.close()
    return path


def test_fleet_view_and_per_cluster_view(tmp_path: Path) -> None:
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    cm = str(tmp_path / "cost-model.yaml")
    fleet = make_report(str(db), OCT, cm, 20)
    assert fleet.cluster == ""
    assert [(ln.cluster, ln.cost) for ln in fleet.clusters] == [
        ("east", Decimal("4.000000")), ("west", Decimal("3.000000"))]
    assert fleet.fleet.cost == Decimal("7.000000")
    assert {(t.team, t.cost) for t in fleet.teams} == {
        ("ml-research", Decimal("2.000000")), ("west-ml", Decimal("3.000000")),
        ("idle", Decimal("2.000000"))}
    assert fleet.devices == 2  # the same uuid in two clusters is two GPUs
    # prices differ per cluster: the fleet view states none rather than a wrong one
    assert all(c.price is None for c in fleet.capacity)
    west = make_report(str(db), OCT, cm, 20, cluster="west")
    assert west.cluster == "west" and west.fleet.cost == Decimal("3.000000")
    assert [(t.team, t.cost, t.idle_share) for t in west.teams] == [
        ("west-ml", Decimal("3.000000"), Decimal("1.500000"))]
    assert [c.price.hourly for c in west.capacity if c.price] == [Decimal("3.0")]
    tidy_rows = list(tidy.rows(west))
    assert {r["cluster"] for r in tidy_rows} == {"west"}
    fleet_rows = [r for r in tidy.rows(fleet) if r["section"] == "cluster"]
    assert [(r["cluster"], r["cost"]) for r in fleet_rows] == [
        ("east", Decimal("4.000000")), ("west", Decimal("3.000000"))]
    assert {r["cluster"] for r in tidy.rows(fleet) if r["section"] == "team"} == {""}


def test_report_cli_cluster_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    out = tmp_path / "out"
    assert report_main(["--month", "2026-10", "--db", str(db), "--cluster", "east", "--out",
                        str(out), "--format", "md"]) == 0
    md = (out / "chargeback-2026-10.md").read_text()
    assert "**Cluster:** east (per-cluster view)" in md and "west" not in md
    assert report_main(["--month", "2026-10", "--db", str(db), "--out", str(out),
                        "--format", "md"]) == 0
    md = (out / "chargeback-2026-10.md").read_text()
    assert "## Cost by cluster" in md and "fleet view over 2 clusters: east, west" in md
    capsys.readouterr()
    assert report_main(["--month", "2026-10", "--db", str(db), "--cluster", "a/b", "--out",
                        str(out)]) == 2
    assert "--cluster: expected a cluster name" in capsys.readouterr().err


def test_per_cluster_ledgers_merge_into_the_bill_of_one_ledger(tmp_path: Path) -> None:
    """Two CronJobs, one ledger file each: merged, the bill is the one-ledger bill, and the
    invariant holds per cluster (charges = that cluster's device-hours at its price)."""
    for sub in ("e", "w", "one"):
        (tmp_path / sub).mkdir()
    east = cluster_ledger(tmp_path / "e", "east.duckdb", ("east",))
    west = cluster_ledger(tmp_path / "w", "west.duckdb", ("west",))
    target = tmp_path / "fleet.duckdb"
    result = merge_ledgers(target, [east, west])
    assert {src: [(p.cluster, p.month) for p in parts]
            for src, parts in result.partitions.items()} == {
        str(east): [("east", "2026-10")], str(west): [("west", "2026-10")]}
    assert result.mixed_hashes == []
    con = connect(target)
    assert bills(con) == BILL
    for cluster, price in (("east", Decimal(4)), ("west", Decimal(3))):
        cost, devices = _sums(con, cluster)
        assert cost == devices * price
    one = cluster_ledger(tmp_path / "one", "one.duckdb", ("east", "west"))
    con1 = connect(one)
    snapshot = "SELECT * FROM {} ORDER BY ALL"
    for table in ("device_hours", "allocation_hours", "charges"):
        assert rows(con, snapshot.format(table)) == rows(con1, snapshot.format(table)), table
    con.close()
    con1.close()
    # Merging again changes nothing; a cluster-month in two sources is refused, nothing written.
    merge_ledgers(target, [east, west])
    with pytest.raises(MergeError, match="cluster east, 2026-10: in both"):
        merge_ledgers(target, [east, one])
    con = connect(target)
    assert bills(con) == BILL
    con.close()


def _sums(con: Any, cluster: str) -> tuple[Decimal, int]:
    cost = rows(con, "SELECT sum(cost) FROM charges WHERE cluster = ?", cluster)[0][0]
    devices = rows(con, "SELECT count(*) FROM device_hours WHERE cluster = ?", cluster)[0][0]
    return cost, devices


def test_parquet_export_round_trip(tmp_path: Path) -> None:
    """Export, report from the directory (same CSV as from the DuckDB file, byte for byte),
    re-import it with merge (the same rows), and read it with plain DuckDB as hive tables."""
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    cm = str(tmp_path / "cost-model.yaml")
    out = tmp_path / "export"
    result = export_ledger(db, out)
    assert [(p.cluster, p.month) for p in result.partitions] == [
        ("east", "2026-10"), ("west", "2026-10")]
    part = out / "charges" / "cluster=west" / "month=2026-10" / "part-0.parquet"
    assert part.is_file()
    assert "cluster" not in pq.read_schema(part).names  # hive: the key is the directory
    for cluster in (None, "east", "west"):
        from_db = make_report(str(db), OCT, cm, 20, cluster=cluster)
        from_dir = make_report(str(out), OCT, cm, 20, cluster=cluster)
        assert render_csv(from_dir) == render_csv(from_db), cluster
    back = tmp_path / "back.duckdb"
    merge_ledgers(back, [out])
    con, con0 = connect(back), connect(db)
    for table in ("device_hours", "mig_hours", "allocation_hours", "workload_hours",
                  "coverage", "charges"):
        cols = "* EXCLUDE (ingested_at)" if table == "coverage" else "*"
        q = f"SELECT {cols} FROM {table} ORDER BY ALL"
        assert rows(con, q) == rows(con0, q), table
    con.close()
    con0.close()
    # Any engine that reads hive partitions sees the bill: DuckDB without GPU Ledger here.
    plain = duckdb.connect()
    got = plain.execute(
        "SELECT cluster, team, sum(cost) FROM read_parquet(?, hive_partitioning = true) "
        "GROUP BY ALL ORDER BY ALL", [str(out / "charges" / "**" / "*.parquet")]).fetchall()
    assert got == BILL


def test_export_is_incremental_and_mirrors_the_ledger(tmp_path: Path) -> None:
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    out = tmp_path / "export"
    export_ledger(db, out)
    # east's facts gone (as after a --replace from an empty source) and re-priced: exporting
    # east again removes its files.
    con = connect(db)
    for table in ("device_hours", "allocation_hours", "workload_hours"):
        con.execute(f"DELETE FROM {table} WHERE cluster = 'east'")
    price_period(con, load_cost_model(tmp_path / "cost-model.yaml"), HOUR0, HOUR1,
                 clusters=["east"])
    con.execute("DELETE FROM coverage WHERE cluster = 'east'")
    con.close()
    west_file = out / "charges" / "cluster=west" / "month=2026-10" / "part-0.parquet"
    before = west_file.stat().st_mtime_ns
    result = export_ledger(db, out, clusters=["east"])
    # nothing of east is left to write; the cost model tables are written whole every time
    assert result.files == 2 and result.removed >= 2
    assert not (out / "charges" / "cluster=east" / "month=2026-10" / "part-0.parquet").exists()
    assert west_file.stat().st_mtime_ns == before  # outside the selection: untouched


def test_ledger_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    out = tmp_path / "export"
    assert cli_ledger.main(["export", "--db", str(db), "--out", str(out)]) == 0
    assert "2 cluster-month(s)" in capsys.readouterr().err
    assert cli_ledger.main(["export", "--db", str(db), "--out", str(out), "--month",
                            "2026-13"]) == 2
    assert cli_ledger.main(["merge", "--into", str(tmp_path / "m.duckdb"), str(out)]) == 0
    assert cli_ledger.main(["merge", "--into", str(tmp_path / "m.duckdb"),
                            str(tmp_path / "nothing")]) == 2
    not_duckdb = tmp_path / "x.txt"
    not_duckdb.write_text("hello")
    assert cli_ledger.main(["merge", "--into", str(tmp_path / "m2.duckdb"),
                            str(not_duckdb)]) == 4  # bad input
    err = capsys.readouterr().err
    assert "expected a DuckDB database file" in err and "Traceback" not in err
    assert not (tmp_path / "m2.duckdb").exists() or bills(connect(tmp_path / "m2.duckdb")) == []


def _documented(text: str) -> dict[str, list[tuple[str, str]]]:
    """docs/ledger-export.md: table -> [(column, Parquet type)] in the order written."""
    out: dict[str, list[tuple[str, str]]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("### `"):
            table = line.strip("#` ")
            out[table] = []
        elif table and line.startswith("| `"):
            cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
            out[table].append((cells[0], cells[1]))
    return out


def test_export_schema_is_the_documented_one(tmp_path: Path) -> None:
    """Every table of an export, its columns and their Parquet types, as docs/ledger-export.md
    lists them (map types without their field name)."""
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east",))
    con = connect(db)
    con.execute("INSERT INTO mig_hours VALUES ('2026-10-05 00:00', 'n1', 'GPU-1', 'MIG-1', "
                "'1g.10gb', 1, 7, 1e10, 3600, NULL, 'east')")
    con.execute("INSERT INTO grant_hours VALUES ('2026-10-05 00:00', 'ns', 'p', 'c', 'GPU-1', "
                "'', 0.5, NULL, 'east')")
    con.execute("INSERT INTO energy_hours VALUES ('2026-10-05 00:00', 'idle', '', '', '', 'n1', "
                "'GPU-1', '', 'L4', 'idle', '', 'idle', 1, 3600, false, NULL, NULL, NULL, 'h', "
                "'east')")
    con.execute("INSERT INTO adjustments VALUES ('2026-10-05 00:00', 'east', 't', 'ns', 1.5, "
                "1, '2026-11-01', '2026-11-02 00:30', 'h')")
    con.close()
    out = tmp_path / "export"
    export_ledger(db, out)
    docs = _documented((Path(__file__).parents[1] / "docs" / "ledger-export.md").read_text())
    from metering.ledgerview import LEDGER_TABLES
    assert list(docs) == list(LEDGER_TABLES)
    for table in LEDGER_TABLES:
        schema = pq.read_schema(out / table / "cluster=east" / "month=2026-10" / "part-0.parquet")
        found = [(f.name, str(f.type).replace(" ('labels')", "")) for f in schema]
        assert found == docs[table], table


def test_focus_rows_are_per_cluster(tmp_path: Path) -> None:
    import json

    from metering.report import focus
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    report = make_report(str(db), OCT, str(tmp_path / "cost-model.yaml"), 20, charge_days=True)
    costs: dict[str, Decimal] = {}
    for cd in report.charge_days:
        costs[cd.cluster] = costs.get(cd.cluster, Decimal(0)) + cd.cost
    assert costs == {"east": Decimal("4.000000"), "west": Decimal("3.000000")}
    table = pq.read_table(__import__("io").BytesIO(focus.render_parquet(report)))
    listed = {(json.loads(r["Tags"])["gpu-ledger/cluster"], r["ListUnitPrice"])
              for r in table.to_pylist() if r["ListUnitPrice"] is not None}
    # each cluster's rows at the price that cluster was priced with
    assert listed == {("east", Decimal("4.000000")), ("west", Decimal("3.000000"))}


def test_focus_files_streamed_from_the_ledger_are_the_rendered_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`report --format focus` reads the charge days from the ledger while it writes the two
    files (a fetch of one row at a time here, so every batch boundary is crossed), with the
    per-cluster prices from the month's charges: the same bytes as the export rendered from
    the report make_report reads whole, per cluster price included."""
    from metering.report import builder, focus
    db = cluster_ledger(tmp_path, "fleet.duckdb", ("east", "west"))
    cm = str(tmp_path / "cost-model.yaml")
    report = make_report(str(db), OCT, cm, 20, charge_days=True)
    assert len(list(report.charge_days)) > 2
    monkeypatch.setattr(builder, "DAY_BATCH", 1)
    out = tmp_path / "out"
    assert report_main(["--month", "2026-10", "--db", str(db), "--cost-model", cm,
                        "--out", str(out), "--format", "focus"]) == 0
    assert (out / "chargeback-2026-10.focus.csv").read_bytes() == focus.render_csv(report)
    assert (out / "chargeback-2026-10.focus.parquet").read_bytes() == \
        focus.render_parquet(report)
