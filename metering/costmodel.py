"""The cost model: `cost-model.yaml` parsed, validated and resolved into prices and rules.

Every bad value raises CostModelError naming the file, the key path, what was expected and what
was found; nothing here ever lets a KeyError or TypeError reach the user. Money is Decimal,
rounded to millionths of the currency (the precision of `charges.cost`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from importlib import resources
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpu_ledger import safeyaml
from gpu_ledger.sharing import SharingMode
from metering import partitions
from metering.cluster import CLUSTER_NAME_RULE, is_cluster_name
from metering.energy import (
    DAYS,
    MAX_GRAMS_PER_KWH,
    Carbon,
    EnergyPricing,
    IntensityError,
    TariffWindow,
    read_intensity,
)
from metering.errors import InputError

MICRO: Final = Decimal("0.000001")
# Names the pricing engine gives its own rows; a team may not be called any of these.
RESERVED_TEAMS: Final = frozenset({"idle", "down", "adjustment"})
SHARING_MODES: Final = tuple(m.value for m in SharingMode)
# What a fractional grant (HAMi, gpushare) pays: its memory fraction, its core fraction, or
# the larger of the two (docs/cost-model.md, `sharing.fractional`).
FRACTIONAL_BASES: Final = ("memory", "cores", "larger")
MIG_FRACTIONS: Final = ("slices", "memory", "table")
SHARING_SPLITS: Final = ("replicas", "memory", "sm")
BASES: Final = ("allocation", "usage", "blend")
IDLE_POLICIES: Final = ("separate", "proportional", "even", "weights")
# Sections a cluster may set differently under `clusters.NAME` (currency and budgets are the
# ledger's, one for every cluster).
CLUSTER_SECTIONS: Final = ("pricing", "mig", "sharing", "vgpu", "basis", "utilization_tiers",
                           "teams", "discounts", "idle", "energy", "carbon")
_MISSING: Final = object()
# Sane bounds, so a typo fails `cost-model check` instead of pricing (docs/cost-model.md,
# "Bounds"): a device-hour costs at most a million currency units (charges are DECIMAL(18, 6),
# under 10^12 per row, and an hour x model row may hold ~10^5 devices), and a GPU is written off
# over 1 to 240 months.
MAX_HOURLY: Final = Decimal(1_000_000)
MAX_PURCHASE: Final = Decimal(10) ** 12
MAX_WATTS: Final = Decimal(100_000)
MAX_DEPRECIATION_MONTHS: Final = Decimal(240)
MAX_PUE: Final = Decimal(10)
MAX_MEMORY_GB: Final = Decimal(1_000_000)
MAX_BUDGET: Final = Decimal(10) ** 12 - 1
_CURRENCY = re.compile(r"^[A-Z]{3}$")
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LABEL = re.compile(r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_PROFILE = re.compile(r"^\d+g\.\d+gb(\+[a-z]+)?$")
# Who made a GPU: the `vendor` label of gpu_info (device_hours.vendor; rows of exporters
# without the label are NVIDIA's).
VENDORS: Final = ("nvidia", "amd", "intel")


class _Raw(str):
    """A found value that is already a description, shown without quotes."""


def _show(value: object) -> str:
    """Render a found value the way YAML users wrote it: strings in double quotes."""
    if isinstance(value, _Raw):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float | Decimal):
        return json.dumps(value) if isinstance(value, str) else str(value)
    # Cut short, never serialised whole: it may be an alias bomb.
    return safeyaml.describe(value, text=json.dumps)


class CostModelError(InputError):
    """A cost model file is malformed.

    str() reads like `cost-model.yaml: pricing.gpus[2].hourly: expected a number >= 0, got "abc"`.
    """

    def __init__(self, file: str, key: str, expected: str, found: object = _MISSING,
                 hint: str = "") -> None:
        self.file, self.key, self.expected, self.found = file, key, expected, found
        where = f"{file}: {key}" if key else file
        msg = f"{where}: expected {expected}"
        if found is not _MISSING:
            msg += f", got {_show(found)}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


@dataclass(frozen=True)
class Derivation:
    """A device-hour price built from what the GPU costs to own and run."""

    purchase_price: Decimal
    depreciation_months: Decimal
    hours_per_month: Decimal
    power_watts: Decimal
    electricity_per_kwh: Decimal
    pue: Decimal
    overhead_hourly: Decimal

    @property
    def capital_hourly(self) -> Decimal:
        return self.purchase_price / (self.depreciation_months * self.hours_per_month)

    @property
    def energy_hourly(self) -> Decimal:
        return self.power_watts / 1000 * self.pue * self.electricity_per_kwh

    @property
    def hourly(self) -> Decimal:
        total = self.capital_hourly + self.energy_hourly + self.overhead_hourly
        return total.quantize(MICRO, rounding=ROUND_HALF_UP)

    @property
    def compute_hourly(self) -> Decimal:
        """Capital + overhead: the rate when `energy:` prices the measured kWh instead."""
        return (self.capital_hourly + self.overhead_hourly).quantize(MICRO,
                                                                     rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class PriceRule:
    """One `pricing.gpus[]` entry (or `pricing.default`, which has neither model nor pattern)."""

    key: str  # key path in the file, for messages: pricing.gpus[1]
    model: str | None
    pattern: str | None
    hourly: Decimal
    derived: Derivation | None
    memory_gb: Decimal | None
    vendor: str | None = None  # only this vendor's GPUs; None: any vendor's

    def matches(self, model: str, vendor: str | None = None) -> bool:
        """`vendor` None: a GPU whose vendor is not known here (a report's price table)."""
        if self.vendor is not None and vendor is not None and vendor != self.vendor:
            return False
        if self.model is not None:
            return model == self.model
        return self.pattern is not None and fnmatch.fnmatchcase(model, self.pattern)


# The device name a vGPU guest sees is its vGPU type (NVIDIA vGPU types reference, NVIDIA AI
# Enterprise 7.5): board, optional MIG slices, framebuffer GB and series letter (A, B, C,
# Q), after "NVIDIA " (or "GRID " on older drivers): "NVIDIA A100-20C", "GRID T4-16Q",
# "NVIDIA A100-3-20C" (MIG-backed). Whole-GPU names never end so ("NVIDIA A100-SXM4-80GB").
_VGPU_TYPE = re.compile(r"^(?:NVIDIA|GRID) [A-Z][A-Za-z0-9]*-(?:\d+-)?(?P<fb>\d+)[ABCQ]$")
VGPU_GUESTS: Final = ("fraction", "exclude")


def vgpu_guest_framebuffer(model: str) -> Decimal | None:
    """The framebuffer (GB) of a vGPU type named as a guest sees it; None: not a vGPU type."""
    m = _VGPU_TYPE.match(model)
    return Decimal(m.group("fb")) if m else None


def vgpu_resource_name(model: str) -> str:
    """A vGPU type as its KubeVirt resource names it after nvidia.com/ (vgpu.table's keys)."""
    return model.replace(" ", "_")


@dataclass(frozen=True)
class GuestPrice:
    """How a vGPU guest's device-hour was priced from the rule its type matched."""

    fraction: Decimal  # of the rule's hourly price (0: excluded)
    basis: str  # e.g. "20 of 80 GB", "vgpu.table", "vgpu.guests: exclude", "whole GPU"
    # a whole-GPU entry (pattern or default) matched the vGPU type: said as a warning
    whole_gpu_rule: bool


@dataclass(frozen=True)
class ResolvedPrice:
    model: str
    hourly: Decimal  # list price per device-hour, before discounts
    discount: Decimal  # model discount, 0-1
    memory_gb: Decimal | None
    rule: str  # which entry matched: pricing.gpus[1] or pricing.default
    guest: GuestPrice | None = None  # a vGPU guest's GPU: hourly is its share of the rule's
    vendor: str | None = None  # as asked for; None: any


@dataclass(frozen=True)
class NamespaceRule:
    key: str
    namespace: str  # exact name or glob
    team: str

    @property
    def is_glob(self) -> bool:
        return any(c in self.namespace for c in "*?[")

    def matches(self, namespace: str) -> bool:
        if self.is_glob:
            return fnmatch.fnmatchcase(namespace, self.namespace)
        return namespace == self.namespace


@dataclass(frozen=True)
class Tier:
    up_to: Decimal  # utilisation upper bound, inclusive
    multiplier: Decimal


@dataclass(frozen=True)
class Budgets:
    """Monthly budgets per team, in the cost model's currency (reports only: never prices)."""

    monthly: Mapping[str, Decimal]  # team -> budget for a calendar month
    # A team is "heading over" when its forecast reaches this share of its budget.
    warn_at: Decimal


@dataclass(frozen=True)
class CostModel:
    path: Path
    hash: str  # sha256 hex of the file bytes
    currency: str
    default_price: PriceRule
    gpus: tuple[PriceRule, ...]
    mig_fraction: str
    mig_table: Mapping[str, Decimal]
    sharing_split: str
    sharing_efficiency: Mapping[str, Decimal]
    fractional_basis: str
    vgpu_table: Mapping[str, Decimal]  # vGPU type (resource name after nvidia.com/) -> fraction
    basis: str
    usage_weight: Decimal
    tiers: tuple[Tier, ...]
    team_label: str
    namespace_rules: tuple[NamespaceRule, ...]
    default_team: str
    team_discounts: Mapping[str, Decimal]
    model_discounts: Mapping[str, Decimal]  # exact model or glob -> fraction off
    idle_policy: str
    idle_weights: Mapping[str, Decimal] = field(default_factory=dict)
    budgets: Budgets = field(default_factory=lambda: Budgets({}, Decimal(1)))
    # The file as named to the user and its text: pricing stores both with the charges
    # (table cost_models), so a report from the ledger alone is self-describing.
    name: str = ""
    text: str = ""
    # Cluster name -> the cost model that cluster is priced with (this one with the
    # sections `clusters.<name>` overrides); clusters not listed use this one.
    clusters: Mapping[str, CostModel] = field(default_factory=dict)
    # vgpu.guests: how a GPU whose name is a vGPU type (a cluster of VMs on vGPU) is priced:
    # its share of the entry it matches ("fraction"), or not at all ("exclude": the host
    # cluster is metered too and its vGPU rows already bill the hardware).
    vgpu_guests: str = "fraction"
    # `energy:` prices each holder's measured kWh (then device-hour rates are capital +
    # overhead only); `carbon:` turns kWh into CO2e. None: not priced / not reported.
    energy: EnergyPricing | None = None
    carbon: Carbon | None = None

    def for_cluster(self, name: str) -> CostModel:
        return self.clusters.get(name, self)

    def price_for(self, model: str, vendor: str | None = None) -> ResolvedPrice:
        """Exact model entries win over patterns; patterns are tried in file order. An entry
        with a `vendor` matches that vendor's GPUs only; among exact entries for the name, one
        that names the vendor wins over one that does not. `vendor` None (not known to the
        caller, e.g. a report's price table): every entry may match."""
        exact = [r for r in self.gpus if r.model is not None and r.matches(model, vendor)]
        rule = next((r for r in exact if r.vendor is not None), exact[0] if exact else None)
        if rule is None:
            rule = next((r for r in self.gpus if r.pattern and r.matches(model, vendor)), None)
        rule = rule or self.default_price
        guest = None if rule.model is not None else self._guest(model, rule)
        hourly = rule.hourly if guest is None else (rule.hourly * guest.fraction).quantize(
            MICRO, ROUND_HALF_UP)
        return ResolvedPrice(model, hourly, self.model_discount(model), rule.memory_gb,
                             rule.key, guest, vendor)

    def _guest(self, model: str, rule: PriceRule) -> GuestPrice | None:
        """A vGPU type priced by an entry for whole GPUs (a pattern or the default): its
        share of that GPU. An exact entry for the type is its own price (not here)."""
        framebuffer = vgpu_guest_framebuffer(model)
        if framebuffer is None:
            return None
        if self.vgpu_guests == "exclude":
            return GuestPrice(Decimal(0), "vgpu.guests: exclude", True)
        listed = self.vgpu_table.get(vgpu_resource_name(model))
        if listed is not None:
            return GuestPrice(listed, f"vgpu.table.{vgpu_resource_name(model)}", True)
        if rule.memory_gb is None or rule.memory_gb <= 0:
            return GuestPrice(Decimal(1), f"whole GPU: {rule.key}.memory_gb not set", True)
        return GuestPrice(min(framebuffer / rule.memory_gb, Decimal(1)),
                          f"{framebuffer} of {rule.memory_gb} GB", True)

    def model_discount(self, model: str) -> Decimal:
        if model in self.model_discounts:
            return self.model_discounts[model]
        for key, value in self.model_discounts.items():
            if fnmatch.fnmatchcase(model, key):
                return value
        return Decimal(0)

    def team_for_namespace(self, namespace: str) -> str:
        """Exact namespace rules win over globs; globs are tried in file order."""
        for rule in self.namespace_rules:
            if not rule.is_glob and rule.matches(namespace):
                return rule.team
        for rule in self.namespace_rules:
            if rule.is_glob and rule.matches(namespace):
                return rule.team
        return self.default_team


# --- reading ------------------------------------------------------------------------------


def default_path() -> Path:
    """The packaged default cost model (identical to cost-model.yaml at the repo root)."""
    return Path(str(resources.files("metering") / "data" / "cost-model.yaml"))


def load_cost_model(path: str | Path | None) -> CostModel:
    """Read and validate a cost model; None reads the packaged default."""
    p = default_path() if path is None else Path(path)
    name = str(path) if path is not None else "cost-model.yaml (packaged default)"
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise CostModelError(name, "", "an existing file") from None
    except IsADirectoryError:
        raise CostModelError(name, "", "a file, not a directory") from None
    except OSError as e:
        raise CostModelError(name, "", f"a readable file ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CostModelError(name, "", "UTF-8 text") from None
    try:  # the shared loader: duplicate keys, alias bombs and deep nesting are refused
        doc = safeyaml.load(text, name, unique_keys=True, exponent_floats=True)
    except safeyaml.YamlError as e:
        raise CostModelError(name, e.key or e.where, "valid YAML", hint=e.problem) from None
    parser = _Parser(name, files=p.resolve().parent)
    return dataclasses.replace(parser.model(doc, p, hashlib.sha256(raw).hexdigest()),
                               name=name, text=text)


def parse_cost_model(text: str, name: str) -> CostModel:
    """A cost model from its text, e.g. the copy a ledger keeps with its charges (same hash
    as the file it was read from: the hash is of the UTF-8 bytes)."""
    try:
        doc = safeyaml.load(text, name, unique_keys=True, exponent_floats=True)
    except safeyaml.YamlError as e:
        raise CostModelError(name, e.key or e.where, "valid YAML", hint=e.problem) from None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return dataclasses.replace(_Parser(name).model(doc, Path(name), digest), name=name,
                               text=text)


class _Parser:
    def __init__(self, file: str, prefix: str = "", files: Path | None = None) -> None:
        self.file = file
        self.prefix = prefix  # key path of the section being read: "clusters.NAME."
        # Where files the model names (carbon.intensity_csv) are read from; None: not read
        # (a copy read back from the ledger, priced already).
        self.files = files
        self.measured_energy = False  # `energy:` given: derived rates leave out power_watts

    def fail(self, key: str, expected: str, found: object = _MISSING,
             hint: str = "") -> CostModelError:
        return CostModelError(self.file, self.prefix + key, expected, found, hint)

    # -- primitives

    def mapping(self, value: object, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping", value)
        for k in value:
            if not isinstance(k, str):
                raise self.fail(key, "string keys", k)
            if k not in allowed:
                sub = f"{key}.{k}" if key else k
                close = difflib.get_close_matches(k, allowed, n=1, cutoff=0.6)
                hint = f'did you mean "{close[0]}"?' if close else ""
                raise self.fail(sub, "a known key: " + ", ".join(allowed),
                                _Raw(f"unknown key {_show(k)}"), hint)
        return value

    def number(self, value: object, key: str, *, lo: Decimal = Decimal(0),
               lo_open: bool = False, hi: Decimal | None = None) -> Decimal:
        bound = f"> {lo}" if lo_open else f">= {lo}"
        expected = f"a number {bound}" + (f" and <= {hi}" if hi is not None else "")
        if isinstance(value, bool) or not isinstance(value, int | float):
            hint = ""
            if isinstance(value, str):
                try:
                    float(value.replace("_", ""))
                    hint = "a quoted string; write the number without quotes"
                except ValueError:
                    pass
            raise self.fail(key, expected, value, hint)
        d = Decimal(str(value))
        if not d.is_finite() or d < lo or (lo_open and d == lo) or (hi is not None and d > hi):
            raise self.fail(key, expected, value)
        return d

    def text(self, value: object, key: str, expected: str = "a non-empty string") -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, expected, value)
        return value

    def choice(self, value: object, key: str, options: tuple[str, ...]) -> str:
        expected = "one of " + " | ".join(options)
        if not isinstance(value, str):
            raise self.fail(key, expected, value)
        if value not in options:
            close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
            if close:
                expected += f' (did you mean "{close[0]}"?)'
            raise self.fail(key, expected, value)
        return value

    def glob(self, value: object, key: str, what: str) -> str:
        """An exact name or a glob (* ? [...]); brackets must be closed and non-empty."""
        expected = f"{what} or a glob pattern like \"ml-*\""
        s = self.text(value, key, expected)
        i = 0
        while i < len(s):
            if s[i] == "[":
                j = i + 1
                j += s[j:j + 1] == "!"
                j += s[j:j + 1] == "]"  # a ']' first in the set is a literal
                i = s.find("]", j)
                if i < 0:
                    raise self.fail(key, expected + " (unclosed '[')", value)
            elif s[i] == "]":
                raise self.fail(key, expected + " (']' without '[')", value)
            i += 1
        return s

    def team(self, value: object, key: str) -> str:
        expected = "a team name (letters, digits, . _ -) that is not idle, down or adjustment"
        if not isinstance(value, str) or not _TEAM.match(value) or value in RESERVED_TEAMS:
            raise self.fail(key, expected, value)
        return value

    # -- sections

    def model(self, doc: object, path: Path, digest: str) -> CostModel:
        if doc is None:
            raise self.fail("", "a cost model mapping (the file is empty)")
        if not isinstance(doc, dict):
            raise self.fail("", "a mapping of cost model sections at the top level", doc)
        top = self.mapping(doc, "", ("version", "currency", *CLUSTER_SECTIONS,
                                     "budgets", "clusters"))
        if top.get("version", 1) != 1 or isinstance(top.get("version", 1), bool):
            raise self.fail("version", "1", top.get("version"))
        currency = top.get("currency", "USD")
        if not isinstance(currency, str) or not _CURRENCY.match(currency):
            raise self.fail("currency", "a three-letter ISO 4217 code like USD", currency)
        if "pricing" not in top:
            raise self.fail("pricing", "a pricing section with default and gpus")
        energy = self.energy(top.get("energy"))
        default, gpus = self.pricing(top["pricing"], measured_energy=energy is not None)
        mig_fraction, mig_table = self.mig(top.get("mig"))
        if mig_fraction == "memory":
            for rule in (default, *gpus):
                if rule.memory_gb is None:
                    raise self.fail(f"{rule.key}.memory_gb",
                                    "the GPU's memory in GB, needed by mig.fraction: memory")
        split, efficiency, fractional = self.sharing(top.get("sharing"))
        basis, usage_weight = self.basis(top.get("basis"))
        tiers = self.tiers(top.get("utilization_tiers"))
        label, rules, default_team = self.teams(top.get("teams"))
        team_disc, model_disc = self.discounts(top.get("discounts"))
        policy, weights = self.idle(top.get("idle"))
        budgets = self.budgets(top.get("budgets"))
        return CostModel(path=path, hash=digest, currency=currency, default_price=default,
                         gpus=gpus, mig_fraction=mig_fraction, mig_table=mig_table,
                         sharing_split=split, sharing_efficiency=efficiency,
                         fractional_basis=fractional,
                         vgpu_table=self.vgpu(top.get("vgpu")), basis=basis,
                         usage_weight=usage_weight, tiers=tiers, team_label=label,
                         namespace_rules=rules, default_team=default_team,
                         team_discounts=team_disc, model_discounts=model_disc,
                         idle_policy=policy, idle_weights=weights, budgets=budgets,
                         vgpu_guests=self.vgpu_guests(top.get("vgpu")),
                         energy=energy, carbon=self.carbon(top.get("carbon")),
                         clusters=self.clusters(top, path, digest))

    def clusters(self, top: dict[str, Any], path: Path, digest: str) -> dict[str, CostModel]:
        """`clusters: {NAME: {section: ...}}`: per cluster, the sections given replace the
        top-level ones whole; each cluster's model is validated like the top-level one."""
        if self.prefix:  # a cluster's own model has no clusters of its own
            return {}
        sec = top.get("clusters")
        if sec is None:
            return {}
        if not isinstance(sec, dict):
            raise self.fail("clusters", "a mapping of cluster name -> sections that differ "
                            "for that cluster", sec)
        out: dict[str, CostModel] = {}
        base = {k: v for k, v in top.items() if k != "clusters"}
        for name, override in sec.items():
            if not is_cluster_name(name):
                raise self.fail("clusters", CLUSTER_NAME_RULE + " as each key", name)
            key = f"clusters.{name}"
            if override is None or override == {}:
                raise self.fail(key, "at least one section to override: "
                                + ", ".join(CLUSTER_SECTIONS))
            sections = self.mapping(override, key, CLUSTER_SECTIONS)
            out[name] = _Parser(self.file, key + ".", self.files).model(
                {**base, **sections}, path, digest)
        return out

    def pricing(self, value: object, measured_energy: bool = False
                ) -> tuple[PriceRule, tuple[PriceRule, ...]]:
        sec = self.mapping(value, "pricing", ("default", "gpus"))
        if "default" not in sec:
            raise self.fail("pricing.default",
                            "the price for GPU models no entry matches (hourly or derived)")
        self.measured_energy = measured_energy
        default = self.price(sec["default"], "pricing.default", named=False)
        gpus_raw = sec.get("gpus") or []
        if not isinstance(gpus_raw, list):
            raise self.fail("pricing.gpus", "a list of GPU price entries", gpus_raw)
        gpus = tuple(self.price(g, f"pricing.gpus[{i}]", named=True)
                     for i, g in enumerate(gpus_raw))
        seen: dict[str, str] = {}
        for rule in gpus:
            name = rule.model if rule.model is not None else f"pattern {rule.pattern}"
            if rule.vendor is not None:
                name += f" of vendor {rule.vendor}"
            if name in seen:
                raise self.fail(rule.key, f"a model not already priced at {seen[name]}", name)
            seen[name] = rule.key
        return default, gpus

    def price(self, value: object, key: str, *, named: bool) -> PriceRule:
        names = ("model", "pattern", "vendor") if named else ()
        sec = self.mapping(value, key, (*names, "hourly", "derived", "memory_gb"))
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping with hourly or derived", value)
        model = pattern = None
        if named:
            if ("model" in sec) == ("pattern" in sec):
                raise self.fail(key, "exactly one of model (exact name) or pattern (glob)",
                                sorted(sec))
            if "model" in sec:
                model = self.text(sec["model"], f"{key}.model", "a GPU model name as the "
                                  "exporter's gpu_info reports it, like \"NVIDIA H100 80GB "
                                  "HBM3\" or \"AMD Instinct MI300X\"")
            else:
                pattern = self.glob(sec["pattern"], f"{key}.pattern", "a GPU model name")
        if ("hourly" in sec) == ("derived" in sec):
            raise self.fail(key, "exactly one of hourly (a price) or derived (from costs)",
                            sorted(sec))
        derived = None
        if "hourly" in sec:
            hourly = self.number(sec["hourly"], f"{key}.hourly", hi=MAX_HOURLY)
            if hourly != hourly.quantize(MICRO):
                raise self.fail(f"{key}.hourly", "a price with at most 6 decimal places",
                                sec["hourly"])
        else:
            derived = self.derivation(sec["derived"], f"{key}.derived")
            # with `energy:` the measured kWh are priced apart: the rate is capital + overhead
            hourly = derived.compute_hourly if self.measured_energy else derived.hourly
        memory = sec.get("memory_gb")
        memory_gb = None if memory is None else \
            self.number(memory, f"{key}.memory_gb", lo_open=True, hi=MAX_MEMORY_GB)
        vendor = self.choice(sec["vendor"], f"{key}.vendor", VENDORS) if "vendor" in sec \
            else None
        return PriceRule(key, model, pattern, hourly, derived, memory_gb, vendor)

    def derivation(self, value: object, key: str) -> Derivation:
        fields = ("purchase_price", "depreciation_months", "hours_per_month", "power_watts",
                  "electricity_per_kwh", "pue", "overhead_hourly")
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping of " + ", ".join(fields), value)
        sec = self.mapping(value, key, fields)
        required = ("purchase_price", "depreciation_months", "power_watts",
                    "electricity_per_kwh")
        for name in required:
            if name not in sec:
                raise self.fail(f"{key}.{name}", "a number >= 0 (required for a derived price)")
        d = Derivation(
            purchase_price=self.number(sec["purchase_price"], f"{key}.purchase_price",
                                       hi=MAX_PURCHASE),
            depreciation_months=self.number(sec["depreciation_months"],
                                            f"{key}.depreciation_months", lo=Decimal(1),
                                            hi=MAX_DEPRECIATION_MONTHS),
            hours_per_month=self.number(sec.get("hours_per_month", 730),
                                        f"{key}.hours_per_month", lo_open=True,
                                        hi=Decimal(744)),
            power_watts=self.number(sec["power_watts"], f"{key}.power_watts", hi=MAX_WATTS),
            electricity_per_kwh=self.number(sec["electricity_per_kwh"],
                                            f"{key}.electricity_per_kwh", hi=MAX_HOURLY),
            pue=self.number(sec.get("pue", 1), f"{key}.pue", lo=Decimal(1), hi=MAX_PUE),
            overhead_hourly=self.number(sec.get("overhead_hourly", 0), f"{key}.overhead_hourly",
                                        hi=MAX_HOURLY),
        )
        total = d.capital_hourly + d.energy_hourly + d.overhead_hourly
        if total > MAX_HOURLY:
            raise self.fail(key, f"a derived price <= {MAX_HOURLY} per device-hour",
                            _Raw(f"{total:.6E}"))
        return d

    def mig(self, value: object) -> tuple[str, dict[str, Decimal]]:
        sec = self.mapping(value, "mig", ("fraction", "table"))
        fraction = self.choice(sec.get("fraction", "slices"), "mig.fraction", MIG_FRACTIONS)
        table_raw = sec.get("table") or {}
        if not isinstance(table_raw, dict):
            raise self.fail("mig.table", "a mapping of MIG profile to fraction of the parent",
                            table_raw)
        table: dict[str, Decimal] = {}
        for profile, frac in table_raw.items():
            k = f"mig.table.{profile}"
            if not isinstance(profile, str) or not (_PROFILE.match(profile)
                                                    or partitions.is_profile(profile)):
                raise self.fail(k, "a MIG profile name like 3g.40gb or an AMD partition like "
                                "cpx_nps4", profile)
            table[profile] = self.number(frac, k, lo_open=True, hi=Decimal(1))
        if fraction == "table" and not table:
            raise self.fail("mig.table", "at least one profile when mig.fraction is table")
        return fraction, table

    def sharing(self, value: object) -> tuple[str, dict[str, Decimal], str]:
        sec = self.mapping(value, "sharing", ("split", "efficiency", "fractional"))
        split = self.choice(sec.get("split", "replicas"), "sharing.split", SHARING_SPLITS)
        fractional = self.choice(sec.get("fractional", "memory"), "sharing.fractional",
                                 FRACTIONAL_BASES)
        eff_raw = sec.get("efficiency")
        if not isinstance(eff_raw, dict | None):
            raise self.fail("sharing.efficiency", "a mapping of sharing mode to factor", eff_raw)
        eff = self.mapping(eff_raw, "sharing.efficiency", SHARING_MODES)
        efficiency = {mode: self.number(v, f"sharing.efficiency.{mode}", lo_open=True,
                                        hi=Decimal(1)) for mode, v in eff.items()}
        return split, efficiency, fractional

    def vgpu_guests(self, value: object) -> str:
        sec = self.mapping(value, "vgpu", ("table", "guests"))
        return self.choice(sec.get("guests", "fraction"), "vgpu.guests", VGPU_GUESTS)

    def vgpu(self, value: object) -> dict[str, Decimal]:
        sec = self.mapping(value, "vgpu", ("table", "guests"))
        raw = sec.get("table") or {}
        if not isinstance(raw, dict):
            raise self.fail("vgpu.table", "a mapping of vGPU type to fraction of the GPU", raw)
        table: dict[str, Decimal] = {}
        for name, frac in raw.items():
            k = f"vgpu.table.{name}"
            if not isinstance(name, str) or not name.strip() or "/" in name:
                raise self.fail(k, "a vGPU type as in its resource name after nvidia.com/, "
                                "like NVIDIA_A100-4C", name)
            table[name] = self.number(frac, k, lo_open=True, hi=Decimal(1))
        return table

    def basis(self, value: object) -> tuple[str, Decimal]:
        sec = self.mapping(value, "basis", ("mode", "usage_weight"))
        mode = self.choice(sec.get("mode", "allocation"), "basis.mode", BASES)
        weight = self.number(sec.get("usage_weight", 0.5), "basis.usage_weight", hi=Decimal(1))
        return mode, weight

    def tiers(self, value: object) -> tuple[Tier, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail("utilization_tiers", "a list of {up_to, multiplier}", value)
        tiers: list[Tier] = []
        for i, raw in enumerate(value):
            k = f"utilization_tiers[{i}]"
            if not isinstance(raw, dict):
                raise self.fail(k, "a mapping with up_to and multiplier", raw)
            sec = self.mapping(raw, k, ("up_to", "multiplier"))
            for name in ("up_to", "multiplier"):
                if name not in sec:
                    raise self.fail(f"{k}.{name}", "a number")
            up_to = self.number(sec["up_to"], f"{k}.up_to", hi=Decimal(1))
            if tiers and up_to <= tiers[-1].up_to:
                raise self.fail(f"{k}.up_to", f"a bound above the previous tier's "
                                f"{tiers[-1].up_to} (tiers go up in order)", sec["up_to"])
            mult = self.number(sec["multiplier"], f"{k}.multiplier", lo_open=True,
                               hi=Decimal(10))
            tiers.append(Tier(up_to, mult))
        if tiers and tiers[-1].up_to != 1:
            raise self.fail(f"utilization_tiers[{len(tiers) - 1}].up_to",
                            "1 on the last tier, so every utilisation has a tier",
                            value[-1].get("up_to"))
        return tuple(tiers)

    def teams(self, value: object) -> tuple[str, tuple[NamespaceRule, ...], str]:
        sec = self.mapping(value, "teams", ("label", "namespaces", "default"))
        label = sec.get("label", "team")
        if not isinstance(label, str) or not _LABEL.match(label):
            raise self.fail("teams.label", "a Kubernetes label name like team", label)
        default = self.team(sec.get("default", "unallocated"), "teams.default")
        raw = sec.get("namespaces") or []
        if not isinstance(raw, list):
            raise self.fail("teams.namespaces", "a list of {namespace, team} rules", raw)
        rules: list[NamespaceRule] = []
        seen: set[str] = set()
        for i, item in enumerate(raw):
            k = f"teams.namespaces[{i}]"
            if not isinstance(item, dict):
                raise self.fail(k, "a mapping with namespace and team", item)
            rule = self.mapping(item, k, ("namespace", "team"))
            for name in ("namespace", "team"):
                if name not in rule:
                    raise self.fail(f"{k}.{name}", "a string")
            ns = self.glob(rule["namespace"], f"{k}.namespace", "a namespace name")
            if ns in seen:
                raise self.fail(f"{k}.namespace", "a namespace not already listed", ns)
            seen.add(ns)
            rules.append(NamespaceRule(k, ns, self.team(rule["team"], f"{k}.team")))
        return label, tuple(rules), default

    def discounts(self, value: object) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
        sec = self.mapping(value, "discounts", ("teams", "models"))
        out: list[dict[str, Decimal]] = []
        for part in ("teams", "models"):
            raw = sec.get(part) or {}
            if not isinstance(raw, dict):
                raise self.fail(f"discounts.{part}", "a mapping of name to fraction off (0-1)",
                                raw)
            table: dict[str, Decimal] = {}
            for name, frac in raw.items():
                k = f"discounts.{part}.{name}"
                if part == "teams":
                    self.team(name, k)
                else:
                    self.glob(name, k, "a GPU model name")
                table[name] = self.number(frac, k, hi=Decimal(1))
            out.append(table)
        return out[0], out[1]

    def idle(self, value: object) -> tuple[str, dict[str, Decimal]]:
        sec = self.mapping(value, "idle", ("policy", "weights"))
        policy = self.choice(sec.get("policy", "separate"), "idle.policy", IDLE_POLICIES)
        raw = sec.get("weights") or {}
        if not isinstance(raw, dict):
            raise self.fail("idle.weights", "a mapping of team to weight", raw)
        weights: dict[str, Decimal] = {}
        for team, w in raw.items():
            k = f"idle.weights.{team}"
            weights[self.team(team, k)] = self.number(w, k, lo_open=True, hi=Decimal(1))
        if policy == "weights":
            if not weights:
                raise self.fail("idle.weights", "at least one team when idle.policy is weights")
            total = sum(weights.values(), Decimal(0))
            if abs(total - 1) > Decimal("0.000001"):
                raise self.fail("idle.weights", "weights that sum to 1",
                                _Raw(f"a sum of {total}"))
        elif weights:
            raise self.fail("idle.weights", "no weights unless idle.policy is weights",
                            policy)
        return policy, weights

    def budgets(self, value: object) -> Budgets:
        sec = self.mapping(value, "budgets", ("monthly", "warn_at"))
        raw = sec.get("monthly") or {}
        if not isinstance(raw, dict):
            raise self.fail("budgets.monthly", "a mapping of team to monthly budget", raw)
        monthly: dict[str, Decimal] = {}
        for team, amount in raw.items():
            k = f"budgets.monthly.{team}"
            monthly[self.team(team, k)] = self.number(amount, k, lo_open=True, hi=MAX_BUDGET)
        warn_at = self.number(sec.get("warn_at", 1), "budgets.warn_at", lo_open=True,
                              hi=Decimal(1))
        return Budgets(monthly, warn_at)

    def energy(self, value: object) -> EnergyPricing | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail("energy", "a mapping with price_per_kwh (and pue, tariff, "
                            "timezone)", value)
        sec = self.mapping(value, "energy", ("price_per_kwh", "pue", "tariff", "timezone"))
        if "price_per_kwh" not in sec:
            raise self.fail("energy.price_per_kwh", "a number >= 0 (the price of one kWh)")
        price = self.kwh_price(sec["price_per_kwh"], "energy.price_per_kwh")
        pue = self.number(sec.get("pue", 1), "energy.pue", lo=Decimal(1), hi=MAX_PUE)
        if pue != pue.quantize(MICRO):
            raise self.fail("energy.pue", "a PUE with at most 6 decimal places", sec["pue"])
        zone = self.text(sec.get("timezone", "UTC"), "energy.timezone",
                         "an IANA time zone like Europe/Berlin")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise self.fail("energy.timezone", "an IANA time zone like Europe/Berlin",
                            zone) from None
        raw = sec.get("tariff") or []
        if not isinstance(raw, list):
            raise self.fail("energy.tariff", "a list of {hours, days, price_per_kwh}", raw)
        return EnergyPricing(price, pue, tuple(self.window(w, f"energy.tariff[{i}]")
                                               for i, w in enumerate(raw)), zone)

    def kwh_price(self, value: object, key: str) -> Decimal:
        price = self.number(value, key, hi=MAX_HOURLY)
        if price != price.quantize(MICRO):
            raise self.fail(key, "a price with at most 6 decimal places", value)
        return price

    def window(self, value: object, key: str) -> TariffWindow:
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping with hours, price_per_kwh and optional days",
                            value)
        sec = self.mapping(value, key, ("hours", "days", "price_per_kwh"))
        for name in ("hours", "price_per_kwh"):
            if name not in sec:
                raise self.fail(f"{key}.{name}", "a value (hours like \"22-06\", a price)")
        hours = sec["hours"]
        m = re.fullmatch(r"(\d{1,2})-(\d{1,2})", hours) if isinstance(hours, str) else None
        start, end = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
        if not 0 <= start <= 23 or not 1 <= end <= 24 or start == end:
            raise self.fail(f"{key}.hours", "START-END in whole hours, 0-23 and 1-24, like "
                            "\"07-22\" or \"22-06\" (crossing midnight)", hours)
        raw_days = sec.get("days", list(DAYS))
        if not isinstance(raw_days, list) or not raw_days:
            raise self.fail(f"{key}.days", "a list of days: " + ", ".join(DAYS), raw_days)
        days: set[int] = set()
        for day in raw_days:
            days.add(DAYS.index(self.choice(day, f"{key}.days", DAYS)))
        price = self.kwh_price(sec["price_per_kwh"], f"{key}.price_per_kwh")
        return TariffWindow(key, start, end, frozenset(days), price)

    def carbon(self, value: object) -> Carbon | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail("carbon", "a mapping with grams_per_kwh (and intensity_csv)", value)
        sec = self.mapping(value, "carbon", ("grams_per_kwh", "intensity_csv"))
        if "grams_per_kwh" not in sec:
            raise self.fail("carbon.grams_per_kwh",
                            "a number >= 0 (gCO2e per kWh, for hours the CSV lacks)")
        grams = self.number(sec["grams_per_kwh"], "carbon.grams_per_kwh",
                            hi=MAX_GRAMS_PER_KWH)
        if grams != grams.quantize(Decimal("0.001")):
            raise self.fail("carbon.grams_per_kwh", "grams with at most 3 decimal places",
                            sec["grams_per_kwh"])
        csv_name = sec.get("intensity_csv")
        if csv_name is None:
            return Carbon(grams)
        csv_name = self.text(csv_name, "carbon.intensity_csv",
                             "a CSV file of timestamp,gCO2e/kWh lines")
        if self.files is None:
            return Carbon(grams, csv_name)
        path = Path(csv_name)
        try:
            intensity = read_intensity(path if path.is_absolute() else self.files / path,
                                       csv_name)
        except IntensityError as e:
            raise self.fail("carbon.intensity_csv", "a CSV of timestamp,gCO2e/kWh lines",
                            hint=str(e)) from None
        return Carbon(grams, csv_name, intensity)
