"""A family whose values are added up per key (utilisation, power, energy, container memory
and SM) with more series for a GPU than its `gpu_up` has: metering cannot tell series that
followed each other (a relabel of that family alone: the sum is right) from series that
overlapped (a second scrape job keeping only that family: the sum is twice the value), so it
adds them up and says so (FactCounts.more_series, meter's warning). A store where every
family has the extra series (two scrape jobs on one exporter) is de-duplicated and not
warned about."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from promtools import backfill, running_prometheus, running_pushgateway

from metering import cli_meter, publish
from metering.db import connect
from metering.facts import ADDED_UP_FAMILIES
from metering.ingest import IngestResult, ingest
from metering.openmetrics_source import OpenMetricsSource
from metering.period import resolve
from metering.selector import Selector

T0 = int(datetime(2026, 10, 5, tzinfo=UTC).timestamp())
DEV = 'node="n1",gpu="0",uuid="GPU-1",model="L4",job="gpu"'
PERIOD = ("2026-10-05T00:00", "2026-10-05T01:00")


def _series(name: str, labels: str, value: float, first: int, last: int) -> list[str]:
    return [f"{name}{{{labels}}} {value} {T0 + t}" for t in range(first, last + 1, 30)]


def _history(path: Path, *extra: list[str], up_twice: bool = False) -> Path:
    """An L4 up all hour at 30 s (gpu_up, its energy counter at 100 W) plus `extra`; with
    `up_twice` its gpu_up and counter also come from a second instance."""
    lines: list[str] = []
    for inst in ("a", "b") if up_twice else ("a",):
        lines += _series("gpu_up", f'{DEV},instance="{inst}"', 1, 30, 3600)
        lines += [f'gpu_energy_joules_total{{{DEV},instance="{inst}"}} {100 * t} {T0 + t}'
                  for t in range(30, 3601, 30)]
    for more in extra:
        lines += more
    path.write_text("\n".join(lines) + "\n# EOF\n")
    return path


def _metered(om: Path, db: Path) -> tuple[IngestResult, list[tuple[float, float, float]]]:
    period = resolve(None, *PERIOD)
    src = OpenMetricsSource(str(om), period, Selector.parse('job="gpu"'))
    con = connect(db)
    try:
        result = ingest(con, src, period)
        rows = con.execute("SELECT observed_seconds, sm_active_seconds, "
                           "energy_joules::DOUBLE FROM device_hours").fetchall()
    finally:
        src.close()
        con.close()
    return result, rows


def test_series_that_follow_each_other_are_added_up_and_flagged(tmp_path: Path) -> None:
    om = _history(tmp_path / "relabel.om",
                  _series("gpu_utilization_ratio", f'{DEV},instance="a"', 0.25, 30, 1800),
                  _series("gpu_utilization_ratio", f'{DEV},instance="a",shard="b"', 0.75,
                          1830, 3600))
    result, rows = _metered(om, tmp_path / "l.duckdb")
    assert rows == [(3600.0, 0.25 * 1800 + 0.75 * 1800, 100.0 * 3570)]  # right
    assert result.more_series == {("default", "gpu_utilization_ratio"): 1}


def test_a_family_duplicated_alone_is_added_up_and_flagged(tmp_path: Path) -> None:
    util = [_series("gpu_utilization_ratio", f'{DEV},instance="{i}"', 0.5, 30, 3600)
            for i in ("a", "b")]
    counter = [f'gpu_energy_joules_total{{{DEV},instance="b"}} {100 * t} {T0 + t}'
               for t in range(30, 3601, 30)]
    result, rows = _metered(_history(tmp_path / "alone.om", *util, counter),
                            tmp_path / "l.duckdb")
    # The limit, as docs/metering.md states it: twice the SM seconds and the joules.
    assert rows == [(3600.0, 2 * 0.5 * 3600, 2 * 100.0 * 3570)]
    assert result.more_series == {("default", "gpu_utilization_ratio"): 1,
                                   ("default", "gpu_energy_joules_total"): 1}


def test_every_family_twice_is_averaged_and_not_flagged(tmp_path: Path) -> None:
    util = [_series("gpu_utilization_ratio", f'{DEV},instance="{i}"', 0.5, 30, 3600)
            for i in ("a", "b")]
    result, rows = _metered(_history(tmp_path / "jobs.om", *util, up_twice=True),
                            tmp_path / "l.duckdb")
    assert rows == [(3600.0, 0.5 * 3600, 100.0 * 3570)]
    assert result.more_series == {}


def _pushed(gateway: str) -> dict[str, float]:
    """gpu_ledger_meter_more_series_hours of cluster default, by family, from the gateway."""
    with urllib.request.urlopen(gateway + "/api/v1/metrics", timeout=5) as resp:
        groups = json.load(resp)["data"]
    assert len(groups) == 1 and groups[0]["labels"]["cluster"] == "default"
    return {m["labels"]["family"]: float(m["value"])
            for m in groups[0][publish.MORE_SERIES]["metrics"]}


def test_meter_warns_and_pushes_on_a_real_prometheus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The duplicated family from a real Prometheus (promtool backfill): meter's one-line
    warning names the family and the GPU-hours, and the run pushes the hours per family to a
    real Pushgateway (every family, 0 where none; the alert GpuLedgerMeteringSeriesAddedUp
    reads them); the store without it gets no warning and pushes zeros."""
    util = [_series("gpu_utilization_ratio", f'{DEV},instance="{i}"', 0.5, 30, 3600)
            for i in ("a", "b")]
    clean = _history(tmp_path / "clean.om",
                     _series("gpu_utilization_ratio", f'{DEV},instance="a"', 0.5, 30, 3600))
    for name, om in (("clean", clean), ("dup", _history(tmp_path / "dup.om", *util))):
        backfill(om.read_text(), tmp_path / f"tsdb-{name}")
        (tmp_path / f"gw-{name}").mkdir()
        with running_prometheus(tmp_path / f"tsdb-{name}") as url, \
                running_pushgateway(tmp_path / f"gw-{name}") as gateway:
            db = tmp_path / f"{name}.duckdb"
            assert cli_meter.main(["--prometheus", url, "--selector", 'job="gpu"',
                                   "--from", PERIOD[0], "--to", PERIOD[1], "--db", str(db),
                                   "--no-price", "--pushgateway", gateway]) == 0
            pushed = _pushed(gateway)
        assert set(pushed) == set(ADDED_UP_FAMILIES)
        want = 1.0 if name == "dup" else 0.0
        assert pushed == {f: want if f == "gpu_utilization_ratio" else 0.0 for f in pushed}
        err = capsys.readouterr().err
        warnings = [line for line in err.splitlines() if "more series than" in line]
        con = duckdb.connect(str(db), read_only=True)
        try:
            sm = con.execute("SELECT sm_active_seconds FROM device_hours").fetchall()
        finally:
            con.close()
        if name == "clean":
            assert warnings == [] and sm == [(0.5 * 3600,)]
        else:
            assert sm == [(2 * 0.5 * 3600,)]
            assert len(warnings) == 1 and warnings[0].startswith("meter: warning: ")
            assert "gpu_utilization_ratio in 1 GPU-hour(s)" in warnings[0]
