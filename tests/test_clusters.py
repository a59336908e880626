"""Many clusters, one ledger: facts and charges carry their cluster; a cluster is metered,
re-metered and priced without touching another's hours; one store holding a cluster label gives
the same facts as one source per cluster."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import conftest_prom
import pytest
from conftest_prom import expected_facts
from promtools import backfill, running_prometheus

from metering import cli_meter
from metering.cluster import ClusterScope
from metering.costmodel import load_cost_model
from metering.db import connect
from metering.ingest import IngestError, ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import resolve
from metering.pricing import price_period

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
T0 = int(datetime(2026, 10, 5, tzinfo=UTC).timestamp())
HOUR0 = datetime(2026, 10, 5)
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"


def gpu_hour(model: str, held_minutes: int, extra: str = "", ns: str = "ml-train",
             pod: str = "trainer-0", uuid: str = "GPU-1") -> str:
    """One hour (2026-10-05 00:00-01:00) of one GPU on node n1, sampled every 60 s, held by one
    container for its first `held_minutes`; `extra` adds labels (a cluster label) to every
    series. Same node, pod and uuid names in every cluster on purpose."""
    dev = f'node="n1",gpu="0",uuid="{uuid}",model="{model}"{extra}'
    ctr = (f'node="n1",namespace="{ns}",pod="{pod}",container="main",uuid="{uuid}",'
           f'mig_uuid="",resource="nvidia.com/gpu",sharing="exclusive",replicas="1"{extra}')
    lines = ["# TYPE gpu_up gauge"]
    lines += [f"gpu_up{{{dev}}} 1 {T0 + t}" for t in range(60, 3601, 60)]
    lines += ["# TYPE gpu_container_allocation gauge"]
    lines += [f"gpu_container_allocation{{{ctr}}} 1 {T0 + t}"
              for t in range(60, held_minutes * 60 + 1, 60)]
    return "\n".join(lines)


def om(tmp_path: Path, name: str, *parts: str) -> Path:
    """An OpenMetrics file of these hours; families of several parts are merged in order."""
    families: dict[str, list[str]] = {}
    for part in parts:
        family = ""
        for line in part.splitlines():
            if line.startswith("# TYPE "):
                family = line
                families.setdefault(family, [])
            else:
                families[family].append(line)
    text = "".join(f"{t}\n" + "\n".join(rows) + "\n" for t, rows in families.items())
    path = tmp_path / name
    path.write_text(text + "# EOF\n")
    return path


def meter(con: Any, path: Path, scope: ClusterScope, start: str = "2026-10-05T00:00",
          end: str = "2026-10-05T01:00", **kw: Any) -> set[str]:
    period = resolve(None, start, end)
    src = OpenMetricsSource(str(path), period)
    try:
        return ingest(con, src, period, clusters=scope, **kw).clusters
    finally:
        src.close()


def rows(con: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in con.execute(sql, list(params)).fetchall()]


def bills(con: Any) -> list[tuple[str, str, Decimal]]:
    return rows(con, "SELECT cluster, team, sum(cost) FROM charges GROUP BY ALL ORDER BY ALL")


def test_two_clusters_metered_separately_into_one_ledger(tmp_path: Path) -> None:
    """east: an H100 (4.00 /h, packaged cost model) held 30 min by ml-train/trainer-0 (team
    ml-research by the ml-* rule): 2.00 charged, 2.00 idle. west: the same node, uuid and pod
    names on an L4 (0.80 /h) held the whole hour: 0.80 charged, no idle."""
    con = connect(tmp_path / "fleet.duckdb")
    assert meter(con, om(tmp_path, "east.om", gpu_hour(H100, 30)), ClusterScope("east")) \
        == {"east"}
    assert meter(con, om(tmp_path, "west.om", gpu_hour(L4, 60)), ClusterScope("west")) \
        == {"west"}
    assert rows(con, "SELECT cluster, uuid, model FROM device_hours ORDER BY 1") == [
        ("east", "GPU-1", H100), ("west", "GPU-1", L4)]
    assert rows(con, "SELECT cluster, pod, allocated_seconds FROM allocation_hours "
                     "ORDER BY 1") == [("east", "trainer-0", 1800.0), ("west", "trainer-0", 3600.0)]
    assert rows(con, "SELECT cluster, devices FROM coverage ORDER BY 1") == [
        ("east", 1), ("west", 1)]
    price_period(con, load_cost_model(None), HOUR0, datetime(2026, 10, 5, 1))
    assert bills(con) == [("east", "idle", Decimal("2.000000")),
                          ("east", "ml-research", Decimal("2.000000")),
                          ("west", "ml-research", Decimal("0.800000"))]


def test_remetering_one_cluster_never_touches_another(tmp_path: Path) -> None:
    con = connect(tmp_path / "fleet.duckdb")
    meter(con, om(tmp_path, "east.om", gpu_hour(H100, 30)), ClusterScope("east"))
    meter(con, om(tmp_path, "west.om", gpu_hour(L4, 60)), ClusterScope("west"))
    model = load_cost_model(None)
    price_period(con, model, HOUR0, datetime(2026, 10, 5, 1))
    west = "SELECT * FROM {} WHERE cluster = 'west' ORDER BY ALL"
    before = {t: rows(con, west.format(t)) for t in ("device_hours", "allocation_hours",
                                                     "coverage", "charges")}
    # east again, now held 45 minutes; then priced for east only
    meter(con, om(tmp_path, "east2.om", gpu_hour(H100, 45)), ClusterScope("east"))
    price_period(con, model, HOUR0, datetime(2026, 10, 5, 1), clusters=["east"])
    assert {t: rows(con, west.format(t)) for t in before} == before
    assert bills(con) == [("east", "idle", Decimal("1.000000")),
                          ("east", "ml-research", Decimal("3.000000")),
                          ("west", "ml-research", Decimal("0.800000"))]
    # A source whose east GPU stopped reporting before the hour: 0 device-hours where the
    # ledger holds 1 is refused, and west is not looked at.
    late = "\n".join(["# TYPE gpu_up gauge",
                      f'gpu_up{{node="n1",gpu="0",uuid="GPU-1",model="{H100}"}} 1 {T0 - 60}'])
    with pytest.raises(IngestError, match="the source has 0 device-hours where the ledger "
                                          "holds 1; metering would lose 1"):
        meter(con, om(tmp_path, "late.om", late), ClusterScope("east"))
    assert bills(con)[0] == ("east", "idle", Decimal("1.000000"))
    assert {t: rows(con, west.format(t)) for t in before} == before


def test_cluster_label_gives_the_facts_of_one_source_per_cluster(
        fleet_om_file: Path, tmp_path: Path) -> None:
    """One store holding two clusters with identical names inside (the conftest fleet twice,
    cluster="a" and cluster="b"): each cluster's facts are the fleet's, as if metered alone."""
    text = fleet_om_file.read_text()
    both = []
    for cluster in ("a", "b"):
        both.append(text.replace("# EOF\n", "").replace("{", f'{{cluster="{cluster}",'))
    store = om(tmp_path, "store.om", *both)
    con = connect(tmp_path / "fleet.duckdb")
    period = ("2026-10-05", "2026-10-06")
    assert meter(con, store, ClusterScope(label="cluster"), *period, chunk_hours=24) \
        == {"a", "b"}
    expected = expected_facts()
    for table, want in expected.items():
        for cluster in ("a", "b"):
            got = rows(con, f"SELECT * EXCLUDE (cluster) FROM {table} WHERE cluster = ?",
                       cluster)
            norm = sorted((tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                                 for v in r) for r in got), key=conftest_prom._key)
            assert norm == want, (table, cluster)
    # Series without the label belong to the scope's name.
    con2 = connect(tmp_path / "other.duckdb")
    assert meter(con2, fleet_om_file, ClusterScope("fallback", "cluster"), *period,
                 chunk_hours=24) == {"fallback"}


def test_pricing_invariant_holds_per_cluster(fleet_om_file: Path, tmp_path: Path) -> None:
    """Per hour x cluster x model: charges add up to the fleet cost of that cluster's
    device-hours, to the micro."""
    text = fleet_om_file.read_text().replace("# EOF\n", "")
    store = om(tmp_path, "store.om", *(text.replace("{", f'{{cluster="{c}",')
                                        for c in ("a", "b")))
    con = connect(tmp_path / "fleet.duckdb")
    meter(con, store, ClusterScope(label="cluster"), "2026-10-05", "2026-10-06", chunk_hours=24)
    model = load_cost_model(None)
    price_period(con, model, datetime(2026, 10, 5), datetime(2026, 10, 6))
    fleet = rows(con, "SELECT cluster, hour, model, sum(cost) FROM charges GROUP BY ALL "
                      "ORDER BY ALL")
    assert {r[0] for r in fleet} == {"a", "b"}
    for cluster, hour, gpu_model, cost in fleet:
        devices = rows(con, "SELECT count(*) FROM device_hours WHERE cluster = ? AND hour = ? "
                            "AND model = ?", cluster, hour, gpu_model)[0][0]
        assert cost == devices * model.price_for(gpu_model).hourly, (cluster, hour, gpu_model)
    # Same facts in both clusters, same cost model: the same bill, row for row.
    a, b = (rows(con, "SELECT * EXCLUDE (cluster) FROM charges WHERE cluster = ? ORDER BY ALL",
                 c) for c in ("a", "b"))
    assert a == b and a


def test_cli_cluster_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = om(tmp_path, "east.om", gpu_hour(H100, 30))
    db = str(tmp_path / "fleet.duckdb")
    args = ["--openmetrics", str(src), "--from", "2026-10-05T00:00", "--to",
            "2026-10-05T01:00", "--db", db, "-q"]
    assert cli_meter.main([*args, "--cluster", "east"]) == 0
    assert cli_meter.main([*args, "--cluster", "bad/name"]) == 2
    assert "--cluster: expected a cluster name" in capsys.readouterr().err
    assert cli_meter.main([*args, "--cluster-label", "not-a-label"]) == 2
    assert "--cluster-label: expected a Prometheus label name" in capsys.readouterr().err
    con = connect(db)
    assert bills(con) == [("east", "idle", Decimal("2.000000")),
                          ("east", "ml-research", Decimal("2.000000"))]
    con.close()
    # --price-only --cluster prices that cluster only; an unknown one has no facts: exit 1.
    price = ["--price-only", "--from", "2026-10-05T00:00", "--to", "2026-10-05T01:00",
             "--db", db, "-q"]
    assert cli_meter.main([*price, "--cluster", "east"]) == 0
    assert cli_meter.main([*price, "--cluster", "north"]) == 6  # refused: no facts
    assert "expected facts of cluster north" in capsys.readouterr().err


def test_a_bad_cluster_label_value_is_a_one_line_error(tmp_path: Path) -> None:
    src = om(tmp_path, "bad.om", gpu_hour(H100, 30, extra=',cluster="a b"'))
    con = connect(tmp_path / "fleet.duckdb")
    with pytest.raises(IngestError, match="label cluster: expected a cluster name"):
        meter(con, src, ClusterScope(label="cluster"))
    assert rows(con, "SELECT count(*) FROM device_hours") == [(0,)]


CLUSTER_MODEL = """\
version: 1
currency: EUR
pricing:
  default: {hourly: 2.0}
  gpus:
    - {model: "NVIDIA H100 80GB HBM3", hourly: 4.0}
teams:
  namespaces:
    - {namespace: "ml-*", team: ml-research}
clusters:
  west:
    pricing:
      default: {hourly: 1.0}
      gpus:
        - {model: "NVIDIA H100 80GB HBM3", hourly: 3.0}
    teams:
      namespaces:
        - {namespace: "ml-*", team: west-ml}
    idle: {policy: proportional}
"""


def test_prices_and_team_rules_per_cluster(tmp_path: Path) -> None:
    """The same hour in two clusters: an H100 held 30 minutes by ml-train/trainer-0.
    east (top-level model): 4.00 /h -> ml-research 2.00, idle 2.00 on its own row.
    west (clusters.west): 3.00 /h, ml-* is team west-ml, idle shared proportionally ->
    west-ml 1.50 + 1.50 idle share = 3.00, no idle row."""
    cm_file = tmp_path / "cost-model.yaml"
    cm_file.write_text(CLUSTER_MODEL)
    model = load_cost_model(cm_file)
    con = connect(tmp_path / "fleet.duckdb")
    meter(con, om(tmp_path, "east.om", gpu_hour(H100, 30)), ClusterScope("east"))
    meter(con, om(tmp_path, "west.om", gpu_hour(H100, 30)), ClusterScope("west"))
    result = price_period(con, model, HOUR0, datetime(2026, 10, 5, 1))
    assert bills(con) == [("east", "idle", Decimal("2.000000")),
                          ("east", "ml-research", Decimal("2.000000")),
                          ("west", "west-ml", Decimal("3.000000"))]
    assert rows(con, "SELECT cluster, sum(idle_share), min(rate) FROM charges "
                     "WHERE team <> 'idle' GROUP BY 1 ORDER BY 1") == [
        ("east", Decimal("0.000000"), 4.0), ("west", Decimal("1.500000"), 3.0)]
    assert result.fleet_cost == Decimal("7.000000") == result.total
    assert rows(con, "SELECT DISTINCT cost_model_hash FROM charges") == [(model.hash,)]


@pytest.mark.parametrize(("override", "message"), [
    ("  west:\n    currency: USD\n", "clusters.west.currency: expected a known key"),
    ("  west:\n    budgets: {}\n", "clusters.west.budgets: expected a known key"),
    ("  west: {}\n", "clusters.west: expected at least one section to override"),
    ("  west:\n    idle: {policy: sideways}\n", "clusters.west.idle.policy: expected one of"),
    ("  a/b:\n    idle: {policy: even}\n", 'clusters: expected a cluster name .* got "a/b"'),
    ("  west:\n    pricing: {default: {hourly: -1}}\n",
     "clusters.west.pricing.default.hourly: expected a number >= 0"),
])
def test_cluster_overrides_are_validated(tmp_path: Path, override: str, message: str) -> None:
    from metering.costmodel import CostModelError
    cm_file = tmp_path / "cost-model.yaml"
    cm_file.write_text(CLUSTER_MODEL.split("clusters:\n")[0] + "clusters:\n" + override)
    with pytest.raises(CostModelError, match=message):
        load_cost_model(cm_file)


def test_global_store_with_a_cluster_label_on_a_real_prometheus(
        fleet_om_file: Path, tmp_path: Path) -> None:
    """A real Prometheus holding two clusters (the fleet twice, cluster="a" and "b"), metered
    once with --cluster-label: each cluster's facts are the fleet's, and the bill per cluster is
    the bill of the fleet metered alone."""
    text = fleet_om_file.read_text().replace("# EOF\n", "")
    store = om(tmp_path, "store.om", *(text.replace("{", f'{{cluster="{c}",')
                                        for c in ("a", "b")))
    data = tmp_path / "tsdb"
    backfill(store.read_text(), data)
    period = ["--from", "2026-10-05", "--to", "2026-10-06", "-q"]
    with running_prometheus(data) as url:
        assert cli_meter.main(["--prometheus", url, "--cluster-label", "cluster",
                               "--db", str(tmp_path / "fleet.duckdb"), *period]) == 0
    assert cli_meter.main(["--openmetrics", str(fleet_om_file), "--db",
                           str(tmp_path / "alone.duckdb"), *period]) == 0
    fleet, alone = connect(tmp_path / "fleet.duckdb"), connect(tmp_path / "alone.duckdb")
    for table in ("device_hours", "mig_hours", "allocation_hours", "workload_hours"):
        want = rows(alone, f"SELECT * EXCLUDE (cluster) FROM {table} ORDER BY ALL")
        for cluster in ("a", "b"):
            got = rows(fleet, f"SELECT * EXCLUDE (cluster) FROM {table} WHERE cluster = ? "
                              "ORDER BY ALL", cluster)
            assert got == want, (table, cluster)
    bill = "SELECT team, sum(cost) FROM charges {} GROUP BY ALL ORDER BY ALL"
    assert rows(fleet, bill.format("WHERE cluster = 'a'")) \
        == rows(fleet, bill.format("WHERE cluster = 'b'")) == rows(alone, bill.format(""))


def test_cost_model_show_prints_each_clusters_model(tmp_path: Path) -> None:
    from metering.cli_costmodel import show
    cm_file = tmp_path / "cost-model.yaml"
    cm_file.write_text(CLUSTER_MODEL)
    text = show(load_cost_model(cm_file), "cm", [H100])
    top, west = text.split("cluster west (clusters.west):\n")
    assert f"'{H100}' -> pricing.gpus[0]: 4 EUR/h" in top and "idle: separate" in top
    assert f"'{H100}' -> pricing.gpus[0]: 3 EUR/h" in west and "idle: proportional" in west
    assert "'ml-*' (glob) -> west-ml" in west


def test_a_ledger_from_before_clusters_is_cluster_default(tmp_path: Path) -> None:
    """Tables created by the schema of the release before clusters, with rows: opening the file
    adds `cluster` = 'default' everywhere (coverage rebuilt with key (hour, cluster)), and a
    second cluster can be metered next to it."""
    import duckdb
    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute((Path(__file__).parent / "fixtures" / "schema-before-clusters.sql").read_text())
    old.execute(f"INSERT INTO device_hours VALUES ('2026-10-05 00:00', 'n1', '0', 'GPU-1', "
                f"'{H100}', false, 3600, 3600, NULL, NULL)")
    old.execute("INSERT INTO coverage VALUES ('2026-10-05 00:00', 'old', 1, '2026-11-01')")
    old.close()
    con = connect(path)
    assert rows(con, "SELECT cluster, uuid FROM device_hours") == [("default", "GPU-1")]
    assert rows(con, "SELECT cluster, source FROM coverage") == [("default", "old")]
    meter(con, om(tmp_path, "west.om", gpu_hour(L4, 60)), ClusterScope("west"))
    assert rows(con, "SELECT cluster, devices FROM coverage ORDER BY 1") == [
        ("default", 1), ("west", 1)]
    with pytest.raises(duckdb.ConstraintException):  # key (hour, cluster)
        con.execute("INSERT INTO coverage (hour, source, devices, ingested_at, cluster) "
                    "VALUES ('2026-10-05 00:00', 'x', 1, now(), 'west')")


def test_resuming_is_per_cluster(fleet_om_file: Path, tmp_path: Path) -> None:
    """A run of one source as cluster a stops after 2 of 4 chunks. The same source metered as
    cluster b is another run (all 4 chunks); as cluster a again, it resumes after 2."""
    from metering.promclient import PromError

    period = resolve(None, "2026-10-05", "2026-10-06")

    class Failing(OpenMetricsSource):
        budget = 2

        def fetch(self, chunk: Any) -> Any:
            if self.budget == 0:
                raise PromError("store gone")
            self.budget -= 1
            return super().fetch(chunk)

    con = connect(tmp_path / "fleet.duckdb")
    src = Failing(str(fleet_om_file), period)
    with pytest.raises(IngestError, match="chunk 3/4"):
        ingest(con, src, period, 6, clusters=ClusterScope("a"))
    src.close()
    for cluster, resumed in (("b", 0), ("a", 2)):
        src = OpenMetricsSource(str(fleet_om_file), period)
        result = ingest(con, src, period, 6, clusters=ClusterScope(cluster))
        src.close()
        assert (result.resumed, result.chunks + result.resumed) == (resumed, 4), cluster
    a, b = (rows(con, "SELECT * EXCLUDE (cluster) FROM allocation_hours WHERE cluster = ? "
                      "ORDER BY ALL", c) for c in ("a", "b"))
    assert a == b and a
