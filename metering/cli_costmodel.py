"""`gpu-ledger cost-model check|show [FILE]`: validate a cost model, or print what it resolves to.

Exit 0 when the file is valid, 4 (a bad input file, docs/operations.md) with the one-line
error (file: key: expected, got) otherwise; 2 for bad options.
"""

from __future__ import annotations

import sys
from decimal import Decimal

from metering.costmodel import CostModel, CostModelError, PriceRule, load_cost_model
from metering.energy import DAYS
from metering.errors import ArgumentParser, ExitCode


def _money(value: Decimal, currency: str) -> str:
    return f"{value.normalize():f} {currency}" if value else f"0 {currency}"


def summary(model: CostModel, name: str) -> str:
    return (f"{name}: valid ({len(model.gpus)} GPU prices + default "
            f"{_money(model.default_price.hourly, model.currency)}/h, basis {model.basis}, "
            f"idle {model.idle_policy}, sha256 {model.hash[:12]})")


def _rule_lines(rule: PriceRule, currency: str) -> list[str]:
    name = (f"model {rule.model!r}" if rule.model is not None
            else f"pattern {rule.pattern!r}" if rule.pattern is not None else "default")
    if rule.vendor is not None:
        name += f" ({rule.vendor} only)"
    lines = [f"  {rule.key:<18} {name}: {_money(rule.hourly, currency)} per device-hour"]
    d = rule.derived
    if d is not None:
        lines.append(f"    = {d.purchase_price.normalize():f} / ({d.depreciation_months} x "
                     f"{d.hours_per_month} h) capital {d.capital_hourly:.6f}"
                     f" + {d.power_watts} W x PUE {d.pue} x {d.electricity_per_kwh}/kWh energy "
                     f"{d.energy_hourly:.6f} + overhead {d.overhead_hourly}")
    if rule.memory_gb is not None:
        lines.append(f"    memory {rule.memory_gb} GB")
    return lines


def _energy_lines(model: CostModel) -> list[str]:
    e, c = model.energy, model.carbon
    if e is None:
        out = ["energy: inside the device-hour rate (no `energy:` section)"]
    else:
        out = [f"energy: measured kWh x PUE {e.pue} x {_money(e.price_per_kwh, model.currency)}"
               "/kWh (derived rates are capital + overhead)"
               + (f"; tariff in {e.timezone}:" if e.tariff else "")]
        out += [f"  {w.key}: hours {w.start:02d}-{w.end:02d} "
                f"{','.join(DAYS[d] for d in sorted(w.days)) if len(w.days) < 7 else 'every day'}"
                f": {_money(w.price_per_kwh, model.currency)}/kWh" for w in e.tariff]
    if c is not None:
        csv = f", hourly from {c.intensity_csv} ({len(c.intensity)} hours)" if c.intensity_csv \
            else ""
        out.append(f"carbon: {c.grams_per_kwh} gCO2e/kWh{csv}")
    return out


def show(model: CostModel, name: str, models: list[str]) -> str:
    cur = model.currency
    out = [f"cost model {name} (sha256 {model.hash[:12]}), currency {cur}", "prices:"]
    for rule in (*model.gpus, model.default_price):
        out += _rule_lines(rule, cur)
    for m in models:
        p = model.price_for(m)
        extra = f", {p.discount * 100:.4g}% model discount" if p.discount else ""
        out.append(f"  {m!r} -> {p.rule}: {_money(p.hourly, cur)}/h{extra}")
    mig = model.mig_fraction
    if model.mig_table:
        mig += " (table: " + ", ".join(f"{k}={v}" for k, v in model.mig_table.items()) + ")"
    out.append(f"mig fraction: {mig}")
    eff = ", ".join(f"{k}={v}" for k, v in model.sharing_efficiency.items()) or "none"
    out.append(f"shared GPUs: split by {model.sharing_split}; fractional grants priced by "
               f"{model.fractional_basis}; efficiency factors: {eff}")
    basis = model.basis + (f" (usage weight {model.usage_weight})" if model.basis == "blend"
                           else "")
    out.append(f"basis: {basis}")
    tiers = ", ".join(f"<= {t.up_to}: x{t.multiplier}" for t in model.tiers) or "none"
    out.append(f"utilization tiers: {tiers}")
    out.append(f"teams: label {model.team_label!r}, then namespace rules, else "
               f"{model.default_team!r}")
    for ns_rule in model.namespace_rules:
        kind = "glob" if ns_rule.is_glob else "exact"
        out.append(f"  {ns_rule.namespace!r} ({kind}) -> {ns_rule.team}")
    for part, table in (("team", model.team_discounts), ("model", model.model_discounts)):
        for k, v in table.items():
            out.append(f"discount: {part} {k!r} {v * 100:.4g}% off")
    idle = model.idle_policy
    if model.idle_weights:
        idle += " (" + ", ".join(f"{t}={w}" for t, w in model.idle_weights.items()) + ")"
    out.append(f"idle: {idle}; down GPU hours: `down` rows, never shared")
    out += _energy_lines(model)
    for cluster, own in model.clusters.items():  # each cluster's model, in full
        body = show(own, name, models).splitlines()[1:]
        out += [f"cluster {cluster} (clusters.{cluster}):", *(f"  {line}" for line in body)]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="gpu-ledger cost-model",
                                     description="Check or show a cost model file.")
    sub = parser.add_subparsers(dest="action", required=True)
    for action, text in (("check", "validate the file; exit 4 with the error if it is bad"),
                         ("show", "print the resolved prices and rules")):
        p = sub.add_parser(action, help=text, description=text)
        p.add_argument("file", nargs="?", help="cost model YAML (default: the packaged one)")
        if action == "show":
            p.add_argument("--model", action="append", default=[], metavar="NAME",
                           help="also show the price a GPU model name resolves to")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code) if isinstance(e.code, int) else ExitCode.USAGE
    name = args.file or "cost-model.yaml (packaged default)"
    try:
        model = load_cost_model(args.file)
    except CostModelError as e:
        print(f"gpu-ledger cost-model: {e}", file=sys.stderr)
        return e.code
    if args.action == "check":
        print(summary(model, name))
    else:
        print(show(model, name, args.model))
    return 0
