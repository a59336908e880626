"""Publish a metering run's state for Prometheus through a Pushgateway (`meter --pushgateway`).

A CronJob is gone before Prometheus could scrape it, so, as the Prometheus docs advise for
batch jobs, it pushes its state to a Pushgateway after each successful run: month-to-date
spend (the team's bill so far in the run's cluster: compute + energy line + adjustments billed
in the month; clusters add up to the fleet), budget, the forecast from which it is heading
over, forecast and budget status per team (the report's one definition,
`metering.report.model.team_bills` and `budget_lines`, read through `make_report`) and the
run's last success time. The push is a PUT to `/metrics/job/<JOB>/cluster/<cluster>`
(Pushgateway README, prometheus/pushgateway v1.x, "Use it"): it replaces every metric of
that grouping key, so a team that left the budgets disappears, and a failed run pushes
nothing, leaving the last success time to age (the `GpuLedgerMeteringStale` alert). The
gateway adds `push_time_seconds` itself; pushed samples carry no timestamps (the README
forbids them).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from metering.period import Month, Period, utc_naive
from metering.report.model import BudgetLine, BudgetStatus

JOB = "gpu_ledger_meter"  # the pushed group's job label
ENV = "GPU_LEDGER_PUSHGATEWAY"  # default of --pushgateway (deploy: ConfigMap key pushgateway)
TIMEOUT_SECONDS = 10.0

# Metric names: the alert rules (alerts/generate.py) and the cost dashboard read these.
SPEND = "gpu_ledger_team_spend_month_to_date"
BUDGET = "gpu_ledger_team_budget"
# budget x budgets.warn_at: the forecast from which the team is heading over. The forecasts of
# a team's clusters add up to its fleet forecast, which the alert
# GpuLedgerBudgetHeadingOverAcrossClusters compares with this.
WARN_FROM = "gpu_ledger_team_budget_warn_from"
FORECAST = "gpu_ledger_team_forecast_month_end"
STATUS = "gpu_ledger_team_budget_status"
LAST_SUCCESS = "gpu_ledger_meter_last_success_timestamp_seconds"
HOURS = "gpu_ledger_meter_hours_metered"
THROUGH = "gpu_ledger_meter_metered_through_timestamp_seconds"
# Measured energy and carbon per team (cost models with `energy:` or `carbon:`; the report's
# team rows, docs/reports.md "Energy and carbon").
ENERGY = "gpu_ledger_team_energy_kwh_month_to_date"
CO2E = "gpu_ledger_team_co2e_kg_month_to_date"
# The cluster's carbon intensity now (the cost model's `carbon:`, the CSV's hour where it has
# one): the live carbon estimate of the recording rules multiplies the last hour's energy by it.
CARBON_INTENSITY = "gpu_ledger_carbon_intensity_grams_per_kwh"
# Per family added up per key (metering/facts.py ADDED_UP_FAMILIES): the GPU-, MIG-instance-
# or container-hours of the run where it had more series than the key's count family, 0 where
# none (docs/metering.md, "Several series for one key").
MORE_SERIES = "gpu_ledger_meter_more_series_hours"
METRICS = (SPEND, BUDGET, WARN_FROM, FORECAST, STATUS, LAST_SUCCESS, HOURS, THROUGH, ENERGY,
           CO2E, CARBON_INTENSITY, MORE_SERIES)

# status label values, one series per state (1 for the team's state, 0 for the others).
STATUS_LABEL = {BudgetStatus.WITHIN: "within", BudgetStatus.HEADING_OVER: "heading_over",
                BudgetStatus.OVER: "over"}


class PushError(Exception):
    """The push failed; one line, for a warning (never fails the metering run)."""


@dataclass(frozen=True)
class RunState:
    """What one successful metering run publishes."""

    cluster: str
    period: Period
    hours: int  # hours of the period metered (device facts present) in this run
    finished: float  # unix seconds
    month: Month | None = None  # the month the budgets are of (None: no budgets published)
    currency: str = ""
    budgets: Sequence[BudgetLine] = ()
    # (team, kWh, kg CO2e or None without `carbon:`) month to date, from the report
    energy: Sequence[tuple[str, float, float | None]] = ()
    carbon_grams_per_kwh: float | None = None  # None: the cost model has no `carbon:`
    # family -> hours of this cluster where the run added up more series than the key's count
    # family had (every family added up per key, 0 where none)
    more_series: Mapping[str, int] = field(default_factory=dict)


def budget_month(period: Period) -> Month:
    """The month of the period's last hour: the month a daily run is spending in."""
    last = utc_naive(period.end) - timedelta(hours=1)
    return Month(last.year, last.month)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    text = repr(float(value)) if math.isfinite(value) else ("NaN" if math.isnan(value)
                                                            else "+Inf" if value > 0 else "-Inf")
    return f"{name}{{{inner}}} {text}" if inner else f"{name} {text}"


def _family(name: str, help_: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} gauge", *samples]


def exposition(state: RunState) -> str:
    """The run's state in the Prometheus text exposition format (0.0.4). The grouping key's
    labels (job, cluster) come from the URL, so no sample repeats them."""
    lines = _family(LAST_SUCCESS, "Unix time the last successful gpu-ledger meter run finished.",
                    [_sample(LAST_SUCCESS, {}, state.finished)])
    lines += _family(HOURS, "Hours with device facts in the last successful run's period.",
                     [_sample(HOURS, {}, state.hours)])
    lines += _family(THROUGH, "Unix time of the end (exclusive) of the last metered period.",
                     [_sample(THROUGH, {}, state.period.end.timestamp())])
    if state.more_series:
        lines += _family(MORE_SERIES, "Hours of the last successful run where a family added "
                         "up per key had more series than the key's gpu_up, gpu_mig_info or "
                         "gpu_container_allocation: twice the value where they overlapped.",
                         [_sample(MORE_SERIES, {"family": f}, n)
                          for f, n in state.more_series.items()])
    if state.month is not None and state.budgets:
        month = str(state.month)

        def team(b: BudgetLine) -> dict[str, str]:
            return {"team": b.team, "month": month, "currency": state.currency}

        lines += _family(SPEND, "Team's bill so far this month: compute charges, energy line "
                         "and adjustments billed in it (cost model currency).",
                         [_sample(SPEND, team(b), float(b.spend)) for b in state.budgets])
        lines += _family(BUDGET, "Team's monthly budget (cost model budgets.monthly).",
                         [_sample(BUDGET, team(b), float(b.budget)) for b in state.budgets])
        lines += _family(WARN_FROM, "Forecast from which the team is heading over its budget: "
                         "budget x budgets.warn_at (cost model currency).",
                         [_sample(WARN_FROM, team(b), float(b.warn_from))
                          for b in state.budgets])
        lines += _family(FORECAST, "Usage so far extrapolated linearly to the month's end, "
                         "plus the adjustments billed in the month.",
                         [_sample(FORECAST, team(b), float(b.forecast))
                          for b in state.budgets if b.forecast is not None])
        lines += _family(STATUS, "1 for the team's budget status (within, heading_over, "
                         "over; as in the report), 0 for the others.",
                         [_sample(STATUS, {**team(b), "status": label},
                                  1.0 if b.status is status else 0.0)
                          for b in state.budgets for status, label in STATUS_LABEL.items()])
    if state.month is not None and state.energy:
        month = str(state.month)
        lines += _family(ENERGY, "Team's measured GPU energy so far this month, kWh.",
                         [_sample(ENERGY, {"team": t, "month": month}, kwh)
                          for t, kwh, _ in state.energy])
        lines += _family(CO2E, "Team's GPU energy so far this month as kg CO2e.",
                         [_sample(CO2E, {"team": t, "month": month}, kg)
                          for t, _, kg in state.energy if kg is not None])
    if state.carbon_grams_per_kwh is not None:
        lines += _family(CARBON_INTENSITY, "The cluster's grid carbon intensity now, gCO2e/kWh "
                         "(cost model carbon:).",
                         [_sample(CARBON_INTENSITY, {}, state.carbon_grams_per_kwh)])
    return "\n".join(lines) + "\n"


def group_url(base: str, cluster: str) -> str:
    """`<base>/metrics/job/<JOB>/cluster/<cluster>` (a cluster name holds no `/`:
    metering.cluster.cluster_name_problem)."""
    return f"{base.rstrip('/')}/metrics/job/{JOB}/cluster/{urllib.parse.quote(cluster, safe='')}"


def push(base: str, state: RunState, timeout: float = TIMEOUT_SECONDS) -> None:
    """PUT the run's state; PushError (one line) when the gateway is unreachable or refuses."""
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PushError(f"expected an http(s):// URL, got {base!r}")
    url = group_url(base, state.cluster)
    req = urllib.request.Request(url, data=exposition(state).encode(), method="PUT",
                                 headers={"Content-Type": "text/plain; version=0.0.4"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip().splitlines()
        raise PushError(f"{url}: HTTP {exc.code}{': ' + body[0][:200] if body else ''}"
                        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PushError(f"{url}: {reason}") from None


def now() -> float:
    return time.time()
