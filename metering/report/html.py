"""The HTML report: one self-contained page (inline CSS and SVG, no script, no external URL).

A Content-Security-Policy that allows nothing but inline styles and data: images makes the
"opens without a network" promise hold even if a label value tried to reference one, and
every value from the data is escaped, so a pod named `<script>` is shown as text.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from metering.report import charts, fmt
from metering.report.charts import BarRow, Segment, Series, esc
from metering.report.model import KINDS, Line, Report
from metering.report.waste import Kind

_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:76rem;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
dd,li,p,td{overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%}
figure svg{display:block;width:100%;max-width:760px;height:auto}
.fn{font-size:.85rem;color:#444;margin:.2rem 0}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
th,td{border-bottom:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{white-space:nowrap}
tr.total td{font-weight:600;border-top:2px solid #888}
tr.idle td,tr.down td,tr.adjustment td{color:#666;font-style:italic}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.2rem 1rem}dt{font-weight:600}
dd{margin:0}
@media (max-width:40rem){dl{grid-template-columns:minmax(0,1fr)}dd{margin-left:1rem}}
.empty{padding:1rem;background:#fff4e5;border-left:4px solid #f28e2b}
.gaps li{font-variant-numeric:tabular-nums}
figure{margin:1rem 0}
"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _cell(text: str, numeric: bool = False) -> str:
    # Line breaks in a value are shown, not lost; the text itself is escaped first.
    body = esc(text).replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")
    return f'<td class="n">{body}</td>' if numeric else f"<td>{body}</td>"


def _table(grid: fmt.Grid) -> str:
    # Wide tables scroll inside their own box, so the page never spills sideways.
    out = ['<div class="scroll"><table><thead><tr>']
    out += [
        f'<th class="n">{esc(h)}</th>' if grid.numeric(i) else f"<th>{esc(h)}</th>"
        for i, h in enumerate(grid.heads)
    ]
    out.append("</tr></thead><tbody>")
    for kind, cells in zip(grid.kinds, grid.rows, strict=True):
        cls = f' class="{kind}"' if kind else ""
        tds = [_cell(c, grid.numeric(i)) for i, c in enumerate(cells)]
        out.append(f"<tr{cls}>{''.join(tds)}</tr>")
    out.append("</tbody></table></div>")
    out += [f'<p class="fn">{esc(note)}</p>' for note in grid.notes]
    return "".join(out)


def _team_colors(report: Report) -> dict[str, str]:
    colors: dict[str, str] = {}
    for ln in report.teams:
        if not ln.overhead:
            colors[ln.team] = charts.PALETTE[len(colors) % len(charts.PALETTE)]
    return colors


def _charts(report: Report) -> list[str]:
    money = fmt.currency(report)
    colors = _team_colors(report)

    def color(ln: Line) -> str:
        if ln.overhead:
            return charts.KIND_COLORS.get(ln.kind, charts.OTHER_COLOR)
        return colors.get(ln.team, charts.OTHER_COLOR)

    def team_name(ln: Line) -> str:
        return fmt.label(ln.team, ln.kind)

    def money_fmt(v: float) -> str:
        return f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"

    by_team = charts.hbars(
        f"Cost by team ({money})",
        [
            BarRow(
                team_name(ln),
                [Segment(team_name(ln), float(ln.cost), color(ln))],
                f"{fmt.money(ln.cost)} · {fmt.percent(ln.share_of_total)}",
            )
            for ln in report.teams
        ],
        money_fmt,
    )

    # Daily stack: the nine most expensive teams by name, the rest as one series, fleet rows
    # (idle, down, adjustment) on top.
    days = [f"{d:%Y-%m-%d}" for d in _days(report)]
    day_index = {d: i for i, d in enumerate(days)}
    named = [ln.team for ln in report.teams if not ln.overhead][:9]
    other = None  # key of the "other teams" series; None never collides with a team name
    stacks: dict[tuple[str | None, str], list[float]] = {}
    for ln in report.team_days:
        key = (ln.team if ln.overhead or ln.team in named else other, ln.kind)
        values = stacks.setdefault(key, [0.0] * len(days))
        values[day_index[ln.day]] += float(ln.cost)
    order: list[tuple[str | None, str]] = [(t, "") for t in named] + [(other, "")]
    order += [(k, k) for k in KINDS]
    series = [
        Series(
            "other teams" if team is None else fmt.label(team, kind),
            charts.KIND_COLORS[kind] if kind else colors.get(team or "", charts.OTHER_COLOR),
            stacks[(team, kind)],
        )
        for team, kind in order
        if (team, kind) in stacks
    ]
    daily = charts.stacked_columns(
        f"Daily cost by team ({money}, day of month)",
        days if report.has_data else [],
        series,
        money_fmt,
    )

    # GPU-hours per model, split by sharing mode.
    modes: dict[str, str] = {}
    per_model: dict[str, list[Segment]] = {}
    for ln in report.models:
        mode = fmt.sharing(ln)
        if mode not in modes:
            modes[mode] = (
                charts.KIND_COLORS.get(ln.kind, charts.IDLE_COLOR)
                if ln.overhead or ln.sharing == "idle"
                else charts.PALETTE[len(modes) % len(charts.PALETTE)]
            )
        per_model.setdefault(ln.model, []).append(
            Segment(mode, float(ln.allocated_gpu_hours), modes[mode])
        )
    model_rows = sorted(per_model.items(), key=lambda kv: (-sum(s.value for s in kv[1]), kv[0]))
    by_model = charts.hbars(
        "Allocated GPU-hours by GPU model and sharing mode",
        [
            BarRow(fmt.label(model), segs, f"{sum(s.value for s in segs):,.2f} GPU-h")
            for model, segs in model_rows
        ],
        lambda v: f"{v:,.2f}",
        # Idle devices have no allocated hours; list only modes that drew something.
        legend=[
            (m, c)
            for m, c in modes.items()
            if any(s.name == m and s.value > 0 for segs in per_model.values() for s in segs)
        ],
    )

    # A team whose SM activity is unknown (MIG without GPM) gets a row with a dash and no
    # bar: left out, it would look like a team that allocated nothing.
    eff_rows = [
        ln
        for ln in report.teams
        if ln.efficiency is not None or (not ln.overhead and ln.allocated_gpu_hours > 0)
    ]
    efficiency = charts.hbars(
        "Efficiency by team (used / allocated GPU-hours)",
        [
            BarRow(
                team_name(ln),
                [Segment("efficiency", float(ln.efficiency or 0), color(ln))],
                fmt.percent(ln.efficiency)
                + ("" if ln.efficiency is not None else " (SM activity unknown)"),
            )
            for ln in eff_rows
        ],
        lambda v: f"{v * 100:.1f}%",
        at_least=1.0,
        scale=100,
        suffix="%",
        reference=(1.0, "100 % = used all it was allocated"),
    )
    return [by_team, daily, by_model, efficiency]


SAVINGS_COLORS = {kind: charts.PALETTE[i] for i, kind in enumerate(Kind)}
SAVINGS_TOP = 15


def _savings_chart(report: Report) -> str:
    """The recommendations with a saving, largest first, coloured by kind."""
    recs = [r for r in report.savings or [] if r.saving > 0][:SAVINGS_TOP]
    if not recs:
        return ""
    money = fmt.currency(report)
    rows = [
        BarRow(fmt.workload_name(report, r, short=True),
               [Segment(r.kind.value, float(r.saving), SAVINGS_COLORS[r.kind])],
               fmt.money(r.saving))  # the proposal is in the table: no label to cut
        for r in recs
    ]
    shown = {r.kind for r in recs}
    return charts.hbars(
        f"Savings by workload ({money} this month, largest first)", rows,
        lambda v: f"{v:,.2f}",
        legend=[(k.value, c) for k, c in SAVINGS_COLORS.items() if k in shown],
    )


def _days(report: Report) -> list[datetime]:
    start = report.month.start
    return [start + timedelta(days=i) for i in range(report.hours_in_period // 24)]


def render_html(report: Report) -> str:
    title = f"GPU chargeback report — {report.month}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        *(f'<p class="note">{esc(n)}</p>' for n in report.notes),  # before any figure
        "<dl>",
    ]
    facts = fmt.facts(report)
    parts += [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts]
    parts.append("</dl>")
    if report.missing:
        parts.append('<p>Hours with no data (UTC, end exclusive):</p><ul class="gaps">')
        parts += [f"<li>{esc(r.describe())}</li>" for r in report.missing]
        parts.append("</ul>")
    if not report.has_data:
        parts.append(
            f'<p class="empty">No data for {esc(str(report.month))}: the database holds no '
            "priced GPU usage for this month.</p></body></html>\n"
        )
        return "".join(parts)

    parts.append("<h2>Charts</h2>")
    parts += [f"<figure>{svg}</figure>" for svg in _charts(report)]
    if any((ln.efficiency or 0) > 1 for ln in report.teams):
        parts.append(f'<p class="fn">{esc(fmt.OVER_NOTE)}</p>')
    for heading, grid in fmt.sections(report):
        chart = _savings_chart(report) if heading == "Savings" else ""
        parts.append(f'<h2 id="{esc(heading.lower().replace(" ", "-"))}">{esc(heading)}</h2>'
                     + (f'<figure class="savings">{chart}</figure>' if chart else "")
                     + _table(grid))
    parts.append("</body></html>\n")
    return "".join(parts)
