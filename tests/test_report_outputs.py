"""The report's files: tidy CSV/Parquet contents, determinism, and label values as data."""

from __future__ import annotations

import csv
import io
import random
import re
from datetime import datetime
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_report_fixtures import (
    HASH,
    MONTH,
    OCTOBER,
    SEPTEMBER,
    charge,
    insert_charges,
    insert_coverage,
    make_db,
    make_mig_db,
)

from metering.db import connect
from metering.period import Month
from metering.report import tidy
from metering.report.builder import build_report
from metering.report.csvout import render_csv
from metering.report.html import render_html
from metering.report.markdown import render_markdown
from metering.report.model import CostModelInfo, Report
from metering.report.parquetout import render_parquet
from metering.report.terminal import render_summary

INFO = CostModelInfo('models/cost, "model".yaml', HASH, "EUR")

POD = '<script>alert("pwned")</script>'
NAMESPACE = 'ns,with "quotes"\nand a newline'
TEAM = "t|pipe\r\n*bold* _u_ [link](http://e.test) `code` \x1b[31mred"
MODEL = "H100 <b>80GB</b> & co"


def report_for(path: Path) -> Report:
    con = connect(path, read_only=True)
    try:
        return build_report(con, Month.parse(MONTH), INFO, "1.2.3")
    finally:
        con.close()


@pytest.fixture
def hostile(tmp_path: Path) -> Report:
    con = connect(tmp_path / "h.duckdb")
    insert_charges(con, [
        charge("2026-10-07 12:00", TEAM, NAMESPACE, POD, "GPU-x", MODEL, "exclusive", 1, 3, 1,
               0.5, "3"),
        charge("2026-10-07 12:00", "plain", "ns", "pod-1", "GPU-y", MODEL, "exclusive", 1, 3, 1,
               1, "3"),
    ])  # fmt: skip
    insert_coverage(con, datetime(2026, 10, 1), datetime(2026, 11, 1), [])
    con.close()
    return report_for(tmp_path / "h.duckdb")


def csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))


def test_csv_is_one_tidy_table_with_documented_columns(tmp_path: Path) -> None:
    rows = csv_rows(render_csv(report_for(make_db(tmp_path / "m.duckdb"))))
    assert tuple(rows[0]) == tidy.COLUMN_NAMES
    sections = [r["section"] for r in rows]
    assert sections == sorted(sections, key=tidy.SECTIONS.index)  # grouped, in section order
    fleet = rows[0]
    assert (fleet["section"], fleet["cost"], fleet["previous_cost"], fleet["cost_change"]) == (
        "fleet", "20.000000", "8.000000", "12.000000")  # fmt: skip
    assert {r["cost_model_hash"] for r in rows} == {HASH}
    assert {(r["period"], r["hours_in_period"], r["hours_with_data"], r["tool_version"])
            for r in rows} == {("2026-10", "744", "740", "1.2.3")}  # fmt: skip
    teams = [r for r in rows if r["section"] == "team"]
    assert sum(Decimal(r["cost"]) for r in teams) == Decimal(fleet["cost"])
    idle = next(r for r in teams if r["kind"] == "idle")
    assert (idle["team"], idle["cost"], idle["efficiency"]) == ("idle", "6.142857", "")
    gaps = [(r["hour_from"], r["hour_to"], r["hours"]) for r in rows
            if r["section"] == "missing_hours"]  # fmt: skip
    assert gaps == [
        ("2026-10-03T04:00:00Z", "2026-10-03T07:00:00Z", "3"),
        ("2026-10-31T23:00:00Z", "2026-11-01T00:00:00Z", "1"),
    ]


def test_parquet_holds_the_same_table_typed(tmp_path: Path) -> None:
    report = report_for(make_db(tmp_path / "m.duckdb"))
    path = tmp_path / "r.parquet"
    path.write_bytes(render_parquet(report))
    table = pq.read_table(path)
    assert tuple(table.column_names) == tidy.COLUMN_NAMES
    assert str(table.schema.field("cost").type) == "decimal128(18, 6)"
    assert str(table.schema.field("efficiency").type) == "double"
    meta = table.schema.metadata
    assert meta[b"gpu_ledger.cost_model_hash"] == HASH.encode()
    assert meta[b"gpu_ledger.missing_hours"].decode() == (
        "2026-10-03 04:00–07:00 UTC (3 h);2026-10-31 23:00–24:00 UTC (1 h)")  # fmt: skip
    pq_rows = table.to_pylist()
    csv_ = csv_rows(render_csv(report))
    assert len(pq_rows) == len(csv_)
    for p, c in zip(pq_rows, csv_, strict=True):
        assert (p["section"], p["team"], p["namespace"], p["pod"]) == (
            c["section"], c["team"], c["namespace"], c["pod"])  # fmt: skip
        assert ("" if p["cost"] is None else f"{p['cost']:.6f}") == c["cost"]


def test_same_inputs_give_identical_csv_and_parquet(tmp_path: Path) -> None:
    # Two databases with the same rows inserted in different orders, reported twice each.
    a = make_db(tmp_path / "a.duckdb")
    con = connect(tmp_path / "b.duckdb")
    shuffled = OCTOBER + SEPTEMBER
    random.Random(7).shuffle(shuffled)
    insert_charges(con, shuffled)
    insert_coverage(
        con,
        datetime(2026, 10, 1),
        datetime(2026, 11, 1),
        [datetime(2026, 10, 3, h) for h in (4, 5, 6)] + [datetime(2026, 10, 31, 23)],
    )
    insert_coverage(con, datetime(2026, 9, 1), datetime(2026, 10, 1), [])
    con.close()
    b = tmp_path / "b.duckdb"
    outputs = [(render_csv(r), render_parquet(r)) for r in
               (report_for(a), report_for(b), report_for(a))]  # fmt: skip
    assert outputs[0] == outputs[1] == outputs[2]


def test_hostile_labels_round_trip_through_csv(hostile: Report) -> None:
    rows = csv_rows(render_csv(hostile))
    pod = next(r for r in rows if r["section"] == "pod" and r["pod"] == POD)
    assert (pod["team"], pod["namespace"], pod["cost"]) == (TEAM, NAMESPACE, "3.000000")
    assert {r["cost_model_file"] for r in rows} == {INFO.file}
    assert any(r["model"] == MODEL for r in rows if r["section"] == "model_sharing")


def test_hostile_labels_round_trip_through_parquet(hostile: Report, tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    path.write_bytes(render_parquet(hostile))
    pods = [r for r in pq.read_table(path).to_pylist() if r["section"] == "pod"]
    assert {(p["team"], p["namespace"], p["pod"]) for p in pods} == {
        (TEAM, NAMESPACE, POD), ("plain", "ns", "pod-1")}  # fmt: skip


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_hostile_labels_are_text_in_html(hostile: Report) -> None:
    page = render_html(hostile)
    assert "<script" not in page.lower() and "<b>" not in page
    parser = _Text()
    parser.feed(page)
    assert "script" not in parser.tags and "b" not in parser.tags
    text = "".join(parser.text)
    assert POD in text and MODEL in text
    # The newline in the namespace is shown as a line break, not dropped or merged.
    assert "ns,with &quot;quotes&quot;<br>and a newline" in page


def test_markdown_escapes_pipes_newlines_and_markup(hostile: Report) -> None:
    md = render_markdown(hostile)
    assert "<script>" not in md and "<b>" not in md
    assert '&lt;script&gt;alert("pwned")&lt;/script&gt;' in md
    pod_rows = [ln for ln in md.splitlines() if "pwned" in ln]
    assert len(pod_rows) == 1  # no newline broke the row
    heads = next(ln for ln in md.splitlines() if ln.startswith("| Team | Namespace | Pod"))
    cells = re.split(r"(?<!\\)\|", pod_rows[0])
    assert len(cells) == len(re.split(r"(?<!\\)\|", heads))  # no pipe opened a new cell
    assert r"t\|pipe<br>\*bold\* \_u\_ \[link\](http://e.test) \`code\`" in pod_rows[0]
    assert 'ns,with "quotes"<br>and a newline' in pod_rows[0]


def test_terminal_summary_escapes_control_characters(hostile: Report) -> None:
    out = render_summary(hostile, ["out/chargeback-2026-10.csv"])
    assert "\x1b" not in out and "\r" not in out
    assert "t|pipe\\r\\n*bold*" in out
    assert "chargeback-2026-10.csv" in out


def test_empty_month_reports_say_so(tmp_path: Path) -> None:
    con = connect(tmp_path / "e.duckdb")
    con.close()
    report = report_for(tmp_path / "e.duckdb")
    assert "No data for 2026-10" in render_markdown(report)
    assert "No data for 2026-10" in render_html(report)
    assert "No data for 2026-10" in render_summary(report)
    rows = csv_rows(render_csv(report))
    assert [r["section"] for r in rows] == ["fleet", "missing_hours"]
    assert rows[0]["cost"] == "0.000000" and rows[0]["hours_with_data"] == "0"
    assert (rows[1]["hour_from"], rows[1]["hours"]) == ("2026-10-01T00:00:00Z", "744")


UNKNOWN = ("SM activity unknown for 23.1% of allocated GPU-hours (MIG without GPM); used "
           "GPU-hours and efficiency cover the rest")


def test_unknown_sm_activity_in_every_format(tmp_path: Path) -> None:
    """search holds only a MIG instance without GPM: its used GPU-hours and efficiency are
    unknown, shown as a dash (people) or empty / null (machines), never as 0."""
    report = report_for(make_mig_db(tmp_path / "m.duckdb", tmp_path / "cm.yaml"))
    rows = {(r["section"], r["team"]): r for r in csv_rows(render_csv(report))}
    search, vision = rows[("team", "search")], rows[("team", "vision")]
    assert (search["allocated_gpu_hours"], search["used_gpu_hours"], search["efficiency"],
            search["sm_unknown_gpu_hours"]) == ("0.857143", "", "", "0.857143")  # fmt: skip
    assert (vision["used_gpu_hours"], vision["efficiency"], vision["sm_unknown_gpu_hours"]) == (
        "0.928571", "0.325000", "0.000000")  # fmt: skip
    fleet = rows[("fleet", "")]
    assert (fleet["used_gpu_hours"], fleet["sm_unknown_gpu_hours"]) == ("0.928571", "0.857143")

    path = tmp_path / "r.parquet"
    path.write_bytes(render_parquet(report))
    table = pq.read_table(path)
    team = {r["team"]: r for r in table.to_pylist() if r["section"] == "team"}
    assert (team["search"]["used_gpu_hours"], team["search"]["efficiency"]) == (None, None)
    assert team["search"]["sm_unknown_gpu_hours"] == pytest.approx(0.857143)
    assert table.schema.metadata[b"gpu_ledger.sm_unknown_share"] == b"0.230769"

    md = render_markdown(report)
    assert f"- **SM activity:** {UNKNOWN}" in md
    search_md = next(ln for ln in md.splitlines() if ln.startswith("| search |"))
    # Team | Allocated | Used | Efficiency | Cost | Share
    assert [c.strip() for c in search_md.split("|")[1:5]] == ["search", "0.86", "—", "—"]
    vision_md = next(ln for ln in md.splitlines() if ln.startswith("| vision |"))
    assert [c.strip() for c in vision_md.split("|")[1:5]] == ["vision", "2.86", "0.93", "32.5%"]

    page = render_html(report)
    assert UNKNOWN in page
    assert "<td>search</td><td class=\"n\">0.86</td><td class=\"n\">—</td>" in page
    assert "— (SM activity unknown)" in page  # in the efficiency chart, not left out
    summary = render_summary(report)
    assert UNKNOWN in summary
    assert re.search(r"^search\s+0\.86\s+—\s+—", summary, re.MULTILINE)


def test_csv_neutralises_formula_injection() -> None:
    """OWASP CSV injection: text starting with = + - @ tab gets a leading quote; numbers
    (negative adjustments) are left alone."""
    from metering.report.csvout import _text

    assert _text("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0"
    for bad in ("+1", "-x", "@SUM(A1)", "\tx", "\rx"):
        assert _text(bad) == "'" + bad
    assert _text("team-a") == "team-a"
    assert _text(Decimal("-1.5")) == "-1.500000"
