"""Cost model: the default file, resolution rules, and a clear error for every bad input."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering import cli_costmodel
from metering.costmodel import CostModelError, default_path, load_cost_model
from metering.db import connect
from metering.pricing import price_period
from tests.ledger_rows import ins

ROOT = Path(__file__).resolve().parent.parent
VALID = """
pricing:
  default: {hourly: 1}
  gpus:
    - {model: a, hourly: 1}
    - {model: b, hourly: 2}
    - {pattern: "c*", hourly: 3}
"""


def write(tmp_path: Path, text: str, name: str = "cost-model.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(CostModelError) as info:
        load_cost_model(write(tmp_path, text))
    return str(info.value).replace(str(tmp_path) + "/", "")


def test_packaged_default_is_the_repo_root_file() -> None:
    assert default_path().read_bytes() == (ROOT / "cost-model.yaml").read_bytes()


def test_default_model_resolves_prices_teams_and_hash() -> None:
    cm = load_cost_model(None)
    root = load_cost_model(ROOT / "cost-model.yaml")
    assert cm.hash == root.hash == hashlib.sha256(
        (ROOT / "cost-model.yaml").read_bytes()).hexdigest()
    assert cm.currency == "USD" and root.path == ROOT / "cost-model.yaml"
    assert cm.price_for("NVIDIA H100 80GB HBM3").hourly == Decimal("4")
    # 15000 / (36 x 730) + 0.4 kW x 1.4 x 0.12 + 0.10 = 0.570776 + 0.0672 + 0.1 = 0.737976
    a100 = cm.price_for("NVIDIA A100-SXM4-80GB")
    assert (a100.hourly, a100.rule) == (Decimal("0.737976"), "pricing.gpus[1]")
    assert cm.price_for("Tesla T4").rule == "pricing.default"
    assert cm.team_for_namespace("kube-system") == "platform"
    assert cm.team_for_namespace("ml-vision") == "ml-research"
    assert cm.team_for_namespace("default") == "unallocated"
    assert (cm.basis, cm.idle_policy, cm.mig_fraction, cm.team_label) == \
        ("allocation", "separate", "slices", "team")


def test_every_key_of_the_default_file_is_commented() -> None:
    # A key line carries a comment, follows a comment line, or opens a section whose first
    # line is a comment.
    lines = [line for line in (ROOT / "cost-model.yaml").read_text().splitlines()
             if line.strip()]
    key = re.compile(r"^\s*(- )?[\w.-]+:")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") or not key.match(line):
            continue
        opens_section = line.rstrip().endswith(":") and i + 1 < len(lines) \
            and lines[i + 1].lstrip().startswith("#")
        assert "#" in line or lines[i - 1].lstrip().startswith("#") or opens_section, line


def test_the_default_file_shows_every_section_and_the_docs_every_key() -> None:
    text = (ROOT / "cost-model.yaml").read_text()
    docs = (ROOT / "docs" / "cost-model.md").read_text()
    sections = ("version", "currency", "pricing", "mig", "sharing", "basis",
                "utilization_tiers", "teams", "discounts", "idle", "clusters")
    keys = ("default", "gpus", "model", "pattern", "hourly", "derived", "purchase_price",
            "depreciation_months", "hours_per_month", "power_watts", "electricity_per_kwh",
            "pue", "overhead_hourly", "memory_gb", "fraction", "table", "split", "efficiency",
            "mode", "usage_weight", "up_to", "multiplier", "label", "namespaces", "namespace",
            "team", "teams", "models", "policy", "weights")
    for name in sections:
        assert re.search(rf"^{name}:", text, re.MULTILINE), name
    for name in (*sections, *keys):
        assert f"`{name}`" in docs, name


def test_exact_model_beats_pattern_and_patterns_go_in_order(tmp_path: Path) -> None:
    cm = load_cost_model(write(tmp_path, """
pricing:
  default: {hourly: 1}
  gpus:
    - {pattern: "NVIDIA *", hourly: 2}
    - {pattern: "NVIDIA H100*", hourly: 3}
    - {model: "NVIDIA H100 PCIe", hourly: 4}
discounts: {models: {"NVIDIA H1*": 0.25, "NVIDIA H100 PCIe": 0.5}}
teams:
  namespaces:
    - {namespace: "team-*", team: globbed}
    - {namespace: team-a, team: exact}
  default: nobody
"""))
    assert cm.price_for("NVIDIA H100 PCIe").hourly == 4
    assert cm.price_for("NVIDIA H100 SXM").hourly == 2  # first pattern wins
    assert cm.price_for("AMD MI300X").hourly == 1
    assert cm.price_for("NVIDIA H100 PCIe").discount == Decimal("0.5")
    assert cm.price_for("NVIDIA H100 SXM").discount == Decimal("0.25")
    assert cm.team_for_namespace("team-a") == "exact"
    assert cm.team_for_namespace("team-b") == "globbed"
    assert cm.team_for_namespace("x") == "nobody"


def test_derived_price_by_hand(tmp_path: Path) -> None:
    cm = load_cost_model(write(tmp_path, """
pricing:
  default:
    derived: {purchase_price: 30000, depreciation_months: 48, power_watts: 700,
              electricity_per_kwh: 0.2, pue: 1.5}
"""))
    # 30000 / (48 x 730) = 0.856164...; 0.7 kW x 1.5 x 0.20 = 0.21; total 1.066164
    assert cm.price_for("any").hourly == Decimal("1.066164")


@pytest.mark.parametrize(("text", "message"), [
    (VALID.replace("hourly: 3", "hourly: abc"),
     'cost-model.yaml: pricing.gpus[2].hourly: expected a number >= 0 and <= 1000000, got "abc"'),
    (VALID.replace("hourly: 2", "hourly: -2"),
     "cost-model.yaml: pricing.gpus[1].hourly: expected a number >= 0 and <= 1000000, got -2"),
    (VALID.replace("hourly: 2", "hourly: true"),
     "cost-model.yaml: pricing.gpus[1].hourly: expected a number >= 0 and <= 1000000, got true"),
    (VALID.replace("hourly: 2", "hourly: 0.0000001"),
     "cost-model.yaml: pricing.gpus[1].hourly: expected a price with at most 6 decimal "
     "places, got 1e-07"),
    (VALID.replace("{hourly: 1}", "{hourley: 1}"),
     "cost-model.yaml: pricing.default.hourley: expected a known key: hourly, derived, "
     'memory_gb, got unknown key "hourley" (did you mean "hourly"?)'),
    (VALID + "idel: {policy: even}\n",
     'cost-model.yaml: idel: expected a known key: version, currency, pricing, mig, sharing, '
     'vgpu, basis, utilization_tiers, teams, discounts, idle, energy, carbon, budgets, clusters, '
     'got unknown key "idel" (did you mean "idle"?)'),
    (VALID + "idle: {policy: proportionate}\n",
     "cost-model.yaml: idle.policy: expected one of separate | proportional | even | weights "
     '(did you mean "proportional"?), got "proportionate"'),
    (VALID + "idle: {policy: weights, weights: {a: 0.5, b: 0.4}}\n",
     "cost-model.yaml: idle.weights: expected weights that sum to 1, got a sum of 0.9"),
    (VALID + "idle: {policy: weights}\n",
     "cost-model.yaml: idle.weights: expected at least one team when idle.policy is weights"),
    (VALID + "idle: {weights: {a: 1}}\n",
     "cost-model.yaml: idle.weights: expected no weights unless idle.policy is weights, "
     'got "separate"'),
    (VALID + "teams: {namespaces: [{namespace: 'ml-[ab', team: ml}]}\n",
     "cost-model.yaml: teams.namespaces[0].namespace: expected a namespace name or a glob "
     "pattern like \"ml-*\" (unclosed '['), got \"ml-[ab\""),
    (VALID + "teams: {default: idle}\n",
     "cost-model.yaml: teams.default: expected a team name (letters, digits, . _ -) that is "
     'not idle, down or adjustment, got "idle"'),
    (VALID + "teams: {label: 'bad label!'}\n",
     "cost-model.yaml: teams.label: expected a Kubernetes label name like team, "
     'got "bad label!"'),
    (VALID + "utilization_tiers: [{up_to: 0.5, multiplier: 2}, {up_to: 0.4, multiplier: 1}]\n",
     "cost-model.yaml: utilization_tiers[1].up_to: expected a bound above the previous "
     "tier's 0.5 (tiers go up in order), got 0.4"),
    (VALID + "utilization_tiers: [{up_to: 0.5, multiplier: 2}]\n",
     "cost-model.yaml: utilization_tiers[0].up_to: expected 1 on the last tier, so every "
     "utilisation has a tier, got 0.5"),
    (VALID + "mig: {fraction: memory}\n",
     "cost-model.yaml: pricing.default.memory_gb: expected the GPU's memory in GB, needed by "
     "mig.fraction: memory"),
    (VALID + "mig: {fraction: table, table: {3g: 0.5}}\n",
     'cost-model.yaml: mig.table.3g: expected a MIG profile name like 3g.40gb or an AMD '
     'partition like cpx_nps4, got "3g"'),
    (VALID + "mig: {table: {3g.40gb: 1.5}}\n",
     "cost-model.yaml: mig.table.3g.40gb: expected a number > 0 and <= 1, got 1.5"),
    (VALID + "sharing: {efficiency: {time_slicing: 0.9}}\n",
     "cost-model.yaml: sharing.efficiency.time_slicing: expected a known key: exclusive, mig, "
     'time-slicing, mps, fractional, vgpu, got unknown key "time_slicing" (did you mean '
     '"time-slicing"?)'),
    (VALID + "vgpu: {table: {nvidia.com/NVIDIA_A100-4C: 0.2}}\n",
     "cost-model.yaml: vgpu.table.nvidia.com/NVIDIA_A100-4C: expected a vGPU type as in its "
     'resource name after nvidia.com/, like NVIDIA_A100-4C, got "nvidia.com/NVIDIA_A100-4C"'),
    (VALID + "vgpu: {table: {NVIDIA_A100-4C: 0}}\n",
     "cost-model.yaml: vgpu.table.NVIDIA_A100-4C: expected a number > 0 and <= 1, got 0"),
    (VALID + "sharing: {fractional: both}\n",
     "cost-model.yaml: sharing.fractional: expected one of memory | cores | larger, "
     'got "both"'),
    (VALID + "discounts: {teams: {a: 2}}\n",
     "cost-model.yaml: discounts.teams.a: expected a number >= 0 and <= 1, got 2"),
    (VALID + "basis: {mode: blend, usage_weight: -0.1}\n",
     "cost-model.yaml: basis.usage_weight: expected a number >= 0 and <= 1, got -0.1"),
    (VALID + "currency: dollars\n",
     'cost-model.yaml: currency: expected a three-letter ISO 4217 code like USD, '
     'got "dollars"'),
    (VALID + "version: 2\n", "cost-model.yaml: version: expected 1, got 2"),
    ("pricing:\n  gpus: []\n",
     "cost-model.yaml: pricing.default: expected the price for GPU models no entry matches "
     "(hourly or derived)"),
    (VALID.replace("{model: a, hourly: 1}", "{model: a, pattern: 'a*', hourly: 1}"),
     "cost-model.yaml: pricing.gpus[0]: expected exactly one of model (exact name) or pattern "
     '(glob), got ["hourly", "model", "pattern"]'),
    (VALID.replace("{model: b, hourly: 2}", "{model: a, hourly: 2}"),
     'cost-model.yaml: pricing.gpus[1]: expected a model not already priced at '
     'pricing.gpus[0], got "a"'),
    ("pricing:\n  default:\n    derived: {purchase_price: 1, depreciation_months: 0, "
     "power_watts: 1, electricity_per_kwh: 1}\n",
     "cost-model.yaml: pricing.default.derived.depreciation_months: expected a number >= 1 "
     "and <= 240, got 0"),
    ("pricing:\n  default:\n    derived: {purchase_price: 1}\n",
     "cost-model.yaml: pricing.default.derived.depreciation_months: expected a number >= 0 "
     "(required for a derived price)"),
    ("pricing:\n  default: {hourly: 1}\n  default: {hourly: 2}\n",
     "cost-model.yaml: line 3, column 3: expected valid YAML (duplicate key 'default')"),
    ("pricing: [\n",
     "cost-model.yaml: line 2, column 1: expected valid YAML (expected the node content, but "
     "found '<stream end>')"),
    ("", "cost-model.yaml: expected a cost model mapping (the file is empty)"),
    ("- a\n- b\n", 'cost-model.yaml: expected a mapping of cost model sections at the top '
     'level, got ["a", "b"]'),
])
def test_bad_input_names_file_key_expected_and_found(tmp_path: Path, text: str,
                                                     message: str) -> None:
    assert error(tmp_path, text) == message


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CostModelError, match="expected an existing file"):
        load_cost_model(tmp_path / "missing.yaml")
    with pytest.raises(CostModelError, match="expected a file, not a directory"):
        load_cost_model(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CostModelError, match="expected UTF-8 text"):
        load_cost_model(binary)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True),
                     st.text(max_size=8))
_keys = st.sampled_from(["pricing", "default", "gpus", "hourly", "model", "pattern", "derived",
                         "idle", "policy", "weights", "teams", "namespaces", "namespace",
                         "team", "mig", "fraction", "table", "basis", "mode", "sharing",
                         "split", "discounts", "utilization_tiers", "up_to", "multiplier",
                         "memory_gb", "purchase_price", "x"])
_docs = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=4)), max_leaves=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_docs)
def test_no_input_gives_anything_but_a_cost_model_error(tmp_path: Path, doc: Any) -> None:
    path = write(tmp_path, yaml.safe_dump(doc))
    try:
        load_cost_model(path)
    except CostModelError as e:
        assert str(e).startswith(str(path))


def test_cli_check_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, VALID, "good.yaml")
    assert cli_costmodel.main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"{good}: valid (3 GPU prices")
    assert cli_costmodel.main(["show", str(ROOT / "cost-model.yaml"),
                               "--model", "NVIDIA A100-PCIE-40GB"]) == 0
    out = capsys.readouterr().out
    assert "'NVIDIA A100-PCIE-40GB' -> pricing.gpus[1]: 0.737976 USD/h" in out
    assert "capital 0.570776" in out and "energy 0.067200" in out
    bad = write(tmp_path, VALID.replace("hourly: 3", "hourly: abc"), "bad.yaml")
    assert cli_costmodel.main(["check", str(bad)]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f'gpu-ledger cost-model: {bad}: pricing.gpus[2].hourly: expected a '
                            'number >= 0 and <= 1000000, got "abc"\n')


def test_console_script_exit_codes(tmp_path: Path) -> None:
    bad = write(tmp_path, "pricing: {default: {hourly: 1}}\nidle: {policy: nope}\n")
    run = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "cost-model", "check",
                          str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 4 and "Traceback" not in run.stderr
    assert "idle.policy: expected one of" in run.stderr
    run = subprocess.run([sys.executable, "-m", "gpu_ledger.cli", "cost-model", "check"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "packaged default" in run.stdout


DERIVED = ("pricing:\n  default:\n    derived: {{purchase_price: {price}, depreciation_months: "
           "{months}, power_watts: 400, electricity_per_kwh: 0.12}}\n")


@pytest.mark.parametrize(("text", "message"), [
    # Issue 13: a decimal.InvalidOperation traceback from the derived price.
    (DERIVED.format(price=30000, months="1.0e-300"),
     "pricing.default.derived.depreciation_months: expected a number >= 1 and <= 240, "
     "got 1e-300"),
    # Issue 13: passed `check`, then failed in pricing (charges are DECIMAL(18, 6)).
    ("pricing:\n  default: {hourly: 1e12}\n",
     "pricing.default.hourly: expected a number >= 0 and <= 1000000, got 1000000000000.0"),
    ("pricing:\n  default: {hourly: 1.0e12}\n",
     "pricing.default.hourly: expected a number >= 0 and <= 1000000, got 1000000000000.0"),
    (DERIVED.format(price="1e12", months=1),
     "pricing.default.derived: expected a derived price <= 1000000 per device-hour, "
     "got 1.369863E+9"),
    ("pricing:\n  default: {hourly: \"2.5\"}\n",
     'pricing.default.hourly: expected a number >= 0 and <= 1000000, got "2.5" (a quoted '
     "string; write the number without quotes)"),
    (VALID + "budgets: {monthly: {ml: 1e13}}\n",
     "budgets.monthly.ml: expected a number > 0 and <= 999999999999, got 10000000000000.0"),
])
def test_out_of_range_fails_check_not_pricing(tmp_path: Path, text: str, message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, text)
    assert cli_costmodel.main(["check", str(path)]) == 4
    err = capsys.readouterr().err
    assert err == f"gpu-ledger cost-model: {path}: {message}\n"


def test_yaml_1_2_exponents_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads `2.5e0` and `1e3` as strings; the cost model reads them as numbers."""
    cm = load_cost_model(write(tmp_path, "pricing:\n  default: {hourly: 2.5e0}\n  gpus:\n"
                                         "    - {model: a, hourly: 1E1}\nbudgets:\n"
                                         "  monthly: {ml: 1e3}\n"))
    assert cm.price_for("b").hourly == Decimal("2.5")
    assert cm.price_for("a").hourly == Decimal(10)
    assert cm.budgets.monthly["ml"] == Decimal(1000)


def test_the_largest_price_allowed_prices_a_large_fleet(tmp_path: Path) -> None:
    """At the bound (1,000,000 per device-hour, tier multiplier 10) an hour of 100,000 GPUs
    held by one team prices without overflow: each row 10^7, the hour's adjustment row
    100,000 x (10^6 - 10^7) = -9 x 10^11, both within DECIMAL(18, 6)."""
    cm = load_cost_model(write(tmp_path, "pricing:\n  default: {hourly: 1000000}\n"
                                         "utilization_tiers:\n"
                                         "  - {up_to: 1, multiplier: 10}\n"))
    con = connect(":memory:")
    hour = datetime(2026, 10, 1)
    con.execute(ins("device_hours") + "SELECT $h, 'n', '0', 'GPU-' || i, 'X', false, 3600, "
                "3600, 3600, NULL FROM range(100000) t(i)", {"h": hour})
    con.execute(ins("allocation_hours") + "SELECT $h, 'n', 'ns', 'p' || i, 'c', "
                "'GPU-' || i, '', 'nvidia.com/gpu', 'exclusive', 1, 1, 3600, 0, 3600, MAP {} "
                "FROM range(100000) t(i)", {"h": hour})
    result = price_period(con, cm, hour.replace(tzinfo=UTC),
                          hour.replace(hour=1, tzinfo=UTC))
    assert result.fleet_cost == Decimal(10) ** 11
    assert result.total == result.fleet_cost
    row = con.execute("SELECT max(cost), min(cost) FROM charges").fetchone()
    assert row is not None and row[0] == Decimal(10) ** 7 and row[1] == Decimal(-9) * 10 ** 11
    con.close()
