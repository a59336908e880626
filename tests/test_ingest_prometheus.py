"""Metering ingest against a real Prometheus backfilled with the synthetic fleet."""

from __future__ import annotations

import threading
import urllib.parse
from pathlib import Path

import conftest_prom
import pyarrow as pa
import pytest
from conftest_prom import expected_facts, fact_rows
from promtools import http_server, proxy_to
from waiting import wait_until

from metering.cli_meter import main
from metering.db import connect
from metering.facts import signal_table
from metering.ingest import IngestError, describe_spacing, ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import Period, resolve
from metering.promclient import PromClient
from metering.prometheus_source import PrometheusSource
from metering.signals import SIGNALS

# Session fixtures: the fleet's OpenMetrics file and a Prometheus backfilled with it.
fleet_om_file = conftest_prom.fleet_om_file
fleet_prom_url = conftest_prom.fleet_prom_url
DAY_ARGS = ["--from", "2026-10-05", "--to", "2026-10-06"]
FACTS = ("device_hours", "mig_hours", "allocation_hours")
KEYS = {"device_hours": "hour, uuid", "mig_hours": "hour, mig_uuid",
        "allocation_hours": "hour, namespace, pod, container, uuid, mig_uuid"}


def _prom_ingest(url: str, db: Path, chunk: int = 6, start: str = "2026-10-05",
                 end: str = "2026-10-06") -> object:
    con = connect(db)
    try:
        return ingest(con, PrometheusSource(PromClient(url, retries=0)),
                      resolve(None, start, end), chunk)
    finally:
        con.close()


def test_facts_match_the_hand_computed_fleet(fleet_prom_url: str, tmp_path: Path) -> None:
    result = _prom_ingest(fleet_prom_url, tmp_path / "m.duckdb")
    # One query per signal per chunk, whatever the number of pods or devices.
    assert result.queries == len(SIGNALS) * 4  # type: ignore[attr-defined]
    assert result.spacing == {"node-a": 60.0, "node-b": 30.0}  # type: ignore[attr-defined]
    con = connect(tmp_path / "m.duckdb", read_only=True)
    expected = expected_facts()
    for table in FACTS:
        assert fact_rows(con, table) == expected[table], table
    cov = con.execute("SELECT count(*), min(devices), max(devices), any_value(source) "
                      "FROM coverage").fetchone()
    assert cov == (24, 6, 6, fleet_prom_url)
    con.close()


def test_node_groups_give_the_hand_computed_facts(fleet_prom_url: str, tmp_path: Path
                                                 ) -> None:
    """A memory budget too small for a node's points: a 24-hour chunk fetched and written
    node group by node group (one node each), in one transaction, gives the same facts,
    coverage and de-duplication as one query per signal."""
    con = connect(tmp_path / "m.duckdb")
    source = PrometheusSource(PromClient(fleet_prom_url, retries=0))
    source.planner.memory_points = 1.0
    result = ingest(con, source, resolve(None, "2026-10-05", "2026-10-06"), 24)
    stats = source.planner.stats
    assert stats.groups == 2 and stats.max_group_nodes == 1  # node-a, then node-b
    assert result.queries == 2 * len(SIGNALS) and result.chunks == 1
    assert result.spacing == {"node-a": 60.0, "node-b": 30.0}
    expected = expected_facts()
    for table in FACTS:
        assert fact_rows(con, table) == expected[table], table
    assert con.execute("SELECT count(*), min(devices), max(devices) FROM coverage"
                       ).fetchone() == (24, 6, 6)
    con.close()


def test_prometheus_and_openmetrics_give_identical_rows(fleet_prom_url: str,
                                                        fleet_om_file: Path,
                                                        tmp_path: Path) -> None:
    _prom_ingest(fleet_prom_url, tmp_path / "prom.duckdb", chunk=5)
    period = resolve(None, "2026-10-05", "2026-10-06")
    om = OpenMetricsSource(str(fleet_om_file), period)
    con = connect(tmp_path / "om.duckdb")
    ingest(con, om, period, 7)
    om.close()
    prom = connect(tmp_path / "prom.duckdb")
    for table in FACTS:
        assert fact_rows(prom, table) == fact_rows(con, table), table
        assert fact_rows(con, table)  # not vacuously equal
    con.close()
    prom.close()


def test_ingest_twice_changes_nothing(fleet_prom_url: str, tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    _prom_ingest(fleet_prom_url, db)
    con = connect(db)
    first = {t: fact_rows(con, t) for t in FACTS}
    first_cov = con.execute("SELECT hour, source, devices FROM coverage ORDER BY hour").fetchall()
    con.close()
    # Same hours again, chunked differently and overlapping only part of the day.
    _prom_ingest(fleet_prom_url, db, chunk=24)
    _prom_ingest(fleet_prom_url, db, chunk=3, start="2026-10-05T04:00", end="2026-10-05T09:00")
    con = connect(db)
    assert {t: fact_rows(con, t) for t in FACTS} == first
    # The fact tables have no PRIMARY KEY: nothing but the writes keeps their keys unique.
    for table, key in KEYS.items():
        dupes = con.execute(f"SELECT {key}, count(*) FROM {table} GROUP BY {key} "
                            "HAVING count(*) > 1").fetchall()
        assert dupes == [], table
    assert con.execute("SELECT hour, source, devices FROM coverage ORDER BY hour"
                       ).fetchall() == first_cov
    con.close()


def test_hours_without_data_are_named(fleet_prom_url: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # History ends 2026-10-06T01:00: hour 00:00 has data, 01:00 and 02:00 have none.
    rc = main(["--prometheus", fleet_prom_url, "--from", "2026-10-06T00:00",
               "--to", "2026-10-06T03:00", "--db", str(tmp_path / "m.duckdb"), "--no-price"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "no device data for 2 hour(s): 2026-10-06T01:00Z .. 2026-10-06T03:00Z" in err
    con = connect(tmp_path / "m.duckdb", read_only=True)
    assert con.execute("SELECT hour::VARCHAR, devices FROM coverage ORDER BY hour").fetchall() \
        == [("2026-10-06 00:00:00", 6), ("2026-10-06 01:00:00", 0), ("2026-10-06 02:00:00", 0)]
    con.close()


def test_cli_ingests_prices_and_reports_queries(fleet_prom_url: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "m.duckdb"
    rc = main(["--prometheus", fleet_prom_url, *DAY_ARGS, "--db", str(db), "--chunk", "12",
               "--verbose"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"2 chunks, {2 * len(SIGNALS)} queries" in err
    assert "sample interval 30s (node-b); 60s (node-a)" in err
    assert "chunk 2/2" in err and "Traceback" not in err
    con = connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM device_hours").fetchone() == (144,)
    assert con.execute("SELECT count(*) > 0 FROM charges").fetchone() == (True,)
    con.close()


def test_prometheus_down_mid_period_keeps_earlier_chunks(fleet_prom_url: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """The first chunk's queries reach Prometheus, then every request gets 503."""
    served: list[str] = []
    per_chunk = len(SIGNALS) + 1  # and the probe for recorded hourly series (none here)

    def flaky(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if "query_range" in path:
            served.append(urllib.parse.unquote(path))
            if len(served) > per_chunk:
                return 503, "text/plain", b"Service Unavailable"
        return proxy_to(fleet_prom_url, path, headers)

    db = tmp_path / "m.duckdb"
    with http_server(flaky) as url:
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(db), "--chunk", "8",
                   "--retries", "2", "--retry-delay", "0.01", "--no-price", "--quiet",
                   "--jobs", "1"])  # queries in chunk order: the 2nd chunk's fail
    err = capsys.readouterr().err
    assert rc == 5  # the source could not be read
    assert "chunk 2/3 (2026-10-05T08:00Z .. 2026-10-05T16:00Z)" in err
    assert "HTTP 503" in err and "nothing written for this chunk" in err
    assert "1 earlier chunk(s) kept" in err and "Traceback" not in err
    con = connect(db, read_only=True)
    hours = con.execute("SELECT DISTINCT hour FROM device_hours ORDER BY hour").fetchall()
    assert [h[0].hour for h in hours] == list(range(8))
    assert con.execute("SELECT count(*) FROM coverage").fetchone() == (8,)
    con.close()
    # The same run against a healthy Prometheus completes the period.
    assert main(["--prometheus", fleet_prom_url, *DAY_ARGS, "--db", str(db), "--chunk", "8",
                 "--no-price", "--quiet"]) == 0
    con = connect(db, read_only=True)
    assert fact_rows(con, "allocation_hours") == expected_facts()["allocation_hours"]
    con.close()


def test_a_failed_chunk_leaves_rewritten_hours_as_they_were(fleet_prom_url: str,
                                                            tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    _prom_ingest(fleet_prom_url, db)
    con = connect(db)
    before = {t: fact_rows(con, t) for t in FACTS}
    with http_server(lambda p, h: (503, "text/plain", b"down")) as url, \
            pytest.raises(IngestError, match="chunk 1/1"):
        ingest(con, PrometheusSource(PromClient(url, retries=0)),
               resolve(None, "2026-10-05", "2026-10-06"), 24)
    assert {t: fact_rows(con, t) for t in FACTS} == before
    con.close()


def test_url_that_is_not_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = b"<html><head><title>Login</title></head></html>"
    with http_server(lambda p, h: (200, "text/html", page)) as url:
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(tmp_path / "m.duckdb"),
                   "--no-price", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 5 and "does not look like the Prometheus HTTP API" in err
    assert "Traceback" not in err


def test_sample_intervals_stay_one_short_line_at_fleet_size() -> None:
    # 2,500 nodes at 300 s and two at 60 s: counted, and the odd ones named.
    spacing = {f"node-{i:05d}": 300.0 for i in range(2_500)} | {"gpu-b": 60.0, "gpu-a": 60.0}
    assert describe_spacing(spacing) == "300s (2,500 nodes); 60s (gpu-a, gpu-b)"
    assert describe_spacing({"n1": 15.0}) == "15s (n1)"
    assert describe_spacing({}) == "unknown (no samples)"


def test_the_next_chunks_queries_are_sent_while_the_current_one_is_written(
        fleet_prom_url: str) -> None:
    """In `prefetching`, the store is asked for the next chunk before ingest asks for it, the
    answers are the same as fetched one chunk at a time, and leaving the context early (a
    failed write) ends the sending thread."""
    period = resolve(None, "2026-10-05", "2026-10-06")
    first, second, third = list(period.chunks(8))
    served: list[str] = []

    def record(path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if "query_range" in path:
            served.append(urllib.parse.unquote(path))
        return proxy_to(fleet_prom_url, path, headers)

    def asked_for(chunk: Period) -> bool:
        return any(f"start={chunk.start.timestamp():.3f}&" in p for p in served)

    alone = PrometheusSource(PromClient(fleet_prom_url))

    def tables(source: PrometheusSource, chunk: Period) -> dict[str, pa.Table]:
        return {spec.name: signal_table(spec, m)
                for group in source.fetch(chunk) for spec, m in group}

    expected = [tables(alone, c) for c in (first, second)]
    alone.close()
    with http_server(record) as url:
        source = PrometheusSource(PromClient(url, retries=0))
        with pytest.raises(RuntimeError, match="out of the prefetched order"), \
                source.prefetching([first, second, third]):
            got = tables(source, first)
            wait_until(lambda: asked_for(second), "the second chunk's queries")
            assert got == expected[0]
            assert source.queries == len(SIGNALS)  # for this chunk only, though more were sent
            assert tables(source, second) == expected[1]
            tables(source, first)  # not the next chunk: a programming error, said at once
        wait_until(lambda: not any(t.name == "gpu-ledger-prefetch"
                                   for t in threading.enumerate()), "the sender to stop")
        source.close()
