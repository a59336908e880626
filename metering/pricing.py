"""The pricing engine: hourly facts in DuckDB -> `charges`, priced with a cost model.

All row work is set-based SQL in metering/sql/pricing.sql. Python only resolves the cost model
against the few distinct GPU models and namespaces of the period (glob rules are easier to get
right once, in one place, than twice), loads those small tables, and runs the statements all or
nothing: a period of several slices never priced commits slice by slice, noted as unfinished
until the last (metering/unfinished.py); so does a re-price of more than ONE_TRANSACTION_SLICES
slices, its old rows set aside first; any other period is one transaction.
Each cluster is priced on its own, with its own prices and team rules (CostModel.for_cluster).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import duckdb

from metering import pricedhours, sqlfile, unfinished, wastehours
from metering.cluster import DEFAULT_CLUSTER
from metering.costmodel import MICRO, CostModel
from metering.db import memory_limit, memory_limit_bytes, transaction
from metering.energy import hours_of
from metering.partitions import DEFAULT_XCDS, MODES, partition_xcds, partitions
from metering.period import HOUR, Period, utc_aware, utc_naive
from metering.progress import Progress

if TYPE_CHECKING:
    from metering.closes import Freeze

# Temp tables that carry the resolved cost model into SQL; see the header of pricing.sql.
_CONFIG_TABLES: Final = {
    "_p_models": "model VARCHAR, rate_micros BIGINT, model_discount DOUBLE, memory_gb DOUBLE, "
                 "vendor VARCHAR",
    "_p_partitions": "model VARCHAR, mode VARCHAR, parts INTEGER",
    "_p_ns": "namespace VARCHAR, team VARCHAR",
    "_p_team_disc": "team VARCHAR, discount DOUBLE",
    "_p_mig_table": "profile VARCHAR, fraction DOUBLE",
    "_p_vgpu_table": "profile VARCHAR, fraction DOUBLE",
    "_p_eff": "sharing VARCHAR, factor DOUBLE",
    "_p_tiers": "lo DOUBLE, hi DOUBLE, multiplier DOUBLE",
    "_p_idle_weights": "team VARCHAR, weight DOUBLE",
    # per hour of the slice: kWh price and PUE in millionths, gCO2e/kWh in thousandths; price
    # and intensity NULL where the cost model has no `energy:` / `carbon:`
    "_p_energy": "hour TIMESTAMP, price_u BIGINT, pue_u BIGINT, gpk_m BIGINT",
}
_WORK_TABLES: Final = ("_dev", "_alloc", "_rows", "_idle", "_pool", "_share", "_eheld")
_WORK_VIEWS: Final = ("_etot",)
# Integer micros -> DECIMAL(18, 6), integer thousandths (millijoules, milligrams) ->
# DECIMAL(18, 3), without passing through a float.
_MACROS: Final = (
    "CREATE OR REPLACE TEMP MACRO gl_money(m) AS "
    "(CAST(m AS DECIMAL(18, 0)) * CAST(0.000001 AS DECIMAL(18, 6)))::DECIMAL(18, 6)",
    "CREATE OR REPLACE TEMP MACRO gl_milli(m) AS "
    "(CAST(m AS DECIMAL(18, 0)) * CAST(0.001 AS DECIMAL(18, 3)))::DECIMAL(18, 3)",
)


@dataclass(frozen=True)
class PricingResult:
    """Totals of one pricing run. fleet_cost == charged + idle_shared + idle + down + adjustment."""

    start: datetime
    end: datetime
    currency: str
    cost_model_hash: str
    hours: int  # hours of the period with device facts, summed over clusters
    device_hours: int
    rows: int  # rows written to charges
    fleet_cost: Decimal  # what the fleet's device-hours cost at list price
    charged: Decimal  # charged to teams for their own use (after discounts)
    idle_shared: Decimal  # idle cost shared out to teams
    idle: Decimal  # idle cost left on `idle` rows
    down: Decimal  # cost of hours GPUs were down
    adjustment: Decimal  # list price given away (or added) by discounts, tiers, efficiency
    unpriced_allocations: int  # allocation facts with no device fact in that hour
    default_priced_models: tuple[str, ...]  # models that matched no pricing.gpus entry
    adjustment_lines: int = 0  # lines posted for closed hours (metering.closes)
    kept_hours: int = 0  # hours whose charges stood: priced before from the same facts

    @property
    def total(self) -> Decimal:
        return self.charged + self.idle_shared + self.idle + self.down + self.adjustment




def _load_config(con: duckdb.DuckDBPyConnection, model: CostModel,
                 start: datetime, end: datetime, cluster: str) -> tuple[str, ...]:
    for table, columns in _CONFIG_TABLES.items():
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} ({columns})")
    period = [start, end, cluster]
    models = con.execute(
        "SELECT DISTINCT model, vendor FROM device_hours WHERE hour >= ? AND hour < ? "
        "AND cluster = ?", period).fetchall()
    defaults: list[str] = []
    rows: list[tuple[object, ...]] = []
    for name, vendor in models:
        price = model.price_for(name, vendor)
        if price.rule == model.default_price.key:
            defaults.append(name)
        memory = None if price.memory_gb is None else float(price.memory_gb)
        rows.append((name, int(price.hourly / MICRO), float(price.discount), memory, vendor))
    _insert(con, "_p_models", rows)
    # AMD compute partitions per mode of the period's models, for partitions known only by
    # their resource name (amd.com/cpx_nps4); a model not listed counts DEFAULT_XCDS.
    _insert(con, "_p_partitions", [
        (name, mode, n) for name, vendor in models if vendor == "amd"
        for mode in MODES
        if (n := partitions(mode, partition_xcds(name) or DEFAULT_XCDS)) is not None])
    namespaces = [r[0] for r in con.execute(
        "SELECT DISTINCT namespace FROM allocation_hours WHERE hour >= ? AND hour < ? "
        "AND cluster = ?", period).fetchall()]
    _insert(con, "_p_ns", [(ns, model.team_for_namespace(ns)) for ns in namespaces])
    _insert(con, "_p_team_disc", [(t, float(d)) for t, d in model.team_discounts.items()])
    _insert(con, "_p_mig_table", [(p, float(f)) for p, f in model.mig_table.items()])
    _insert(con, "_p_vgpu_table", [(p, float(f)) for p, f in model.vgpu_table.items()])
    _insert(con, "_p_eff", [(m, float(f)) for m, f in model.sharing_efficiency.items()])
    # Tier i covers utilisation in (previous up_to, up_to]; the first starts below 0.
    lows = [-1.0, *(float(t.up_to) for t in model.tiers)][:len(model.tiers)]
    _insert(con, "_p_tiers", [(lo, float(t.up_to), float(t.multiplier))
                              for lo, t in zip(lows, model.tiers, strict=True)])
    _insert(con, "_p_idle_weights", [(t, float(w)) for t, w in model.idle_weights.items()])
    variables: dict[str, object] = {
        "gl_start": start, "gl_end": end, "gl_label": model.team_label,
        "gl_default_team": model.default_team, "gl_mig_fraction": model.mig_fraction,
        "gl_split": model.sharing_split, "gl_fractional": model.fractional_basis,
        "gl_basis": model.basis,
        "gl_usage_weight": float(model.usage_weight), "gl_idle_policy": model.idle_policy,
        "gl_hash": model.hash, "gl_cluster": cluster,
    }
    for name, value in variables.items():
        con.execute(f"SET VARIABLE {name} = ?", [value])
    for macro in _MACROS:
        con.execute(macro)
    return tuple(sorted(defaults))


def _energy_factors(model: CostModel, start: datetime, end: datetime) -> pricedhours.Factors:
    """Each hour of [start, end) with its kWh price, PUE and carbon intensity, in _p_energy's
    integer units. PUE is energy.pue, or 1 without `energy:` (carbon of the GPUs' own
    joules)."""
    energy, carbon = model.energy, model.carbon
    pue = int((energy.pue if energy is not None else Decimal(1)) / MICRO)
    return {h: (None if energy is None else int(energy.price_at(h) / MICRO), pue,
                None if carbon is None else int(carbon.grams_at(h) * 1000))
            for h in hours_of(start, end)}


def _load_energy(con: duckdb.DuckDBPyConnection, factors: pricedhours.Factors,
                 start: datetime, end: datetime) -> None:
    """The hours of [start, end) with their energy factors (_p_energy)."""
    con.execute("DELETE FROM _p_energy")
    _insert(con, "_p_energy", [(h, *factors[h]) for h in hours_of(start, end)])


def _record_cost_model(con: duckdb.DuckDBPyConnection, model: CostModel,
                       start: datetime, end: datetime) -> None:
    """Store the cost model and the prices of the period's GPU models next to the charges."""
    con.execute("INSERT OR REPLACE INTO cost_models VALUES (?, ?, ?, ?, ?)",
                [model.hash, model.name or str(model.path), model.currency, model.text,
                 utc_naive(datetime.now(UTC))])
    models = con.execute(
        "SELECT DISTINCT model, vendor FROM device_hours WHERE hour >= ? AND hour < ?",
        [start, end]).fetchall()
    prices = [model.price_for(m, v) for m, v in models]
    if prices:
        con.executemany("INSERT OR REPLACE INTO cost_model_prices VALUES (?, ?, ?, ?, ?)",
                        [(model.hash, p.model, p.hourly, float(p.discount), p.rule)
                         for p in prices])


def _insert(con: duckdb.DuckDBPyConnection, table: str,
            rows: Sequence[tuple[object, ...]]) -> None:
    if rows:
        marks = ", ".join("?" * len(rows[0]))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


# Hours priced per pass. Every figure in pricing.sql is per hour (device-hours, idle pools
# and shares per hour x model), so pricing a period slice by slice gives the same rows as
# pricing it at once; a slice bounds the memory each statement works in (the month at once
# took a 1,000-node month's process past 2 GB). It does not bound a transaction of several
# slices: DuckDB keeps each slice's replaced work tables until the period commits, spilled
# beyond the cap (27 GB re-pricing an 80,000-GPU month; docs/performance.md), which is why
# hours never priced commit slice by slice (price_period). The slice is the longest of
# SLICE_LADDER whose allocation rows fit the memory cap at PRICING_BYTES_PER_ROW: a week up
# to ~9,000 GPUs; at 40,000 GPUs a week's 7M rows ran out of memory under the 1.5GB cap, a
# day's 1M did not.
SLICE_LADDER: Final = (168, 72, 48, 24, 12, 6, 3, 1)
PRICING_BYTES_PER_ROW: Final = 1_000
# The most slices (of all clusters) a re-price keeps in one transaction; beyond, it commits
# slice by slice with the old rows set aside (price_period). At 80,000 GPUs (12-hour slices)
# one transaction took 0.73x the wall of the copy aside for 3 days and 0.74x for a week (14
# slices, peak RSS 1.8 GiB, 5.5 GB spilled); the month (62) ran out of memory under the 1.5GB
# cap (docs/performance.md, "Re-pricing with the old rows set aside").
ONE_TRANSACTION_SLICES: Final = 14


@dataclass(frozen=True)
class SliceChoice:
    hours: int
    rows_per_hour: int  # allocation rows of the busiest cluster, per hour of the period

    def describe(self, cap: str) -> str:
        return (f"slices of {self.hours} h (automatic: ~{self.rows_per_hour:,} allocation rows "
                f"per hour, ~{self.rows_per_hour * self.hours:,} per slice within DuckDB's "
                f"{cap} cap)")


def choose_slice(con: duckdb.DuckDBPyConnection, start: datetime, end: datetime,
                 budget_bytes: int) -> SliceChoice:
    """The longest slice whose work tables fit `budget_bytes`, from the period's allocation
    rows per hour in its busiest cluster (clusters are priced one after another)."""
    row = con.execute(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM allocation_hours "
        "WHERE hour >= $s AND hour < $e GROUP BY cluster)", {"s": start, "e": end}).fetchone()
    hours = max(1, int((end - start).total_seconds()) // 3600)
    per_hour = -(-int(row[0] if row else 0) // hours)
    fit = budget_bytes // PRICING_BYTES_PER_ROW
    chosen = next((h for h in SLICE_LADDER if per_hour * h <= fit), SLICE_LADDER[-1])
    return SliceChoice(chosen, per_hour)


def _holders_unique(con: duckdb.DuckDBPyConnection, query: str) -> bool:
    row = con.execute(query).fetchone()
    return row is not None and bool(row[0])


def clusters_in(con: duckdb.DuckDBPyConnection, start: datetime, end: datetime) -> list[str]:
    """Clusters with facts or charges in [start, end): what pricing the period rebuilds."""
    rows = con.execute(
        "SELECT cluster FROM device_hours WHERE hour >= $s AND hour < $e "
        "UNION SELECT cluster FROM allocation_hours WHERE hour >= $s AND hour < $e "
        "UNION SELECT cluster FROM charges WHERE hour >= $s AND hour < $e ORDER BY 1",
        {"s": start, "e": end}).fetchall()
    return [str(r[0]) for r in rows]


def price_period(con: duckdb.DuckDBPyConnection, model: CostModel,
                 start: datetime, end: datetime,
                 slice_hours: int | None = None,
                 progress: Progress | None = None,
                 clusters: Sequence[str] | None = None,
                 freeze: Freeze | None = None, keep: bool = False) -> PricingResult:
    """Rebuild `charges` for hours in [start, end) from the facts, all or nothing: where
    there is no freeze and more than one slice (of all clusters) never priced, or more than
    ONE_TRANSACTION_SLICES priced before, one transaction per slice, with the hours noted as
    unfinished until the last and their old pricing rows set aside first (a failure deletes
    what was committed and puts those back: the hours are as before); otherwise in one
    transaction.

    `clusters` limits the rebuild to those clusters (default: every cluster with facts or
    charges in the period); each is priced with model.for_cluster(name) and no other
    cluster's charges are touched. Opens its own transactions, so `con` must not be inside
    one. On any error the period's previous charges stay as they were. The period is priced
    `slice_hours` at a time (same rows, bounded memory; None: chosen from the facts and the
    memory cap, and said to `progress`); `progress` is told about each slice of each
    cluster. `freeze`: the period's closed hours keep their charges and the difference is
    posted as adjustments (metering.closes).
    `keep`: hours priced before from the facts they hold now, with this cost model and
    pricing code, keep their charges instead of being priced again (metering.pricedhours;
    never with `freeze`).
    """
    start, end = utc_naive(start), utc_naive(end)
    if slice_hours is None:
        choice = choose_slice(con, start, end, memory_limit_bytes())
        slice_hours = choice.hours
        if progress is not None:
            progress.message(f"price: {choice.describe(memory_limit())}")
    if slice_hours < 1:
        raise ValueError(f"pricing slice: expected at least 1 hour, got {slice_hours}")
    if end <= start:
        raise ValueError(f"pricing period: expected start before end, got {start} .. {end}")
    sql = sqlfile.load("pricing.sql")
    names = list(clusters) if clusters is not None else clusters_in(con, start, end)
    slices = list(Period(utc_aware(start), utc_aware(end)).chunks(slice_hours))
    # A period of several slices never priced commits each slice on its own, so that DuckDB
    # frees its work tables (in one transaction it keeps every slice's until the end,
    # spilled: 27 GB for an 80,000-GPU month, out of memory under the 1.5GB cap at that size),
    # with the hours noted as unfinished until the last one (metering/unfinished.py). Hours
    # priced before are too, beyond ONE_TRANSACTION_SLICES, with their old rows set aside
    # first so that a run that stops puts them back; up to it, one transaction is cheaper than
    # that copy. Closed hours (freeze) keep one transaction.
    count = len(slices) * len(names)
    written = (None if freeze is not None or count == 1 else
               unfinished.Written.CHARGES if unfinished.fresh(
                   con, start, end, names, unfinished.Written.CHARGES) else
               unfinished.Written.REPRICED if count > ONE_TRANSACTION_SLICES else None)
    in_place = written is not None
    # Row order in `charges` carries no meaning; not keeping it makes the big inserts faster.
    # The caller's setting is restored afterwards.
    row = con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()
    keep_order = bool(row[0]) if row is not None else True
    con.execute("SET preserve_insertion_order = false")
    # The whole period's transaction, or (in place) one per slice and a last one.
    whole, each = ((nullcontext, lambda: transaction(con)) if in_place else
                   (lambda: transaction(con), nullcontext))
    try:
        if written is not None:
            if written.set_aside and progress is not None:  # a copy of every row: minutes
                progress.message("price: the hours hold charges already: copying them aside "
                                 "first, to put back if the run stops")
            with transaction(con):
                unfinished.begin(con, start, end, names, written)
        with unfinished.recovered_on_error(con) if in_place else nullcontext(), whole():
            defaults: set[str] = set()
            with each():
                _record_cost_model(con, model, start, end)
            sums: list[Any] = [0] * 10  # the `totals` row, summed over clusters and slices
            orphans = 0
            kept = 0  # hours whose charges stand (keep)
            if progress is not None:
                progress.total = len(slices) * len(names)
            if freeze is not None:
                freeze.before(con, start, end, names)
                pricedhours.forget(con, start, end, names)  # closed hours hold the closed bill
            now = utc_naive(datetime.now(UTC))
            # The waste device-hours of what is priced (metering/wastehours.py): from the work
            # tables where they give the query's rows, else with the query once charges are
            # final (closed hours' restored, by freeze.after).
            by_query: list[tuple[str, datetime, datetime]] = []
            devices = dict(sql.steps)["devices"]
            unchanged_of: dict[str, dict[datetime, int]] = {}
            for cluster in names:
                priced_with = model.for_cluster(cluster)
                defaults.update(_load_config(con, priced_with, start, end, cluster))
                factors = _energy_factors(priced_with, start, end)
                unchanged = unchanged_of[cluster] = (
                    pricedhours.kept(con, start, end, cluster, priced_with.hash, factors)
                    if keep and freeze is None else {})
                for piece in slices:
                    lo, hi = piece.naive()
                    slice_rows = 0
                    with each():
                        for a, b, same in _runs(lo, hi, unchanged):
                            con.execute("SET VARIABLE gl_start = ?", [a])
                            con.execute("SET VARIABLE gl_end = ?", [b])
                            if same:  # their charges stand: the totals read, nothing written
                                con.execute(devices)
                                pricedhours.touch(con, a, b, cluster, now)
                                hours_kept = hours_of(a, b)
                                orphans += sum(unchanged[h] for h in hours_kept)
                                kept += len(hours_kept)
                            else:
                                wastehours.forget(con, a, b, [cluster])
                                _load_energy(con, factors, a, b)
                                for _, step in sql.steps:
                                    con.execute(step)
                                unpriced = {h: int(n) for h, n in
                                            con.execute(sql.query("orphans")).fetchall()}
                                orphans += sum(unpriced.values())
                                if freeze is None and _holders_unique(
                                        con, sql.query("holders_unique")):
                                    con.execute(sql.query("waste_rows"))
                                else:
                                    by_query.append((cluster, a, b))
                                if freeze is None:
                                    pricedhours.record(con, cluster, priced_with.hash, factors,
                                                       unpriced, a, b, now)
                            row = con.execute(sql.query("totals")).fetchone()
                            assert row is not None
                            sums = [x + y for x, y in zip(sums, row, strict=True)]
                            slice_rows += int(row[9])
                    if progress is not None:
                        where = "" if names == [DEFAULT_CLUSTER] else f"{cluster} "
                        progress.chunk_done(where + piece.label(), f"{slice_rows} charge rows",
                                            slice_rows, "charge rows")
            with each():
                posted = 0 if freeze is None else freeze.after(con, start, end, names,
                                                               model.hash)
                for cluster, lo, hi in by_query:
                    wastehours.compute(con, lo, hi, cluster)
                for cluster in names:  # kept hours are marked already
                    for a, b, same in _runs(start, end, unchanged_of[cluster]):
                        if not same:
                            wastehours.mark(con, a, b, [cluster], now)
                if written is not None:
                    unfinished.done(con, start, end, written)
    finally:
        for view in _WORK_VIEWS:  # before the tables they read
            con.execute(f"DROP VIEW IF EXISTS {view}")
        for table in (*_WORK_TABLES, *_CONFIG_TABLES):
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(f"SET preserve_insertion_order = {str(keep_order).lower()}")
    hours, device_hours, fleet_micros, charged, shared, idle, down, adjustment, _, rows = sums
    return PricingResult(
        start=start, end=end, currency=model.currency, cost_model_hash=model.hash,
        hours=int(hours), device_hours=int(device_hours), rows=int(rows),
        fleet_cost=Decimal(int(fleet_micros)) * MICRO,
        charged=Decimal(charged), idle_shared=Decimal(shared), idle=Decimal(idle),
        down=Decimal(down), adjustment=Decimal(adjustment),
        unpriced_allocations=orphans, default_priced_models=tuple(sorted(defaults)),
        adjustment_lines=posted, kept_hours=kept,
    )


def _runs(start: datetime, end: datetime, kept: Mapping[datetime, int]
          ) -> Iterator[tuple[datetime, datetime, bool]]:
    """[start, end) cut into runs of hours all kept or all to price: (from, to, kept)."""
    hours = hours_of(start, end)
    i = 0
    while i < len(hours):
        same = hours[i] in kept
        j = i + 1
        while j < len(hours) and (hours[j] in kept) == same:
            j += 1
        yield hours[i], hours[j - 1] + HOUR, same
        i = j
