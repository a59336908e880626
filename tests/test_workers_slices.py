"""`meter --jobs N` on one chunk (issue 27, item 4): the chunk's nodes are cut into slices
fetched by several worker processes at once, written as node groups in slice order. The facts
and the bill are the same as with one job; a slice failing writes nothing for the chunk; at
most N slices are in flight, each within its share of the memory budget."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conftest_prom
import pytest
from promtools import backfill, running_prometheus

from metering import api
from metering.cli_meter import main
from metering.db import connect
from metering.errors import MeteringError
from metering.facts import STAGING
from metering.matrix import Matrix
from metering.period import Period, resolve
from metering.promclient import PromClient, PromError
from metering.prometheus_source import PrometheusSource
from metering.queryplan import QueryPlanner
from metering.recorded import Choice
from metering.signals import SIGNALS, SignalSpec, series_labels
from metering.workers import ParallelSource

fleet_om_file = conftest_prom.fleet_om_file  # session fixtures
fleet_prom_url = conftest_prom.fleet_prom_url
ONE_CHUNK = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", "24"]
TABLES = ("device_hours", "mig_hours", "allocation_hours", "workload_hours", "grant_hours",
          "coverage", "charges")


def _ledger(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the fact tables, coverage and charges (less when they were written)."""
    out = {}
    with connect(db, read_only=True) as con:
        for t in TABLES:
            cols = [c for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "AND column_name NOT IN ('ingested_at', 'priced_at') ORDER BY ordinal_position",
                [t]).fetchall()]
            out[t] = sorted(con.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall(),
                            key=repr)
    return out


@pytest.mark.parametrize(("chunk", "jobs", "said"), [
    ("24", 3, "1 chunk(s) (2 node slices)"),  # one chunk: as many slices as nodes (2 < 3)
    ("12", 4, "2 chunk(s) (4 node slices)"),  # two chunks: 4 / 2 slices each
])
def test_a_chunk_with_several_jobs_is_fetched_by_several_workers_and_the_same(
        chunk: str, jobs: int, said: str, fleet_prom_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    ledgers = {}
    period = ["--from", "2026-10-05", "--to", "2026-10-06", "--chunk", chunk]
    for n in (1, jobs):
        db = tmp_path / f"j{n}.duckdb"
        rc = main(["--prometheus", fleet_prom_url, *period, "--db", str(db), "--jobs", str(n),
                   "--verbose"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert "Traceback" not in err
        ledgers[n] = _ledger(db)
        if n == 1:
            continue
        found = re.search(re.escape(said) + rf" fetched by (\d) worker process\(es\) of {jobs} "
                          r"\(pids ([\d, ]+)\)", err)
        assert found is not None, err
        assert int(found.group(1)) >= 2, err  # (one chunk: by two workers at once)
    for t in ("device_hours", "mig_hours", "allocation_hours", "coverage", "charges"):
        assert ledgers[1][t], f"{t}: empty"  # (the fleet has no workload or grant series)
    assert ledgers[1] == ledgers[jobs]


class _Sliced(PrometheusSource):
    """Slice 0 (the one with series without a node) answered last; a slice holding `fail`
    fails with a bug's exception."""

    fail: str | None = None

    def fetch_part(self, chunk: Period, part: tuple[str, ...] | None,
                   nodes: tuple[str, ...] | None, recorded: frozenset[str]
                   ) -> Iterator[list[tuple[SignalSpec, Matrix]]]:
        if part is not None and "" in part:
            time.sleep(1.0)
        if part is not None and self.fail in part:
            raise ValueError("boom\nsecond line")
        return super().fetch_part(chunk, part, nodes, recorded)


def _nodes(group: dict[str, Any]) -> set[str]:
    return {series_labels(k).get("node", "") for t in group.values()
            for k in t.column("series").to_pylist()}


@pytest.mark.parametrize("memory_points", [None, 1.0])
def test_slices_are_given_in_order_with_at_most_jobs_in_flight(
        fleet_prom_url: str, memory_points: float | None) -> None:
    source = _Sliced(PromClient(fleet_prom_url))
    source.window()
    if memory_points is not None:  # a chunk over the memory budget: its groups are staged
        source.planner.memory_points = memory_points
    chunk = resolve(None, "2026-10-05", "2026-10-06")
    parallel = ParallelSource(source, 2)
    seen: list[set[str]] = []
    with parallel.prefetching([chunk]):
        for group in parallel.tables(chunk):
            assert len(parallel._pending) <= 2
            seen.append(_nodes(group))
        # Staged where one process would have fetched the chunk in node groups too.
        assert parallel.grouped(chunk) == (memory_points is not None)
    assert seen == [{"node-a"}, {"node-b"}], seen  # slice 0 first though answered last
    assert len(set(parallel.fetched_by[chunk])) == 2


@pytest.mark.parametrize("memory_points", [None, 1.0])
def test_a_slice_failing_writes_nothing_for_the_chunk(
        fleet_prom_url: str, tmp_path: Path, memory_points: float | None) -> None:
    db = tmp_path / "m.duckdb"
    assert main(["--prometheus", fleet_prom_url, *ONE_CHUNK, "--db", str(db), "--quiet"]) == 0
    before = _ledger(db)
    source = _Sliced(PromClient(fleet_prom_url))
    if memory_points is not None:  # staged: the first slice's facts committed to staging
        source.planner.memory_points = memory_points
    source.fail = "node-b"  # the second slice, after the first was written
    period = resolve(None, "2026-10-05", "2026-10-06")
    with pytest.raises(MeteringError) as failed:
        api.meter(db, source, period, api.MeterSettings(chunk_hours=24, jobs=2))
    message = str(failed.value)
    assert re.fullmatch(r"chunk 2026-10-05T00:00Z \.\. 2026-10-06T00:00Z: worker process \d+ "
                        r"failed: ValueError: boom second line", message), message
    assert _ledger(db) == before
    with connect(db, read_only=True) as con:
        assert not con.execute("SELECT count(*) FROM information_schema.schemata WHERE "
                               "schema_name = ?", [STAGING]).fetchone()[0]


def test_slices_cut_the_nodes_in_order_within_their_share() -> None:
    planner = QueryPlanner(PromClient("http://127.0.0.1:9"))  # never asked: nodes known
    chunk = resolve(None, "2026-10-05", "2026-10-06")
    nodes = tuple(f"n{i:02}" for i in range(10))
    planner.know_nodes(chunk, nodes)
    per_node = sum(planner._series(s.family, "n00") for s in SIGNALS) * (chunk.hours + 1)
    for least, most, want in ((3, 1e18, 3), (1, 1e18, None), (1, per_node * 2, 5),
                              (4, per_node * 3, 4), (20, 1e18, 10)):
        got = planner.slices(chunk, least, most)
        if want is None:
            assert got is None
            continue
        assert got is not None and len(got) == want, (least, most, got)
        assert got[0][0] == ""  # series without a node: in the first slice only
        assert [n for s in got for n in s if n] == list(nodes)  # contiguous, each once
        assert all(len([n for n in s if n]) * per_node <= max(most, per_node) for s in got)
    planner.know_nodes(chunk, None)
    assert planner.slices(chunk, 3, 1.0) is None  # nodes not listed: every series at once


def _lines(name: str, labels: dict[str, str]) -> list[str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{body}}} 1 {T0 + t}" for t in range(60, 3 * 3600 + 1, 60)]


T0 = 1791158400  # 2026-10-05T00:00Z


def test_series_outside_the_selector_are_reported_as_with_one_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A chunk in three slices: the series outside the selector (listed by the writer's
    process, once per chunk) are reported once and counted once, not billed; the facts as
    with one job."""
    exporter = {"job": "gpu-ledger-exporter", "instance": "10.0.0.1:9847"}
    rogue = {"job": "kubernetes-pods", "instance": "10.9.9.9:8080"}
    lines: list[str] = []
    for node in ("n1", "n2", "n3"):
        lines += _lines("gpu_up", {"node": node, "gpu": "0", "uuid": f"GPU-{node}",
                                   "model": "NVIDIA H100 80GB HBM3", **exporter})
        lines += _lines("gpu_info", {"node": node, "uuid": f"GPU-{node}",
                                     "mig_mode": "disabled", **exporter})
    lines += _lines("gpu_up", {"node": "n2", "gpu": "9", "uuid": "GPU-FAKE",
                               "model": "NVIDIA H100 80GB HBM3", **rogue})
    text, last = "", ""
    for ln in sorted(lines, key=lambda x: (x.split("{")[0], x)):
        name = ln.split("{")[0]
        if name != last:
            text, last = text + f"# TYPE {name} gauge\n", name
        text += ln + "\n"
    backfill(text + "# EOF\n", tmp_path / "prom")
    ledgers, errs = {}, {}
    with running_prometheus(tmp_path / "prom") as url:
        for jobs in (1, 3):
            db = tmp_path / f"j{jobs}.duckdb"
            rc = main(["--prometheus", url, "--from", "2026-10-05T00:00", "--to",
                       "2026-10-05T03:00", "--chunk", "3", "--db", str(db), "--jobs",
                       str(jobs), "--verbose"])
            errs[jobs] = capsys.readouterr().err
            assert rc == 0, errs[jobs]
            ledgers[jobs] = _ledger(db)
    assert "1 chunk(s) (3 node slices) fetched by" in errs[3], errs[3]
    for err in errs.values():
        warned = [x for x in err.splitlines() if "were not metered" in x]
        assert len(warned) == 1, err
        assert 'gpu_up from job="kubernetes-pods" instance="10.9.9.9:8080" (1 series)' \
            in warned[0], warned
    assert len(ledgers[1]["device_hours"]) == 9  # 3 GPUs x 3 hours, the rogue not billed
    assert ledgers[1] == ledgers[3]


class _Unbegun(PrometheusSource):
    """The store fails while the writer's process begins the second chunk."""

    def begin_chunk(self, chunk: Period) -> tuple[Choice, int]:
        if chunk.start.hour == 12:
            raise PromError(f"{self.client.url}: node names not listed (HTTP 503)")
        return super().begin_chunk(chunk)


def test_a_chunk_failing_as_it_is_begun_fails_in_its_turn(fleet_prom_url: str,
                                                          tmp_path: Path) -> None:
    db = tmp_path / "m.duckdb"
    period = resolve(None, "2026-10-05", "2026-10-06")
    with pytest.raises(MeteringError) as failed:
        api.meter(db, _Unbegun(PromClient(fleet_prom_url)), period,
                  api.MeterSettings(chunk_hours=12, jobs=2))
    assert str(failed.value) == (
        f"chunk 2/2 (2026-10-05T12:00Z .. 2026-10-06T00:00Z): {fleet_prom_url}: node names "
        "not listed (HTTP 503); nothing written for this chunk, 1 earlier chunk(s) kept")
    with connect(db, read_only=True) as con:
        hours = con.execute("SELECT DISTINCT hour(hour) FROM device_hours ORDER BY 1").fetchall()
    assert [h for (h,) in hours] == list(range(12))  # the first chunk is kept
