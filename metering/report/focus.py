"""The month as FinOps FOCUS rows (FOCUS 1.2), for finance tools that ingest cloud bills.

One row per UTC day x team x namespace x pod x GPU model x sharing mode x MIG profile, plus
the fleet's own rows (idle, down, adjustment). Every Mandatory column of the specification is
present (the list is data: metering/data/focus-columns.yaml, with its source); GPU Ledger's
own figures follow as `x_` columns. The mapping is documented in docs/reports.md.

Money: BilledCost = EffectiveCost = ContractedCost = the charge; ListCost = ListUnitPrice x
PricingQuantity at the cost model's list price. Idle cost shared out to a team is its own row
(no unit price), so the product rule of the specification holds on every row that has one.
Summed over the file, BilledCost and ListCost both equal the fleet's cost. Where the month's
energy is reported (cost model `energy:` / `carbon:`), energy rows follow with kWh and kg CO2e
as `x_` columns (FOCUS 1.2 has none); BilledCost then adds the energy line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from importlib import resources
from itertools import islice
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from metering.closes import Adjustment
from metering.report.csvout import neutralise
from metering.report.model import ChargeDay, EnergyDay, ModelPrice, Report

PROVIDER_DEFAULT = "GPU platform"
TAG_PREFIX = "gpu-ledger/"  # provider-defined tag keys carry a prefix (FOCUS Tags)
UNIT = "GPU-Hours"  # FOCUS UnitFormat: <singular-unit>-<plural-time-units>
_DAY = timedelta(days=1)
_ZERO = Decimal(0)
_Q6 = Decimal("0.000001")


@dataclass(frozen=True)
class SpecColumn:
    id: str
    feature_level: str  # Mandatory | Conditional | Recommended
    data_type: str  # String | Decimal | Date/Time | JSON
    allows_nulls: bool


@dataclass(frozen=True)
class Spec:
    version: str
    columns: dict[str, SpecColumn]

    @property
    def mandatory(self) -> list[str]:
        return [c.id for c in self.columns.values() if c.feature_level == "Mandatory"]


@cache
def spec() -> Spec:
    """The FOCUS column list shipped with the package."""
    text = (resources.files("metering") / "data" / "focus-columns.yaml").read_text("utf-8")
    doc = yaml.safe_load(text)
    cols = {c["id"]: SpecColumn(c["id"], c["feature_level"], c["data_type"], c["allows_nulls"])
            for c in doc["columns"]}
    return Spec(str(doc["focus_version"]), cols)


# The FOCUS columns written, in the order written (alphabetical, as the spec allows), then the
# custom ones. Types: the spec's for FOCUS columns; ours for x_ columns.
FOCUS_COLUMNS = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "EffectiveCost", "InvoiceIssuerName",
    "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ResourceId", "ResourceName", "ResourceType",
    "ServiceCategory", "ServiceName", "SkuId", "SubAccountId", "SubAccountName", "Tags",
)  # fmt: skip
CUSTOM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("x_FocusVersion", "String"),
    ("x_Team", "String"),
    ("x_Namespace", "String"),
    ("x_GpuModel", "String"),
    ("x_SharingMode", "String"),
    ("x_MigProfile", "String"),
    # team | idle | down | adjustment | idle-share; energy | idle-energy | down-energy (the
    # energy lines, when the month's energy is reported)
    ("x_RowKind", "String"),
    ("x_AllocatedGpuHours", "Decimal"),
    ("x_UsedGpuHours", "Decimal"),
    ("x_CostModelHash", "String"),
)


# FOCUS (1.2, the newest release; checked up to FOCUS_Spec 04f8bb3) has no energy or carbon
# column: GPU Ledger's are `x_` columns, written when the month's energy is reported.
ENERGY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("x_EnergyKwh", "Decimal"),
    ("x_CarbonKgCO2e", "Decimal"),
)
ENERGY_UNIT = "kWh"


def column_types(report: Report | None = None) -> list[tuple[str, str]]:
    s = spec()
    energy = list(ENERGY_COLUMNS) if report is not None and report.energy_shown else []
    return [(c, s.columns[c].data_type) for c in FOCUS_COLUMNS] + list(CUSTOM_COLUMNS) + energy


Row = dict[str, Any]


class FocusError(Exception):
    """The month cannot be written as FOCUS (a figure the specification requires is unknown)."""


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _description(cd: ChargeDay, part: str) -> str:
    where = cd.model + (f" ({cd.sharing}{' ' + cd.profile if cd.profile else ''})"
                        if cd.sharing and not cd.kind else "")
    if part == "idle-share":
        return f"Share of idle {cd.model} GPU time charged to team {cd.team}"
    if cd.kind == "idle":
        return f"Idle {cd.model} GPU time (allocated to nobody)"
    if cd.kind == "down":
        return f"{cd.model} GPU time while the GPU was down or unseen"
    if cd.kind == "adjustment":
        return f"List price of {cd.model} GPU time given away by discounts, tiers or factors"
    return f"GPU time on {where} for pod {cd.namespace}/{cd.pod}"


def rows(report: Report, provider: str = PROVIDER_DEFAULT) -> Iterator[Row]:
    """FOCUS rows for the report's charge days; FocusError when a list price is unknown."""
    currency = report.cost_model.currency
    if not currency:
        raise FocusError("FOCUS needs the billing currency: pass --cost-model with the cost "
                         "model the month was priced with")
    prices: dict[str, ModelPrice | None] = {c.model: c.price for c in report.capacity}
    version = spec().version
    base: Row = {
        "BillingAccountId": provider, "BillingAccountName": provider,
        "BillingCurrency": currency,
        "BillingPeriodStart": report.month.start, "BillingPeriodEnd": report.month.end,
        "ChargeClass": None, "InvoiceIssuerName": provider, "ProviderName": provider,
        "PublisherName": provider, "ServiceCategory": "Compute",
        "ServiceName": "Kubernetes GPUs", "x_FocusVersion": version,
        "x_CostModelHash": report.cost_model.hash,
    }
    for cd in report.charge_days:
        price = report.cluster_prices.get(cd.cluster, {}).get(cd.model) or prices.get(cd.model)
        if price is None and cd.kind != "adjustment":
            raise FocusError(f"FOCUS needs the list price of {cd.model!r}: pass --cost-model "
                             "with the cost model the month was priced with")
        parts = [("main", cd.cost - cd.idle_share)]
        if cd.idle_share and cd.charged_gpu_hours:
            parts.append(("idle-share", cd.idle_share))
        elif cd.idle_share:  # a weighted idle-share row: all of it is idle
            parts = [("idle-share", cd.cost)]
        for part, amount in parts:
            yield {**base, **_row(cd, part, amount, price), "x_EnergyKwh": None,
                   "x_CarbonKgCO2e": None}
    for ed in report.energy_days:
        yield {**base, **_energy_row(ed)}
    for adj in report.adjustments_in:
        yield {**base, **_correction(adj)}


def _correction(adj: Adjustment) -> Row:
    """An adjustment for a closed month (metering/closes.py) as FOCUS 1.2 bills a correction
    to a previously invoiced billing period (specification/columns/chargeclass.md): billed
    in this month's billing period, ChargeClass "Correction", and its charge period the closed
    month whose usage it corrects. The amount is the change, so it may be negative."""
    gpu_hours = Decimal(repr(adj.allocated_gpu_hours)).quantize(_Q6)
    fleet_row = adj.team in ("idle", "down", "adjustment")
    tags = {f"{TAG_PREFIX}{k}": v for k, v in (
        ("team", adj.team), ("namespace", adj.namespace), ("cluster", adj.cluster),
        ("corrects", str(adj.for_month))) if v}
    return {
        "BilledCost": adj.cost, "ContractedCost": adj.cost, "EffectiveCost": adj.cost,
        "ListCost": adj.cost, "ListUnitPrice": None,
        "ChargeCategory": "Usage", "ChargeClass": "Correction",
        "ChargeDescription": f"Correction for {adj.for_month}: GPU time metered after the month "
                             f"was closed ({adj.namespace or adj.team})",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": adj.for_month.start, "ChargePeriodEnd": adj.for_month.end,
        "ConsumedQuantity": gpu_hours, "ConsumedUnit": UNIT, "PricingCategory": "Standard",
        "PricingQuantity": gpu_hours, "PricingUnit": UNIT,
        "ResourceId": None, "ResourceName": None, "ResourceType": None, "SkuId": None,
        "SubAccountId": adj.team, "SubAccountName": adj.team,
        "Tags": json.dumps(tags, sort_keys=True, ensure_ascii=False),
        "x_Team": "" if fleet_row else adj.team, "x_Namespace": adj.namespace,
        "x_GpuModel": "", "x_SharingMode": "", "x_MigProfile": "", "x_RowKind": "correction",
        "x_AllocatedGpuHours": gpu_hours, "x_UsedGpuHours": None,
        "x_EnergyKwh": None, "x_CarbonKgCO2e": None,
    }


def _energy_row(ed: EnergyDay) -> Row:
    """The energy line of a charge day: its kWh at the hours' tariff (a cost model without
    `energy:` has it inside the device-hour rate, so 0 here) and its CO2e."""
    cost = ed.cost if ed.cost is not None else _ZERO
    what = (f"pod {ed.namespace}/{ed.pod}" if ed.pod and not ed.kind
            else "idle GPUs (SMs not busy or nobody holding)" if ed.kind == "idle"
            else "GPUs while down or unseen" if ed.kind == "down" else f"team {ed.team}")
    tags = {f"{TAG_PREFIX}{k}": v for k, v in (
        ("team", ed.team), ("namespace", ed.namespace), ("gpu-model", ed.model),
        ("sharing", ed.sharing), ("mig-profile", ed.profile), ("cluster", ed.cluster),
        ("line", "energy")) if v}
    is_pod = bool(ed.pod) and not ed.kind
    return {
        "BilledCost": cost, "ContractedCost": cost, "EffectiveCost": cost, "ListCost": cost,
        "ListUnitPrice": None,  # the tariff's price varies by hour
        "ChargeCategory": "Usage",
        "ChargeDescription": f"Measured energy of {what} on {ed.model}",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": ed.day, "ChargePeriodEnd": ed.day + _DAY,
        "ConsumedQuantity": ed.kwh, "ConsumedUnit": ENERGY_UNIT,
        "PricingCategory": "Standard", "PricingQuantity": ed.kwh, "PricingUnit": ENERGY_UNIT,
        "ResourceId": f"{ed.namespace}/{ed.pod}" if is_pod else None,
        "ResourceName": ed.pod if is_pod else None,
        "ResourceType": "Kubernetes Pod" if is_pod else None,
        "SkuId": ed.model or None,
        "SubAccountId": ed.team, "SubAccountName": ed.team,
        "Tags": json.dumps(tags, sort_keys=True, ensure_ascii=False),
        "x_Team": ed.team if not ed.kind else "", "x_Namespace": ed.namespace,
        "x_GpuModel": ed.model, "x_SharingMode": ed.sharing, "x_MigProfile": ed.profile,
        "x_RowKind": "energy" if not ed.kind else f"{ed.kind}-energy",
        "x_AllocatedGpuHours": _ZERO, "x_UsedGpuHours": None,
        "x_EnergyKwh": ed.kwh, "x_CarbonKgCO2e": ed.co2e_kg,
    }


def _row(cd: ChargeDay, part: str, amount: Decimal, price: ModelPrice | None) -> Row:
    usage = cd.kind != "adjustment"
    unit_price = price.hourly if price is not None and part == "main" and usage else None
    quantity = cd.charged_gpu_hours if part == "main" else _ZERO
    list_cost = (unit_price * quantity).quantize(_Q6) if unit_price is not None else (
        amount if usage else _ZERO)
    kind = "idle-share" if part == "idle-share" else (cd.kind or "team")
    tags = {f"{TAG_PREFIX}{k}": v for k, v in (
        ("team", cd.team), ("namespace", cd.namespace), ("gpu-model", cd.model),
        ("sharing", cd.sharing), ("mig-profile", cd.profile), ("cluster", cd.cluster)) if v}
    is_pod = bool(cd.pod) and part == "main"
    return {
        "BilledCost": amount, "ContractedCost": amount, "EffectiveCost": amount,
        "ListCost": list_cost, "ListUnitPrice": unit_price,
        "ChargeCategory": "Usage" if usage else "Adjustment",
        "ChargeDescription": _description(cd, part),
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": cd.day, "ChargePeriodEnd": cd.day + _DAY,
        "ConsumedQuantity": (cd.allocated_gpu_hours if not cd.kind else cd.charged_gpu_hours)
        if usage and part == "main" else (_ZERO if usage else None),
        "ConsumedUnit": UNIT if usage else None,
        "PricingCategory": "Standard" if usage else None,
        "PricingQuantity": quantity if usage else None,
        "PricingUnit": UNIT if usage else None,
        "ResourceId": f"{cd.namespace}/{cd.pod}" if is_pod else None,
        "ResourceName": cd.pod if is_pod else None,
        "ResourceType": "Kubernetes Pod" if is_pod else None,
        "SkuId": cd.model or None,
        "SubAccountId": cd.team, "SubAccountName": cd.team,
        "Tags": json.dumps(tags, sort_keys=True, ensure_ascii=False),
        "x_Team": cd.team if not cd.kind else "", "x_Namespace": cd.namespace,
        "x_GpuModel": cd.model, "x_SharingMode": cd.sharing, "x_MigProfile": cd.profile,
        "x_RowKind": kind,
        "x_AllocatedGpuHours": cd.allocated_gpu_hours if part == "main" else _ZERO,
        "x_UsedGpuHours": cd.used_gpu_hours if part == "main" else None,
    }


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, Decimal):
        return f"{value:.6f}"
    if isinstance(value, str):  # pod, team, namespace names: formula text is not run
        return neutralise(value)
    return str(value)


def write_csv(report: Report, out: BinaryIO) -> None:
    """The CSV file into `out`, encoded as it is written: a month of 80,000 GPUs is ~0.9 GB
    of CSV, streamed to the file rather than held (docs/performance.md)."""
    text = io.TextIOWrapper(out, encoding="utf-8", newline="")
    try:
        writer = csv.writer(text, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        names = [name for name, _ in column_types(report)]
        writer.writerow(names)
        for row in rows(report):
            writer.writerow(_text(row[name]) for name in names)
    finally:
        text.detach()  # flushed; `out` stays the caller's (closing the wrapper would close it)


def render_csv(report: Report) -> bytes:
    buf = io.BytesIO()
    write_csv(report, buf)
    return buf.getvalue()


_ARROW = {
    "String": pa.string(),
    "JSON": pa.string(),
    "Decimal": pa.decimal128(24, 9),
    "Date/Time": pa.timestamp("ms", tz="UTC"),
}


# Rows per Parquet row group: the rows are turned into columns a batch at a time (a month of
# 80,000 GPUs, ~1.1M charge days, held as row dicts at once took ~2.3 GB).
PARQUET_BATCH = 100_000


def write_parquet(report: Report, out: BinaryIO) -> None:
    """The Parquet file into `out`, a row group of PARQUET_BATCH rows at a time."""
    types = column_types(report)
    fields = [pa.field(name, _ARROW[kind]) for name, kind in types]
    metadata = {"focus_version": spec().version, "gpu_ledger.period": str(report.month),
                "gpu_ledger.cost_model_hash": report.cost_model.hash}
    schema = pa.schema(fields, metadata=metadata)
    it = rows(report)
    with pq.ParquetWriter(out, schema, version="2.6", compression="zstd",
                          compression_level=3, use_dictionary=False, data_page_version="1.0",
                          store_schema=True) as writer:
        first = True
        while (batch := list(islice(it, PARQUET_BATCH))) or first:  # a month of none: one
            writer.write_table(pa.table({name: [r[name] for r in batch] for name, _ in types},
                                        schema=schema))
            first = False


def render_parquet(report: Report) -> bytes:
    buf = io.BytesIO()
    write_parquet(report, buf)
    return buf.getvalue()
