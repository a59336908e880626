"""Config bombs (issue 14, attack 6): every YAML loader (web config, scenarios, cost model)
refuses alias expansion beyond a budget and deep nesting with a one-line error naming the file
and the key, and never serialises the expanded value into the message. Bounded: the largest
document is a few KB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.errors import ConfigError
from exporter.webconfig import load_web_config
from gpu_ledger import safeyaml
from gpusim.scenario import load_scenario
from metering.costmodel import CostModelError, load_cost_model


def alias_bomb(levels: int = 6, width: int = 9) -> str:
    """`levels` anchors, each a list of `width` aliases of the previous: width**levels leaves
    (531,441 for the default), in a few hundred bytes."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels + "\n"


def test_alias_bomb_is_refused_naming_the_key() -> None:
    with pytest.raises(safeyaml.YamlError) as info:
        safeyaml.load(alias_bomb() + "basic_auth_users:\n  bob: *a5\n", "w.yml")
    assert info.value.key == "basic_auth_users.bob"
    assert str(info.value).startswith("w.yml: basic_auth_users.bob: aliases expand beyond")


def test_aliases_within_the_budget_load() -> None:
    text = "base: &b {hourly: 2, model: H100}\nx: *b\ny: {<<: *b, hourly: 3}\n"
    doc = safeyaml.load(text, "ok.yml")
    assert doc["x"] == {"hourly": 2, "model": "H100"} and doc["y"]["hourly"] == 3
    # A large document without aliases is not limited by the alias budget.
    big = "".join(f"k{i}: [1, 2, 3]\n" for i in range(safeyaml.ALIAS_BUDGET))
    assert len(safeyaml.load(big, "big.yml")) == safeyaml.ALIAS_BUDGET


@pytest.mark.parametrize("text", [
    deep(5000),  # flow sequences: RecursionError in PyYAML's composer before
    "".join("  " * i + "k:\n" for i in range(300)) + "  " * 300 + "1\n",  # block mappings
    "{a: " * 400 + "1" + "}" * 400 + "\n",  # flow mappings
])
def test_deep_nesting_is_a_one_line_error_not_recursion(text: str) -> None:
    with pytest.raises(safeyaml.YamlError) as info:
        safeyaml.load(text, "d.yml")
    assert "\n" not in str(info.value) and str(info.value).startswith("d.yml: ")
    assert str(info.value).endswith(f"nesting deeper than {safeyaml.MAX_DEPTH} levels")


def test_describe_stops_at_the_limit_whatever_the_size() -> None:
    leaf: list[object] = ["x"] * 10
    for _ in range(12):  # 10**12 leaves once expanded: must not be walked
        leaf = [leaf] * 10
    text = safeyaml.describe(leaf)
    assert text.startswith("[[[[") and text.endswith("...") and len(text) == 60
    assert safeyaml.describe({"a": [1, "b"]}) == "{'a': [1, 'b']}"
    assert safeyaml.describe({"a": [1, "b"]}, text=json.dumps) == '{"a": [1, "b"]}'


def test_web_config_alias_bomb_in_a_known_key(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(alias_bomb() + "basic_auth_users: *a5\n")
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: basic_auth_users: aliases expand beyond")
    assert len(message) < 300 and "\n" not in message  # nothing expanded into it


def test_web_config_wrong_type_never_serialises_the_value(tmp_path: Path) -> None:
    # A wrong type: the found value is shown cut short, not serialised whole.
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: [" + ", ".join(["aaaaaaaa"] * 900) + "]\n")
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    assert info.value.key == "basic_auth_users" and len(str(info.value)) < 300


def test_web_config_deep_nesting(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("http_server_config:\n  headers: " + deep(3000))
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    assert str(info.value).startswith(f"{path}: http_server_config.headers")
    assert "nesting deeper than" in str(info.value)


def test_cost_model_alias_bomb_and_nesting(tmp_path: Path) -> None:
    path = tmp_path / "cost-model.yaml"
    path.write_text(alias_bomb() + "teams:\n  namespaces: *a5\n")
    with pytest.raises(CostModelError) as info:
        load_cost_model(path)
    assert info.value.key == "teams.namespaces" and len(str(info.value)) < 300
    path.write_text("pricing: " + deep(3000))
    with pytest.raises(CostModelError, match="nesting deeper than"):
        load_cost_model(path)


def test_scenario_alias_bomb_and_nesting(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(alias_bomb() + "node: n1\ngpus: *a5\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.key == "gpus" and len(str(info.value)) < 300
    assert str(info.value).startswith(f"{path}: gpus: aliases expand beyond")
    path.write_text("node: n1\ngpus: " + deep(3000))
    with pytest.raises(ConfigError, match="nesting deeper than"):
        load_scenario(path)
