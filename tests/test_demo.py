"""`gpu-ledger demo`, the README's first command, at a small size: it must run the whole
pipeline and leave a report, with Prometheus and without."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpu_ledger.demo import DEFAULT_DAYS, build_parser, default_month, main, scenario_paths
from gpusim.scenario import load_scenario

SMALL = ["--month", "2026-10", "--days", "1", "--step", "30m", "--live-seconds", "1"]


def _fleet_cost(out: Path) -> float:
    with (out / "report" / "chargeback-2026-10.csv").open(newline="") as fh:
        fleet = next(r for r in csv.DictReader(fh) if r["section"] == "fleet")
    assert fleet["hours_with_data"] == "24"
    return float(fleet["cost"])


@pytest.mark.parametrize("source", ["prometheus", "file"])
def test_demo_runs_the_pipeline(tmp_path: Path, source: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--no-prometheus"] if source == "file" else []
    assert main([*SMALL, "--out", str(tmp_path), *extra]) == 0
    printed = capsys.readouterr().out
    assert "[4/4] Writing the 2026-10 chargeback report" in printed
    for name in ("chargeback-2026-10.html", "chargeback-2026-10.csv",
                 "chargeback-2026-10.parquet", "chargeback-2026-10.md"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert _fleet_cost(tmp_path) > 0


def test_default_month_steps_back_while_last_month_is_too_fresh() -> None:
    assert default_month(datetime(2026, 11, 21, tzinfo=UTC)) == "2026-10"
    assert default_month(datetime(2026, 11, 1, 1, 0, tzinfo=UTC)) == "2026-09"
    assert default_month(datetime(2027, 1, 1, 4, 0, tzinfo=UTC)) == "2026-12"


def test_unfinished_month_is_refused(tmp_path: Path) -> None:
    month = datetime.now(UTC).strftime("%Y-%m")
    assert main(["--month", month, "--full-month", "--out", str(tmp_path)]) == 2


def test_default_is_a_week_and_full_month_is_a_flag() -> None:
    parse = build_parser().parse_args
    assert parse([]).days == DEFAULT_DAYS == 7
    assert parse(["--full-month"]).days == 31  # days_arg: more than the month has = all of it
    assert parse(["--days", "3"]).days == 3
    with pytest.raises(SystemExit):
        parse(["--days", "3", "--full-month"])


def test_default_week_shows_every_scenario_event() -> None:
    """The shorter default loses no feature: every fault, XID and pod of the example
    scenarios starts within the simulated week (later runs are repeats)."""
    week = DEFAULT_DAYS * 86400.0
    events = 0
    for path in scenario_paths(None):
        sc = load_scenario(str(path))
        starts = [f.at for f in sc.faults] + [x.at for x in sc.xids] + [p.start for p in sc.pods]
        events += len(starts)
        assert all(t < week for t in starts), path.name
        assert all(p.repeat is None or p.repeat < week for p in sc.pods), path.name
    assert events > 20
