"""Query splitting under store limits: a real Prometheus started with a tiny
`--query.max-samples` and a real VictoriaMetrics with a tiny `-search.maxSamplesPerQuery`
refuse the unsplit queries; metering splits them by node and by time and writes the same
facts and the same bill as an unsplit run."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import conftest_prom
import pytest
from conftest_prom import expected_facts, fact_rows
from promtools import backfill, running_prometheus, running_victoria, vm_import

from metering.cli_meter import main
from metering.db import connect
from metering.period import Period, resolve
from metering.promclient import PromClient, PromError
from metering.prometheus_source import PrometheusSource
from metering.queryplan import (
    HOUR_S,
    PRIOR_SERIES_PER_NODE,
    Answered,
    Limits,
    Piece,
    QueryPlanner,
    Refusal,
    _month_pieces,
    _time_ranges,
    _whole_month,
)
from metering.signals import SIGNALS

fleet_om_file = conftest_prom.fleet_om_file
fleet_prom_url = conftest_prom.fleet_prom_url
DAY_ARGS = ["--from", "2026-10-05", "--to", "2026-10-06"]
FACTS = ("device_hours", "mig_hours", "allocation_hours", "workload_hours")


def _meter(url: str, db: Path, *extra: str) -> str:
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(db), "--retries", "0", *extra])
    assert rc == 0, err.getvalue()
    return err.getvalue()


def _same_ledger(a: Path, b: Path) -> None:
    ca, cb = connect(a, read_only=True), connect(b, read_only=True)
    try:
        for table in FACTS:
            assert fact_rows(ca, table) == fact_rows(cb, table), table
        assert fact_rows(ca, "device_hours")  # not vacuously equal
        cols = [r[0] for r in ca.execute("DESCRIBE charges").fetchall()]
        keep = ", ".join(c for c in cols if c not in ("priced_at", "ingested_at"))
        sql = f"SELECT {keep} FROM charges ORDER BY ALL"
        assert ca.execute(sql).fetchall() == cb.execute(sql).fetchall()
        assert ca.execute("SELECT count(*) FROM charges").fetchone()[0] > 0  # type: ignore[index]
    finally:
        ca.close()
        cb.close()


# --- the plan on its own ------------------------------------------------------------------


def test_node_shards_cover_every_series_once() -> None:
    planner = QueryPlanner(PromClient("http://127.0.0.1:1"), Limits(max_samples=100_000))
    nodes = tuple(f"ip-10-0-{i}.ec2.internal" for i in range(50))
    spec = next(s for s in SIGNALS if s.name == "up_count")
    pieces = planner.plan(spec, 0, 71 * HOUR_S, nodes)
    shards = {p.nodes for p in pieces}
    assert len(shards) > 1
    members = [n for shard in shards for n in shard or ()]
    # Every node in exactly one shard; the first one also takes series without a node label.
    assert sorted(members) == sorted(("", *nodes))
    for shard in shards:  # 8 series x 240 samples per node-hour (priors) x hours <= budget
        hours = {p.steps for p in pieces if p.nodes == shard}
        assert all(len([n for n in shard or () if n]) * 8 * 240 * h <= 100_000 for h in hours)
    # Evaluation hours of each shard: a partition of the chunk's 72.
    for shard in shards:
        got = sorted((p.first, p.last) for p in pieces if p.nodes == shard)
        hours_seen = [t for a, b in got for t in range(a, b + 1, HOUR_S)]
        assert hours_seen == list(range(0, 72 * HOUR_S, HOUR_S))


def test_small_fleets_are_not_split() -> None:
    planner = QueryPlanner(PromClient("http://127.0.0.1:1"))
    for spec in SIGNALS:
        assert planner.plan(spec, 0, 72 * HOUR_S, ("node-a", "node-b")) == [
            Piece(None, 0, 72 * HOUR_S)]


def test_node_names_are_regex_escaped() -> None:
    piece = Piece(("", "a.b", 'q"x'), 0, 0)
    assert piece.matcher() == 'node=~"|a\\\\.b|q\\"x"'


def test_time_ranges_partition_hours() -> None:
    assert _time_ranges(0, 4 * HOUR_S, 2) == [(0, HOUR_S), (2 * HOUR_S, 3 * HOUR_S),
                                               (4 * HOUR_S, 4 * HOUR_S)]


# --- real stores that refuse big queries --------------------------------------------------


def test_prometheus_max_samples_splits_to_the_same_bill(
        fleet_prom_url: str, fleet_om_file: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.duckdb"
    out = _meter(fleet_prom_url, plain)
    assert "no split needed" in out
    data = tmp_path / "limited"
    backfill(fleet_om_file.read_text(), data)
    # The tlast subqueries hold 360 points per series-hour: 54,000 for the day's 6 GPUs.
    with running_prometheus(data, extra_args=("--query.max-samples=3000",)) as url:
        split = tmp_path / "split.duckdb"
        out = _meter(url, split, "--verbose")
    assert "refused by the store's limits" in out and "node shard(s)" in out, out
    assert "time range(s)" in out
    _same_ledger(plain, split)
    con = connect(split, read_only=True)
    try:
        assert fact_rows(con, "device_hours") == expected_facts()["device_hours"]
        assert fact_rows(con, "allocation_hours") == expected_facts()["allocation_hours"]
    finally:
        con.close()


def test_planned_split_needs_no_refusal(fleet_prom_url: str, tmp_path: Path) -> None:
    plain, split = tmp_path / "plain.duckdb", tmp_path / "split.duckdb"
    _meter(fleet_prom_url, plain)
    out = _meter(fleet_prom_url, split, "--max-samples", "20000", "--max-series", "4")
    assert "refused" not in out and "node shard(s)" in out, out
    _same_ledger(plain, split)


def _victoria(path: Path, *flags: str) -> AbstractContextManager[str]:
    return running_victoria(path, *flags)


def _import(url: str, om: Path) -> None:
    """OpenMetrics (seconds) as Prometheus text with millisecond timestamps."""
    lines = []
    for line in om.read_text().splitlines():
        if line and not line.startswith("#"):
            head, _, ts = line.rpartition(" ")
            lines.append(f"{head} {int(ts) * 1000}")
    vm_import(url, "\n".join(lines) + "\n")


def test_victoria_metrics_max_samples_splits_to_the_same_bill(
        fleet_om_file: Path, tmp_path: Path) -> None:
    plain, split = tmp_path / "plain.duckdb", tmp_path / "split.duckdb"
    with _victoria(tmp_path / "vm-plain") as url:
        _import(url, fleet_om_file)
        assert "no split needed" in _meter(url, plain)
    # VictoriaMetrics counts the samples of every data block it reads; the whole day of one
    # node's series fits 10,000, all six GPUs do not.
    with _victoria(tmp_path / "vm-limited", "-search.maxSamplesPerQuery=10000") as url:
        _import(url, fleet_om_file)
        out = _meter(url, split)
    assert "refused by the store's limits" in out and "node shard(s)" in out, out
    _same_ledger(plain, split)


def test_one_node_hour_over_the_limit_is_a_one_line_error(
        fleet_om_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _victoria(tmp_path / "vm", "-search.maxSamplesPerQuery=10") as url:
        _import(url, fleet_om_file)
        rc = main(["--prometheus", url, *DAY_ARGS, "--db", str(tmp_path / "m.duckdb"),
                   "--retries", "0", "-q"])
    err = capsys.readouterr().err
    assert rc == 5 and "Traceback" not in err
    assert "maxSamplesPerQuery" in err and "raise the limit" in err
    assert len(err.strip().splitlines()) == 1


def test_victoria_metrics_series_limit_lists_nodes_family_by_family(
        fleet_om_file: Path, tmp_path: Path) -> None:
    # The fleet's metered families hold 44 series, the largest one 6. Under
    # -search.maxUniqueTimeseries=10 the store refuses to list node names over all families at
    # once; metering lists them family by family, so it still plans by node, and the bill is
    # the unlimited store's.
    plain, limited = tmp_path / "plain.duckdb", tmp_path / "limited.duckdb"
    with _victoria(tmp_path / "vm-plain") as url:
        _import(url, fleet_om_file)
        _meter(url, plain)
    with _victoria(tmp_path / "vm-limited", "-search.maxUniqueTimeseries=10") as url:
        _import(url, fleet_om_file)
        planner = QueryPlanner(PromClient(url))
        day = resolve(None, "2026-10-05", "2026-10-06")
        assert planner.nodes(day) == ("node-a", "node-b")
        assert planner.stats.lookups > 1 and planner.stats.no_discovery == ""
        out = _meter(url, limited)
    assert "node names not listed" not in out, out
    _same_ledger(plain, limited)


def test_first_node_group_is_a_probe_until_answers_tell_what_nodes_hold() -> None:
    """Before any answer the planner knows only priors (8 series per node and signal), which
    pods churning or shared GPUs can exceed many times: the first group takes a quarter of the
    budget by them, and the next groups are sized from what its answers held."""
    from datetime import UTC, datetime, timedelta

    from metering.period import Period

    planner = QueryPlanner(PromClient("http://127.0.0.1:1"))
    start = datetime(2026, 10, 1, tzinfo=UTC)
    chunk = Period(start, start + timedelta(hours=72))
    nodes = tuple(f"n{i:03d}" for i in range(100))
    planner._chunk, planner._nodes = chunk, nodes  # as listed by the store
    planner.memory_points = 8.0 * len(SIGNALS) * 73 * len(nodes)  # all fit, by the priors
    groups = planner.groups(chunk)
    first = next(groups)
    assert first is not None and first[0] == "" and len(first) == 1 + 25
    # Its answers: every node holds 4x the prior in every family.
    for family in {s.family for s in SIGNALS}:
        planner._learned.learn(family, {n: 32 for n in first if n}, {})
    rest = list(groups)
    assert rest and all(g is not None and len(g) == 25 for g in rest)
    assert sorted(n for g in (first, *rest) if g for n in g if n) == list(nodes)
    # Once learned, a chunk that fits is fetched whole.
    planner.memory_points = 32.0 * len(SIGNALS) * 73 * len(nodes)
    assert list(planner.groups(chunk)) == [None]


def test_an_unseen_node_is_estimated_from_every_answer_learned() -> None:
    """A node no answer has shown costs the mean series per node of its family and the
    largest samples per series-hour seen so far, however the answers arrived."""
    planner = QueryPlanner(PromClient("http://127.0.0.1:1"))
    spec = next(s for s in SIGNALS if s.func != "tlast")  # tlast may hold a subquery's points
    assert planner._series(spec.family, "new") == PRIOR_SERIES_PER_NODE
    planner._learned.learn(spec.family, {"a": 2, "b": 4}, {"a": 12.0})
    assert planner._series(spec.family, "new") == 3.0
    assert planner._series(spec.family, "a") == 2.0
    planner._learned.learn(spec.family, {"b": 10, "c": 6}, {"b": 30.0, "a": 1.0})
    assert planner._series(spec.family, "new") == (2 + 10 + 6) / 3
    assert planner._per_step(spec, "new") == 30.0
    assert planner._per_step(spec, "a") == 12.0  # a node's largest rate is kept
    other = next(s for s in SIGNALS if s.family != spec.family)
    assert planner._series(other.family, "a") == PRIOR_SERIES_PER_NODE


def test_a_series_starting_on_the_range_end_is_answered(tmp_path: Path) -> None:
    """VictoriaMetrics leaves a series out of a range query when its only samples in the range
    are at exactly `end`: a pod starting on a chunk's last hour would be billed by no chunk
    (the next chunk's first window, (end, end + 1h], excludes it). The client asks 1 ms past
    `end`, which finds it and evaluates at the same instants."""
    end = 1_792_368_000  # 2026-10-19T00:00:00Z, a chunk boundary
    with running_victoria(tmp_path / "vm") as url:
        vm_import(url, "".join(
            [f'x{{pod="early"}} 1 {(end - 7200 + 300 * i) * 1000}\n' for i in range(24)]
            + [f'x{{pod="late"}} 1 {(end + 300 * i) * 1000}\n' for i in range(12)]))
        client = PromClient(url)
        promql = "count_over_time(x[3599999ms])"
        answer = client.query_range_answer(promql, end - 7200, end, HOUR_S)
        got = {s["metric"]["pod"]: [(float(t), v) for t, v in s["values"]]
               for s in client.matrix(answer, promql)}
    assert got == {"early": [(end - 7200.0, "1"), (end - 3600.0, "12"), (float(end), "11")],
                   "late": [(float(end), "1")]}


def test_node_groups_fit_the_stores_limits_without_a_refusal(
        fleet_om_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose -search.maxQueryLen and -search.maxUniqueTimeseries are set low, told to
    metering with --max-query-bytes and --max-series, while a tiny memory budget meters the
    day in node groups: every query is planned within the limits (no refusal, no split
    after one) and the facts and bill are the unlimited store's. A group's node names are in
    its matcher: planned as one query whatever its length, a group of both nodes was over
    the length limit and refused (a 5,188-node group at 80,000 GPUs: 57 KB of PromQL)."""
    import metering.cli_meter as cli_meter

    plain, limited = tmp_path / "plain.duckdb", tmp_path / "limited.duckdb"
    with _victoria(tmp_path / "vm-plain") as url:
        _import(url, fleet_om_file)
        _meter(url, plain)
    # With the selector the run settles on, the longest query of one node (and the empty
    # name) is 105 bytes, of both nodes 112.
    selector = 'job=~"gpu-ledger-exporter|"'
    limit = 110
    with _victoria(tmp_path / "vm-limited", f"-search.maxQueryLen={limit}",
                   "-search.maxUniqueTimeseries=10") as url:
        _import(url, fleet_om_file)
        client = PromClient(url)
        day = resolve(None, "2026-10-05", "2026-10-06")
        # The length alone: 16 series by the priors fit the default series limit.
        planner = QueryPlanner(client, Limits(max_query_bytes=limit), selector=selector)
        group = ("", "node-a", "node-b")
        sent = [s for spec in SIGNALS
                for s in planner.send(spec, "3599999ms", day, group)]
        assert not [s for s in sent if isinstance(s, Refusal)]
        lengths = [len(s.promql) for s in sent if isinstance(s, Answered)]
        assert max(lengths) <= limit and planner.stats.max_shards == 2, lengths
        # Unplanned, the same group is one query the store refuses as too long.
        with pytest.raises(PromError, match="maxQueryLen"):
            match = f"{selector},{Piece(group, 0, 0).matcher()}"
            promql = max((s.promql("3599999ms", match=match, metricsql=True)
                          for s in SIGNALS), key=len)
            client.matrix(client.query_range_answer(promql, 1_791_158_400, 1_791_244_800,
                                                    HOUR_S), promql)
        monkeypatch.setattr(cli_meter, "memory_budget", lambda: 1 << 10)
        out = _meter(url, limited, "--max-query-bytes", str(limit), "--max-series", "10",
                     "--recorded", "never", "--verbose")
    assert "refused" not in out and "node group(s)" in out, out
    _same_ledger(plain, limited)


def test_a_node_groups_pieces_are_cut_where_their_samples_change_month() -> None:
    """Evaluation hour E reads the samples of [E, E+1h): a month's chunk (its evaluation
    hours Oct 1 00:00 to Nov 1 00:00) is October's samples, read natively as whole blocks,
    and the first hour of November's; a chunk within a month is not cut and not whole."""
    def ts(*when: int) -> int:
        return int(datetime(*when, tzinfo=UTC).timestamp())

    month = Piece(("a",), ts(2026, 10, 1), ts(2026, 11, 1))
    cut = _month_pieces(month)
    assert cut == [Piece(("a",), ts(2026, 10, 1), ts(2026, 10, 31, 23)),
                   Piece(("a",), ts(2026, 11, 1), ts(2026, 11, 1))]
    assert [_whole_month(p) for p in cut] == [True, False]
    across = _month_pieces(Piece(None, ts(2026, 9, 29, 5), ts(2026, 12, 2)))
    assert [(p.first, p.last) for p in across] == [
        (ts(2026, 9, 29, 5), ts(2026, 9, 30, 23)), (ts(2026, 10, 1), ts(2026, 10, 31, 23)),
        (ts(2026, 11, 1), ts(2026, 11, 30, 23)), (ts(2026, 12, 1), ts(2026, 12, 2))]
    assert [_whole_month(p) for p in across] == [False, True, True, False]
    inside = Piece(None, ts(2026, 10, 4), ts(2026, 10, 7))
    assert _month_pieces(inside) == [inside] and not _whole_month(inside)
    # February of a leap year: 29 days
    assert _whole_month(Piece(None, ts(2028, 2, 1), ts(2028, 2, 29, 23)))
    assert not _whole_month(Piece(None, ts(2028, 2, 1), ts(2028, 2, 28, 23)))


@pytest.mark.parametrize("first, found", [
    ("2026-10-05T00:00:00Z", {"node-a", "node-b"}),
    # The fleet's last samples are at 01:00 on 10-06: the evaluation at 02:00 reads
    # (01:00, 02:00], which holds none of them; the one at 01:00 reads them.
    ("2026-10-06T01:00:00Z", {"node-a", "node-b"}),
    ("2026-10-06T02:00:00Z", set()),
    ("2026-10-07T00:00:00Z", set()),
])
def test_nodes_sampled_counts_the_samples_the_chunks_raw_reads_take(
        fleet_prom_url: str, first: str, found: set[str]) -> None:
    """Which listed nodes have raw samples in a chunk is counted over exactly the window the
    chunk's raw reads cover, (first evaluation - 1h, last], on a real Prometheus 2 (ranges
    closed at both ends); a node the store never had is not found."""
    source = PrometheusSource(PromClient(fleet_prom_url, retries=0))
    start = datetime.fromisoformat(first)
    chunk = Period(start, start + timedelta(hours=24))
    assert source._sampled(chunk)(["node-a", "node-b", "node-z"]) == found
