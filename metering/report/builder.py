"""Build a monthly report from the ledger, and write it: the report library.

`make_report` opens the ledger read-only, settles which cost model the charges were priced
with, reads every table (the queries are metering/sql/report.sql, the waste figures
waste.py's) and constructs the `Report` once. `write_report` renders it in the chosen formats
and replaces the files all at once. `gpu-ledger report` (cli.py) and `metering.api` call these.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

import duckdb

import metering
from metering import closes, crosscheck, db, ledgerview, sqlfile
from metering.closes import Adjustment
from metering.costmodel import CostModel, CostModelError, load_cost_model, parse_cost_model
from metering.energy import JOULES_PER_KWH
from metering.errors import InputError, MeteringError, RefusedError, UsageError
from metering.period import HOUR, Month, hour_ranges, utc_naive
from metering.progress import Progress
from metering.report import focus, waste
from metering.report.csvout import render_csv
from metering.report.html import render_html
from metering.report.markdown import render_markdown
from metering.report.model import (
    DEFAULT_TOP_PODS,
    KINDS,
    ChargeDay,
    CostModelInfo,
    Energy,
    EnergyDay,
    Line,
    Maturity,
    ModelCapacity,
    ModelPrice,
    PriceLookup,
    Report,
    StoredCostModel,
    budget_lines,
    maturity_level,
    natural_key,
    utilisation,
)
from metering.report.parquetout import render_parquet
from metering.report.writer import Content, write_files

PACKAGED_MODEL = "cost-model.yaml (packaged default)"
_Q6 = Decimal("0.000001")
_ZERO = Decimal(0)

# format -> (file extension, renderer)
FORMATS: dict[str, tuple[str, Callable[[Report], bytes]]] = {
    "csv": ("csv", render_csv),
    "parquet": ("parquet", render_parquet),
    "md": ("md", lambda r: render_markdown(r).encode("utf-8")),
    "html": ("html", lambda r: render_html(r).encode("utf-8")),
}
# Formats only written when asked for: format -> files (extension, writer into the open file).
ON_REQUEST: dict[str, list[tuple[str, Callable[[Report, BinaryIO], None]]]] = {
    "focus": [("focus.csv", focus.write_csv), ("focus.parquet", focus.write_parquet)],
}


def file_name(month: Month, fmt: str) -> str:
    return f"chargeback-{month}.{FORMATS[fmt][0]}"


def _sql(name: str) -> str:
    return sqlfile.load("report.sql").query(name)


def _month(month: Month) -> dict[str, Any]:
    return {"start": month.start, "end": month.end}


# --- the ledger's tables -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sums:
    """One group's sums, from one row of the `sections` query."""

    allocated: Decimal = _ZERO
    used: Decimal | None = _ZERO  # None: unknown for all of it
    cost: Decimal = _ZERO
    idle_share: Decimal = _ZERO
    sm_unknown: Decimal = _ZERO  # allocated without SM data
    fleet_hours: Decimal = _ZERO  # device-hours of idle and down rows
    sm_unknown_mig: Decimal = _ZERO  # of sm_unknown, on MIG instances (no GPM)
    energy: Energy | None = None  # None: energy not reported (no `energy:` / `carbon:`)

    def line(self, **keys: Any) -> Line:
        return Line(**keys, allocated_gpu_hours=self.allocated, used_gpu_hours=self.used,
                    sm_unknown_gpu_hours=self.sm_unknown, cost=self.cost,
                    idle_share=self.idle_share, fleet_gpu_hours=self.fleet_hours,
                    energy=self.energy)


Key = tuple[tuple[str, ...], str]  # (key values, kind)
_NO_SUMS = Sums()
# section of the `sections` query -> the key columns of its rows
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "fleet": (),
    "clusters": ("cluster",),
    "teams": ("team",),
    "namespaces": ("namespace",),
    "pods": ("team", "namespace", "pod"),
    "models": ("model", "sharing", "profile"),
    "team_days": ("day", "team"),
}
_COLUMNS = ("cluster", "team", "namespace", "pod", "model", "sharing", "profile", "day", "kind")


def _q6(value: Any) -> Decimal:
    return _ZERO if value is None else Decimal(value).quantize(_Q6)


Sections = dict[str, dict[Key, Sums]]


def read_sections(con: Any, month: Month) -> Sections:
    """Every table's sums for `month`, by section and key; {} sections when it has no
    charges."""
    out: Sections = {name: {} for name in SECTION_KEYS}
    con.execute(_sql("report_charges"))
    con.execute(_sql("idle_fleet_table"))
    try:
        for day in month.period().chunks(24):  # a device-hour's rows lie in one day
            lo, hi = day.naive()
            con.execute(_sql("idle_fleet_hours"), {"start": lo, "end": hi})
        rows = con.execute(_sql("sections"), _month(month)).fetchall()
    finally:
        con.execute("DROP TABLE IF EXISTS _gl_idle_fleet")
    for row in rows:
        section, values = str(row[0]), dict(zip(_COLUMNS, row[1:10], strict=True))
        alloc, used, cost, idle, unknown, fleet_hours, unknown_mig = row[11:]
        keys = SECTION_KEYS[section]
        if section == "pods" and not values["pod"]:
            continue  # charges of no pod (idle, down) are not a pod's
        key = (tuple(str(values[k]) for k in keys), str(values["kind"]))
        out[section][key] = Sums(_q6(alloc), None if used is None else _q6(used),
                                 Decimal(cost), Decimal(idle), _q6(unknown), _q6(fleet_hours),
                                 _q6(unknown_mig))
    reported, priced, carbon = con.execute(_sql("energy_reported"), _month(month)).fetchone()
    if not reported:
        return out
    for row in con.execute(_sql("energy_sections"), _month(month)).fetchall():
        section, values = str(row[0]), dict(zip(_COLUMNS, row[1:10], strict=True))
        joules, cost, grams, estimated = row[10:]
        keys = SECTION_KEYS[section]
        if section == "pods" and not values["pod"]:
            continue
        key = (tuple(str(values[k]) for k in keys), str(values["kind"]))
        energy = Energy(kwh=_kwh(joules), cost=Decimal(cost or 0) if priced else None,
                        co2e_kg=(Decimal(grams or 0) / 1000).quantize(_Q6) if carbon else None,
                        estimated_kwh=_kwh(estimated))
        out[section][key] = dataclasses.replace(out[section].get(key, _NO_SUMS), energy=energy)
    # Rows of charges without energy rows (a device without an energy figure) show 0 kWh.
    none = Energy(_ZERO, _ZERO if priced else None, _ZERO if carbon else None, _ZERO)
    for groups in out.values():
        for key, sums in groups.items():
            if sums.energy is None:
                groups[key] = dataclasses.replace(sums, energy=none)
    return out


def _kwh(joules: Any) -> Decimal:
    return (Decimal(joules or 0) / JOULES_PER_KWH).quantize(_Q6)


def _fleet(sections: Sections) -> Sums | None:
    """Whole-fleet sums, or None when the month has no charges at all."""
    return sections["fleet"].get(((), ""))


def _lines(
    keys: Sequence[str],
    current: dict[Key, Sums],
    previous: dict[Key, Sums] | None,
    total: Decimal,
    vanished: bool = True,
) -> list[Line]:
    lines = []
    entries = dict(current)
    if previous is not None and vanished:
        # Groups charged last month but not this one: a zero row keeps their drop visible
        # (and the change column adding up to the fleet's change).
        for key in previous.keys() - current.keys():
            entries[key] = _NO_SUMS
    for key, sums in entries.items():
        prev: Decimal | None = None
        if previous is not None:
            prev = previous[key].cost if key in previous else _ZERO
        values: dict[str, Any] = dict(zip(keys, key[0], strict=True))
        lines.append(
            sums.line(
                **values,
                kind=key[1],
                share_of_total=(sums.cost / total).quantize(_Q6) if total else None,
                previous_cost=prev,
            )
        )
    # Largest cost first, fleet rows last, ties broken by the keys so the order is stable.
    lines.sort(
        key=lambda ln: (
            ln.overhead,
            KINDS.index(ln.kind) if ln.overhead else 0,
            -ln.cost,
            tuple(natural_key(getattr(ln, k)) for k in keys),
        )
    )
    return lines


def stored_cost_model(con: Any, cost_model_hash: str) -> StoredCostModel | None:
    """The ledger's copy of a cost model; None for charges priced before ledgers kept one."""
    try:
        row = con.execute(_sql("stored_cost_model"), {"hash": cost_model_hash}).fetchone()
    except duckdb.CatalogException:  # a ledger from before the table (opened read-only)
        return None
    return StoredCostModel(*row) if row else None


def priced_hashes(con: Any, month: Month) -> list[str]:
    return [str(r[0]) for r in con.execute(_sql("priced_hashes"), _month(month)).fetchall()]


def has_facts(con: Any, month: Month) -> bool:
    """Whether ingest wrote usage for the month (whatever pricing has done with it)."""
    row = con.execute(_sql("has_facts"), _month(month)).fetchone()
    return bool(row and row[0])


def clusters_in(con: Any, month: Month) -> list[str]:
    return [str(r[0]) for r in con.execute(_sql("clusters"), _month(month)).fetchall()]


def covered_hours(con: Any, month: Month) -> set[datetime]:
    """Hours with data from every cluster metered in the month."""
    return {r[0] for r in con.execute(_sql("covered_hours"), _month(month)).fetchall()}


def elapsed_hours(con: Any, month: Month) -> int:
    """Hours from the month's start through the last hour with data or charges (0 if none)."""
    row = con.execute(_sql("last_hour"), _month(month)).fetchone()
    if row is None or row[0] is None:
        return 0
    return int((row[0] - month.start) / HOUR) + 1


def _capacity(
    con: Any, month: Month, models: list[Line], prices: PriceLookup | None
) -> list[ModelCapacity]:
    """Per GPU model: the device-hours the fleet owned, with the model rows' hours."""
    devices = dict(con.execute(_sql("capacity_devices"), _month(month)).fetchall())
    hours: dict[str, int] = {}
    for day in month.period().chunks(24):  # a day's union at a time: bounded memory
        lo, hi = day.naive()
        for model, n in con.execute(_sql("capacity_hours"), {"start": lo, "end": hi}
                                    ).fetchall():
            hours[model] = hours.get(model, 0) + int(n)
    allocated: dict[str, Decimal] = {}
    down: dict[str, Decimal] = {}
    used: dict[str, Decimal] = {}
    unknown: dict[str, Decimal] = {}
    for ln in models:
        allocated[ln.model] = allocated.get(ln.model, _ZERO) + ln.allocated_gpu_hours
        used[ln.model] = used.get(ln.model, _ZERO) + (ln.used_gpu_hours or _ZERO)
        unknown[ln.model] = unknown.get(ln.model, _ZERO) + ln.sm_unknown_gpu_hours
        if ln.kind == "down":
            down[ln.model] = down.get(ln.model, _ZERO) + ln.fleet_gpu_hours
    return [
        ModelCapacity(
            model=str(model),
            devices=int(devices[model]),
            capacity_gpu_hours=Decimal(hours.get(model, 0)),
            allocated_gpu_hours=allocated.get(model, _ZERO),
            down_gpu_hours=down.get(model, _ZERO),
            price=prices(model) if prices is not None else None,
            used_gpu_hours=used.get(model, _ZERO),
            sm_unknown_gpu_hours=unknown.get(model, _ZERO),
        )
        for model in sorted(devices)
    ]


def _maturity(now: list[ModelCapacity], before: list[ModelCapacity] | None) -> list[Maturity]:
    """Per model, then the fleet (model ''), with last month's figures where the ledger has
    them."""

    def fleet(caps: list[ModelCapacity]) -> tuple[Decimal | None, int | None]:
        u = utilisation(sum((c.used_gpu_hours for c in caps), _ZERO),
                        sum((c.capacity_gpu_hours for c in caps), _ZERO),
                        sum((c.sm_unknown_gpu_hours for c in caps), _ZERO))
        return u, maturity_level(u)

    prev = {c.model: c for c in before or []}
    out = []
    for c in now:
        p = prev.get(c.model)
        out.append(Maturity(c.model, c.utilisation, c.maturity,
                            p.utilisation if p else None, p.maturity if p else None))
    if now:
        u, level = fleet(now)
        pu, plevel = fleet(before) if before else (None, None)
        out.append(Maturity("", u, level, pu, plevel))
    return out


T = TypeVar("T")

# Rows per fetch of the FOCUS export's days: a month of 80,000 GPUs is ~1.1M charge days, held
# as objects at once 1-1.5 GB (docs/performance.md).
DAY_BATCH = 50_000


def read_charge_days(con: Any, month: Month) -> Iterator[ChargeDay]:
    """The month's charges at the FOCUS export's grain (model.ChargeDay), read DAY_BATCH rows
    at a time: `con` runs nothing else until they are all read."""
    con.execute(_sql("charge_days"), _month(month))
    while rows := con.fetchmany(DAY_BATCH):
        for (day, team, ns, pod, mdl, sharing, profile, kind, cluster, charged, alloc, used,
             cost, idle) in rows:
            yield ChargeDay(day, team, ns, pod, mdl, sharing, profile, kind, _q6(charged),
                            _q6(alloc), None if used is None else _q6(used), Decimal(cost),
                            Decimal(idle), cluster)


def read_energy_days(con: Any, month: Month) -> Iterator[EnergyDay]:
    """The month's energy at the FOCUS export's grain (model.EnergyDay), as read_charge_days."""
    con.execute(_sql("energy_days"), _month(month))
    while rows := con.fetchmany(DAY_BATCH):
        for day, team, ns, pod, mdl, sharing, profile, kind, cluster, joules, cost, grams in rows:
            yield EnergyDay(day, team, ns, pod, mdl, sharing, profile, kind, cluster,
                            _kwh(joules), None if cost is None else Decimal(cost),
                            None if grams is None else (Decimal(grams) / 1000).quantize(_Q6))


def charged_models(con: Any, month: Month) -> tuple[list[str], list[str]]:
    """The clusters and the GPU models (not '') the month's charges name."""
    rows = con.execute(_sql("charged_models"), _month(month)).fetchall()
    return sorted({c for c, _ in rows}), sorted({m for _, m in rows if m})


@dataclasses.dataclass(frozen=True)
class _Streamed(Generic[T]):
    """Rows read again from the ledger each time they are iterated (the FOCUS export's two
    files), while the connection `read` uses is open (write_report holds it)."""

    read: Callable[[], Iterator[T]]

    def __iter__(self) -> Iterator[T]:
        return self.read()


def build_report(
    con: Any,
    month: Month,
    cost_model: CostModelInfo,
    tool_version: str,
    top_pods: int = DEFAULT_TOP_PODS,
    prices: PriceLookup | None = None,
    budgets: Mapping[str, Decimal] | None = None,
    warn_at: Decimal = Decimal(1),
    cluster: str = "",
    *,
    savings: list[waste.Recommendation] | None = None,
    notes: Sequence[str] = (),
    default_priced: Sequence[str] = (),
    now: datetime | None = None,
    closed_at: datetime | None = None,
    adjustments_out: Sequence[Adjustment] = (),
    adjustments_in: Sequence[Adjustment] = (),
) -> Report:
    """Read the month's charges (and the previous month's, for the change) into the report's
    tables, and construct the Report with what the caller computed apart (savings; the FOCUS
    rows and per-cluster prices are added by with_days). `con` sees the ledger the report is
    about (metering.ledgerview: the whole fleet, or one cluster's rows, named by `cluster`).
    `now` (default: the clock) tells a closed month, whose budgets show actuals, from an open
    one."""
    closed = month.end <= utc_naive(now or datetime.now(UTC))
    covered = covered_hours(con, month)
    every_hour = (month.start + i * HOUR for i in range(month.hours))
    missing = hour_ranges(h for h in every_hour if h not in covered)

    prev_month = month.previous()
    current = read_sections(con, month)
    fleet_now = _fleet(current)
    before = read_sections(con, prev_month)
    fleet_prev = _fleet(before)
    has_previous = fleet_prev is not None
    total = fleet_now.cost if fleet_now else _ZERO

    def section(name: str, vanished: bool = True) -> list[Line]:
        prev = before[name] if has_previous else None
        return _lines(SECTION_KEYS[name], current[name], prev, total, vanished)

    fleet_line = (fleet_now or _NO_SUMS).line(
        share_of_total=Decimal(1).quantize(_Q6) if total else None,
        previous_cost=fleet_prev.cost if fleet_prev else None,
    )
    team_days = _lines(SECTION_KEYS["team_days"], current["team_days"], None, total)
    team_days.sort(key=lambda ln: (ln.day, ln.overhead, ln.kind, ln.team))
    models = section("models")
    teams = section("teams")
    elapsed = elapsed_hours(con, month)
    capacity = _capacity(con, month, models, prices)
    capacity_before = None
    if has_previous:
        prev_models = _lines(SECTION_KEYS["models"], before["models"], None, _ZERO)
        capacity_before = _capacity(con, prev_month, prev_models, None)
    return Report(
        month=month,
        cost_model=cost_model,
        tool_version=tool_version,
        hours_with_data=len(covered),
        missing=missing,
        fleet=fleet_line,
        teams=teams,
        namespaces=section("namespaces"),
        models=models,
        pods=section("pods", vanished=False)[:top_pods],
        team_days=team_days,
        has_previous=has_previous,
        has_data=fleet_now is not None,
        top_pods=top_pods,
        notes=list(notes),
        default_priced_models=list(default_priced),
        sm_unknown_mig_gpu_hours=fleet_now.sm_unknown_mig if fleet_now else _ZERO,
        capacity=capacity,
        maturity=_maturity(capacity, capacity_before),
        savings=savings,
        budgets=None if budgets is None
        else budget_lines(teams, budgets, warn_at, elapsed, month.hours, closed=closed,
                          adjustments_in=adjustments_in),
        elapsed_hours=elapsed,
        closed=closed,
        cluster=cluster,
        clusters=section("clusters"),
        closed_at=closed_at,
        adjustments_out=list(adjustments_out),
        adjustments_in=list(adjustments_in),
    )


def with_days(report: Report, days: Iterable[ChargeDay], energy_days: Iterable[EnergyDay],
              cluster_prices: Mapping[str, Mapping[str, ModelPrice]]) -> Report:
    """`report` with the month's charge and energy days (the FOCUS export's rows) and the
    per-cluster prices they are billed at; energy days only where the report shows energy."""
    return dataclasses.replace(
        report, charge_days=days,
        energy_days=energy_days if report.fleet.energy is not None else [],
        cluster_prices=dict(cluster_prices))


# --- the cost model the charges were priced with ---------------------------------------


def meter_command(month: Month, db_path: str, cost_model: str | None = None) -> str:
    """The command that (re-)prices a month from the facts already in the database."""
    cmd = f"gpu-ledger meter --price-only --month {month} --db {db_path}"
    return cmd + (f" --cost-model {cost_model}" if cost_model else "")


def _cost_model_info(
    month: Month, hashes: list[str], given: str | None, cm: CostModel, db_path: str
) -> CostModelInfo:
    """Which cost model the report states: the one the charges were priced with."""
    if len(hashes) > 1:
        raise RefusedError(
            f"charges for {month} were priced with {len(hashes)} different cost models "
            f"({', '.join(h[:12] for h in hashes)}): re-price the month with one cost model "
            f"({meter_command(month, db_path)}) before reporting it"
        )
    name = given if given is not None else cm.name or PACKAGED_MODEL
    if not hashes or hashes[0] == cm.hash:
        return CostModelInfo(name, str(cm.hash), str(cm.currency))
    if given is not None:
        raise RefusedError(
            f"{given}: charges for {month} were priced with cost model {hashes[0]}, but this "
            f"file has hash {cm.hash}; re-price the month with it "
            f"({meter_command(month, db_path, given)}) or leave out --cost-model"
        )
    # Priced with a file we cannot name: state the hash the charges carry, and no file.
    return CostModelInfo("", hashes[0], "")


def _ledger_cost_model(con: duckdb.DuckDBPyConnection, hashes: list[str]) -> CostModel | None:
    """The cost model the month was priced with, as the ledger keeps it next to the charges."""
    stored = stored_cost_model(con, hashes[0]) if len(hashes) == 1 else None
    if stored is None:
        return None
    try:
        return parse_cost_model(stored.text, stored.name)
    except CostModelError:  # kept by a version whose rules were looser: state what is stored
        return None


def price_lookup(cm: CostModel) -> PriceLookup:
    """The report's view of a cost model's prices: rate, the entry that set it, fallback."""
    rules = {r.key: r for r in (cm.default_price, *cm.gpus)}

    def lookup(gpu_model: str) -> ModelPrice:
        resolved = cm.price_for(gpu_model)
        rule = rules[resolved.rule]
        text = str(resolved.rule)
        if rule.model is not None:
            text += f' (model "{rule.model}")'
        elif rule.pattern is not None:
            text += f' (pattern "{rule.pattern}")'
        if rule.derived is not None:
            text += ", derived from purchase price, power and overhead"
        if resolved.guest is not None:  # a vGPU type: its share of the whole GPU's price
            text += f"; vGPU guest: {resolved.guest.fraction:g} of it ({resolved.guest.basis})"
        fallback = rule.model is None and rule.pattern is None
        return ModelPrice(resolved.hourly, text, fallback, resolved.discount)

    return lookup


def price_warnings(con: Any, month: Month, cm: CostModel) -> tuple[list[str], list[str]]:
    """What a finance reader must know about the prices before the figures (a model no entry
    matched, a vGPU type priced by an entry written for whole GPUs), and the GPU models that
    fell to pricing.default (--strict-prices refuses those)."""
    defaults: dict[str, tuple[Decimal, list[str]]] = {}  # model -> price, clusters
    guests: dict[str, tuple[str, list[str]]] = {}  # "model price" -> text, clusters
    rows = con.execute(_sql("cluster_models"), _month(month)).fetchall()
    for cluster, gpu, vendor in rows:
        c = cm.for_cluster(cluster)
        price = c.price_for(gpu, vendor)
        if price.rule == c.default_price.key:
            defaults.setdefault(gpu, (price.hourly, []))[1].append(cluster)
        if price.guest is not None and price.guest.fraction > 0:
            rule = price_lookup(c)(gpu).rule.split(";")[0]  # the entry, without the share
            hourly = f"{price.hourly:,.6f}".rstrip("0").rstrip(".")
            text = (f'vGPU type "{gpu}" matched {rule}, an entry for whole GPUs: priced at '
                    f"{price.guest.fraction:g} of it ({price.guest.basis}) = {hourly} "
                    f"{cm.currency} per GPU-hour")
            guests.setdefault(f"{gpu} {hourly}", (text, []))[1].append(cluster)
    several = len({r[0] for r in rows}) > 1

    def where(clusters: list[str]) -> str:
        return f" (cluster {', '.join(clusters)})" if several else ""

    notes = [f"DEFAULT PRICE: no pricing.gpus entry matches {gpu}: {hourly:,.2f} "
             f"{cm.currency} per GPU-hour{where(cl)} (pricing.default); add an entry, or "
             "refuse such a month with --strict-prices"
             for gpu, (hourly, cl) in defaults.items()]
    notes += [f"WARNING: {text}{where(cl)}. If its host cluster is metered too, its vGPU rows "
              "already bill this hardware: set vgpu.guests: exclude for this cluster "
              "(docs/cost-model.md)" for text, cl in guests.values()]
    return notes, sorted(defaults)


def _open(path: str, cluster: str | None) -> duckdb.DuckDBPyConnection:
    """The ledger as the report reads it: read-only views, one cluster's rows with --cluster."""
    try:
        return ledgerview.open_ledger(path, cluster)
    except ledgerview.LedgerError as e:
        raise InputError(str(e)) from None


def make_report(
    db_path: str, month: Month, cost_model_path: str | None, top: int, charge_days: bool = False,
    settings: waste.Settings | None = None, cluster: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Report:
    """The report of `month` from the ledger at `db_path` (DuckDB file or export directory),
    read-only. RefusedError when the month is not metered or not priced as stated. `note` is
    told what the log should say (waste device-hours computed instead of read as stored)."""
    con = _open(db_path, cluster)
    try:
        report = _report(con, db_path, month, cost_model_path, top, charge_days, settings,
                         cluster, note)
        # Read now, the connection closes here.
        return with_days(report, list(report.charge_days), list(report.energy_days),
                         report.cluster_prices)
    finally:
        con.close()


def _report(
    con: Any, db_path: str, month: Month, cost_model_path: str | None, top: int,
    charge_days: bool, settings: waste.Settings | None, cluster: str | None,
    note: Callable[[str], None] | None,
) -> Report:
    """make_report's report from the open ledger `con`; the charge and energy days (with
    `charge_days`) read from `con` when they are iterated."""
    given = load_cost_model(cost_model_path) if cost_model_path is not None else None
    hashes = priced_hashes(con, month)
    # The report only reads: pricing is the explicit `meter --price-only` step.
    if not hashes and has_facts(con, month):
        raise RefusedError(
            f"{db_path}: {month} has GPU usage but no charges (it was ingested, not "
            f"priced); price it first: {meter_command(month, db_path, cost_model_path)}"
        )
    if not hashes:
        raise RefusedError(
            f"{db_path}: no metered data for {month}; meter it first: gpu-ledger meter "
            f"--prometheus URL --month {month} --db {db_path}"
        )
    cm = given or _ledger_cost_model(con, hashes) or load_cost_model(None)
    info = _cost_model_info(month, hashes, cost_model_path, cm, db_path)
    crosscheck.check_month(con, month, db_path)  # no doubled or orphaned device-hours
    # Figures that need the cost model are left out when the charges carry another one.
    same = info.hash == cm.hash
    if same and cluster is not None:
        cm = cm.for_cluster(cluster)  # the prices and rules that cluster was priced with
    # Prices per GPU model are one figure only where every cluster has the same ones.
    uniform = cluster is not None or not (set(cm.clusters) & set(clusters_in(con, month)))
    warnings, default_priced = price_warnings(con, month, cm) if same else ([], [])
    recs = waste.recommend(con, month.start, month.end, waste.mig_fraction(cm),
                           settings or waste.Settings(), note) if same else None
    budgets = cm.budgets if same else None
    report = build_report(
        con, month, info, metering.__version__, top,
        price_lookup(cm) if same and uniform else None,
        budgets.monthly if budgets else None,
        budgets.warn_at if budgets else Decimal(1),
        cluster or "", savings=recs,
        notes=warnings, default_priced=default_priced,
        # the close and its adjustments (metering/closes.py)
        closed_at=closes.closed_months(con).get(month),
        adjustments_out=closes.adjustments(con, for_month=month),
        adjustments_in=closes.adjustments(con, posted_month=month),
    )
    if not charge_days:
        return report
    # The days are read after the report's queries and streamed: a month of 80,000 GPUs
    # is ~1.1M charge days, which held through those queries made the FOCUS export's peak.
    by_cluster: dict[str, dict[str, ModelPrice]] = {}
    if same:
        clusters, models = charged_models(con, month)
        for name in clusters:
            lookup = price_lookup(cm.for_cluster(name))
            by_cluster[name] = {m: lookup(m) for m in models}
    return with_days(report, _Streamed(lambda: read_charge_days(con, month)),
                     _Streamed(lambda: read_energy_days(con, month)), by_cluster)


# --- writing ---------------------------------------------------------------------------------


def parse_formats(values: list[str] | None) -> list[str]:
    """The formats named by --format values (comma-separated, repeatable); default FORMATS."""
    if not values:
        return list(FORMATS)
    chosen: list[str] = []
    for value in values:
        for name in (v.strip().lower() for v in value.split(",")):
            if name not in FORMATS and name not in ON_REQUEST:
                known = ",".join([*FORMATS, *ON_REQUEST])
                raise UsageError(f"--format: expected some of {known}, got {name!r}")
            if name not in chosen:
                chosen.append(name)
    return chosen


def render(report: Report, chosen: list[str]) -> dict[str, Content]:
    """Each chosen format's files: the report formats rendered, the on-request ones as
    functions that write them when write_files opens their file (UsageError from there when
    the export cannot be made)."""
    files: dict[str, Content] = {}
    for f in chosen:
        if f in FORMATS:
            files[file_name(report.month, f)] = FORMATS[f][1](report)
            continue
        for ext, writer in ON_REQUEST[f]:
            files[f"chargeback-{report.month}.{ext}"] = functools.partial(
                _export, f, writer, report)
    return files


def _export(fmt: str, writer: Callable[[Report, BinaryIO], None], report: Report,
            out: BinaryIO) -> None:
    try:
        writer(report, out)
    except focus.FocusError as e:
        raise UsageError(f"--format {fmt}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Written:
    """A report written by `write_report`: what it says, and the files it wrote."""

    report: Report
    files: list[Path]


def write_report(db_path: str | Path, month: Month, out: str | Path, *,
                 formats: list[str] | None = None, cost_model_path: str | None = None,
                 top: int = DEFAULT_TOP_PODS, settings: waste.Settings | None = None,
                 cluster: str | None = None, memory_limit: str | None = None,
                 progress: Progress | None = None,
                 note: Callable[[str], None] | None = None) -> Written:
    """Read `month` from the ledger (read-only), render `formats` (default csv, parquet, md,
    html; `focus` on request) and write them into `out`, all files or none. Every failure is
    a MeteringError (not metered or not priced: RefusedError; files not written: exit 1)."""
    chosen = parse_formats(formats)
    with db.memory_cap(memory_limit, f"{db_path}: reporting {month}"):
        # One read-only connection until every file is written: the FOCUS export's days are
        # read from it as they are written, from the ledger the report was made of.
        con = _open(str(db_path), cluster)
        try:
            report = _report(con, str(db_path), month, cost_model_path, top,
                             "focus" in chosen, settings, cluster, note)
            if progress is not None:
                progress.chunk_done("read the ledger")
            files = render(report, chosen)
            if progress is not None:
                progress.chunk_done("rendered", amount=len(files), what="files")
            try:
                written = write_files(Path(out), files)
            except OSError as e:
                raise MeteringError(
                    f"{out}: cannot write the report ({e.strerror or e}); previous report "
                    "files are unchanged"
                ) from None
        finally:
            con.close()
    if progress is not None:
        progress.chunk_done("written")
    # The days were streamed into the files; the connection they were read from is closed.
    return Written(with_days(report, [], [], report.cluster_prices), written)

