"""The Savings section: the same recommendations in HTML (opened in headless Chromium),
Markdown, CSV and Parquet, ranked by money; the bill is the same with and without them."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pyarrow.parquet as pq
from test_report_html import DevTools, chromium
from test_waste import H100, L4, MONTH, Holder, _facts

from metering.report import fmt
from metering.report.builder import make_report
from metering.report.csvout import render_csv
from metering.report.html import render_html
from metering.report.markdown import render_markdown
from metering.report.parquetout import render_parquet
from metering.report.waste import Kind

HOLDERS = [
    Holder("infer-1", "GPU-1", H100, 200, owner=("Deployment", "infer")),
    Holder("batch-1", "GPU-2", H100, 200, mem_gb=60.0, sm=0.8, owner=("Job", "batch"),
           peaks=dict.fromkeys(range(50), 0.0)),
    Holder("emb-0", "GPU-3", H100, 200, mem_gb=15.0, mig=("3g.40gb", 3, 0.2),
           owner=("StatefulSet", "emb")),
    Holder("nb-0", "GPU-4", L4, 200, mem_gb=4.0, owner=("", "")),
]


def _report(tmp_path: Path):  # type: ignore[no-untyped-def]
    con, _ = _facts(tmp_path / "m.duckdb", HOLDERS)
    con.close()
    return make_report(str(tmp_path / "m.duckdb"), MONTH, str(tmp_path / "cm.yaml"), 20)


def test_savings_in_every_format(tmp_path: Path) -> None:
    report = _report(tmp_path)
    recs = report.savings or []
    assert {r.kind for r in recs} == {Kind.TO_MIG, Kind.IDLE, Kind.MIG_DOWN, Kind.TO_SHARE}
    assert [r.saving for r in recs] == sorted((r.saving for r in recs), reverse=True)
    workloads = [f"{r.namespace}/{r.owner_kind} {r.owner_name}" for r in recs]
    md = render_markdown(report)
    assert "## Savings" in md
    positions = [md.index(w) for w in workloads]
    assert positions == sorted(positions)  # same order as ranked
    rows = [r for r in csv.DictReader(io.StringIO(render_csv(report).decode()))
            if r["section"] == "savings"]
    assert [(r["owner_name"], r["saving"]) for r in rows] == [
        (r.owner_name, f"{r.saving:.6f}") for r in recs]
    table = pq.read_table(io.BytesIO(render_parquet(report))).to_pylist()
    assert [r["recommendation"] for r in table if r["section"] == "savings"] == [
        r.kind.name.lower() for r in recs]
    assert dict(fmt.facts(report))["Savings"].startswith(f"{len(recs)} recommendation(s)")
    idle = next(r for r in recs if r.kind is Kind.IDLE)
    # batch-1: 50 of its 200 hours with no process.
    assert fmt.evidence_text(idle) == "50 device-hours held with no GPU process; 200 h observed"
    mig = next(r for r in recs if r.kind is Kind.TO_MIG)
    assert fmt.evidence_text(mig) == ("peak memory 8.0 GB, p95 memory 8.0 GB, p95 SM 10.0%, "
                                      "200 h with a process observed, coverage 100.0%")


def test_recommendations_do_not_change_the_bill(tmp_path: Path) -> None:
    with_savings = _report(tmp_path)
    without = dataclasses.replace(with_savings, savings=None)
    # The breakdowns (every table but Savings) and the tidy rows of all other sections match.
    strip = [(h, g) for h, g in fmt.sections(with_savings) if h != "Savings"]
    assert strip == fmt.sections(without)
    assert with_savings.fleet == without.fleet and with_savings.teams == without.teams


def test_savings_section_in_chromium(tmp_path: Path) -> None:
    report = _report(tmp_path)
    page = tmp_path / "r.html"
    page.write_text(render_html(report), encoding="utf-8")
    with chromium(tmp_path / "profile") as port:
        cdp = DevTools(port)
        try:
            for domain in ("Runtime", "Page"):
                cdp.call(f"{domain}.enable")
            cdp.call("Page.navigate", url=page.as_uri())
            cdp.wait_for("Page.loadEventFired")
            found = cdp.evaluate(
                "(() => { const h = document.getElementById('savings');"
                " const fig = h.nextElementSibling; const svg = fig.querySelector('svg');"
                " const r = svg.getBoundingClientRect();"
                " const bars = Array.from(svg.querySelectorAll('rect title'))"
                "   .map(t => t.textContent).filter(t => t.includes(' · '));"
                " const table = fig.nextElementSibling.querySelector('table');"
                " const rows = Array.from(table.tBodies[0].rows).map(tr => tr.cells[1].innerText);"
                " return [r.width, r.height, bars, rows]; })()")
        finally:
            cdp.close()
    width, height, bars, rows = found
    assert width > 300 and height > 100
    positive = [r for r in report.savings or [] if r.saving > 0]
    assert len([b for b in bars if ": " in b]) >= len(positive)
    assert rows == [f"{r.namespace}/{r.owner_kind} {r.owner_name}" for r in report.savings or []]


def test_fleet_report_names_each_workloads_cluster(tmp_path: Path) -> None:
    # ml/Deployment infer in two clusters: two rows, each naming its cluster in the tables
    # and in the CSV's cluster column; a one-cluster report does not add the name.
    con, _ = _facts(tmp_path / "m.duckdb", [
        Holder("infer-a", "GPU-1", H100, 200, owner=("Deployment", "infer")),
        Holder("infer-b", "GPU-2", H100, 200, owner=("Deployment", "infer"), cluster="eu"),
    ])
    con.close()
    report = make_report(str(tmp_path / "m.duckdb"), MONTH, str(tmp_path / "cm.yaml"), 20)
    md = render_markdown(report)
    assert "default: ml/Deployment infer" in md and "eu: ml/Deployment infer" in md
    rows = [r for r in csv.DictReader(io.StringIO(render_csv(report).decode()))
            if r["section"] == "savings"]
    assert sorted((r["cluster"], r["owner_name"]) for r in rows) == [
        ("default", "infer"), ("eu", "infer")]
    one = make_report(str(tmp_path / "m.duckdb"), MONTH, str(tmp_path / "cm.yaml"), 20,
                      cluster="eu")
    assert [fmt.workload_name(one, r) for r in one.savings or []] == ["ml/Deployment infer"]
