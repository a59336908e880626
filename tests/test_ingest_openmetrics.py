"""Facts from OpenMetrics files: the fleet, how several series of one key combine, bad files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import conftest_prom
import pytest
from conftest_prom import expected_facts, fact_rows

from metering.db import connect
from metering.facts import FactError
from metering.ingest import IngestError, ingest
from metering.openmetrics_source import OpenMetricsError, OpenMetricsSource
from metering.period import resolve
from metering.selector import DEFAULT_SELECTOR, Selector

fleet_om_file = conftest_prom.fleet_om_file  # session fixture
T0 = int(datetime(2026, 10, 5, tzinfo=UTC).timestamp())
DEV = 'node="n1",gpu="0",uuid="GPU-1",model="L4"'
KEY = 'node="n1",namespace="ns",pod="p",container="c",uuid="GPU-1",mig_uuid=""'


def _run(tmp_path: Path, text: str, start: str = "2026-10-05T00:00",
         end: str = "2026-10-05T01:00", selector: Selector = DEFAULT_SELECTOR,
         **kw: object) -> object:
    f = tmp_path / "in.om"
    f.write_text(text)
    period = resolve(None, start, end)
    src = OpenMetricsSource(str(f), period, selector)
    con = connect(tmp_path / "m.duckdb")
    try:
        ingest(con, src, period, **kw)  # type: ignore[arg-type]
        return con
    finally:
        src.close()


def _gpu_up(step: int, until: int = 3600, name: str = "gpu_up", labels: str = DEV,
            value: str = "1", start: int = 0) -> list[str]:
    return [f"{name}{{{labels}}} {value} {T0 + t}" for t in range(start + step, until + 1, step)]


def test_fleet_from_openmetrics(fleet_om_file: Path, tmp_path: Path) -> None:
    period = resolve(None, "2026-10-05", "2026-10-06")
    src = OpenMetricsSource(str(fleet_om_file), period)
    con = connect(tmp_path / "m.duckdb")
    result = ingest(con, src, period, 24)
    src.close()
    assert result.queries == 0 and result.chunks == 1
    for table, rows in expected_facts().items():
        assert fact_rows(con, table) == rows, table


def test_exporter_restart_and_replicas_change_combine(tmp_path: Path) -> None:
    """Two series of one allocation key in one hour (a new `instance` after a restart, and
    replicas 2 -> 4): seconds add up, the series with more samples gives replicas, units
    average over samples."""
    lines = _gpu_up(60)
    alloc = "gpu_container_allocation{%s,resource=\"nvidia.com/gpu\",sharing=\"time-slicing\"," \
            "replicas=\"%s\",instance=\"%s\"} %s %d"
    lines += [alloc % (KEY, "2", "10.0.0.1:9400", "1", T0 + t) for t in range(60, 1201, 60)]
    lines += [alloc % (KEY, "4", "10.0.0.2:9400", "2", T0 + t) for t in range(1260, 3601, 60)]
    lines += [f"gpu_container_memory_used_bytes{{{KEY},instance=\"i{t % 2}\"}} 1024 {T0 + t}"
              for t in range(60, 3601, 60)]
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n")
    row = con.execute("SELECT replicas, units, allocated_seconds, memory_byte_seconds "  # type: ignore[attr-defined]
                      "FROM allocation_hours").fetchall()
    assert row == [(4, (20 * 1 + 40 * 2) / 60, 3600.0, 1024 * 3600.0)]


def test_duplicate_scrapes_are_averaged_not_doubled(tmp_path: Path) -> None:
    """Two scrapers of one exporter: every sample twice, under two `job` labels, both
    metered (the selector names both jobs): 3600 s once; the copy's 60 samples x 60 s are
    reported as 3600 duplicate seconds in the hour's coverage."""
    lines = []
    for job in ("gpu-ledger-exporter", "kubernetes-pods"):
        lines += _gpu_up(60, labels=DEV + f',job="{job}"')
        lines += _gpu_up(60, name="gpu_utilization_ratio", labels=DEV + f',job="{job}"',
                         value="0.5")
    both = Selector.parse('job=~"gpu-ledger-exporter|kubernetes-pods"')
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n", selector=both)
    assert con.execute("SELECT observed_seconds, up_seconds, sm_active_seconds "  # type: ignore[attr-defined]
                       "FROM device_hours").fetchall() == [(3600.0, 3600.0, 1800.0)]
    assert con.execute("SELECT duplicate_seconds FROM coverage").fetchall() == [(3600.0,)]  # type: ignore[attr-defined]


def test_default_selector_meters_the_exporter_job_and_reports_the_rest(tmp_path: Path) -> None:
    """A rogue target publishing gpu_info / gpu_up / gpu_container_allocation under another
    job is not metered, and is reported; the exporter's own series are."""
    rogue = 'node="n1",gpu="9",uuid="GPU-FAKE",model="NVIDIA H100 80GB HBM3",job="rogue"'
    lines = _gpu_up(60, labels=DEV + ',job="gpu-ledger-exporter"') + _gpu_up(60, labels=rogue)
    f = tmp_path / "in.om"
    f.write_text("\n".join(lines) + "\n# EOF\n")
    period = resolve(None, "2026-10-05T00:00", "2026-10-05T01:00")
    src = OpenMetricsSource(str(f), period)
    con = connect(tmp_path / "m.duckdb")
    ingest(con, src, period)
    src.close()
    assert con.execute("SELECT uuid FROM device_hours").fetchall() == [("GPU-1",)]
    assert src.screened.foreign == {("gpu_up", "rogue", ""): 1}


def test_non_finite_and_out_of_range_samples_are_dropped_and_counted(tmp_path: Path) -> None:
    """NaN, +Inf and 7 (a ratio) among 60 utilisation samples: 57 x 0.5 x 60 s are kept and
    the three are counted in the hour's coverage."""
    util = _gpu_up(60, name="gpu_utilization_ratio", labels=DEV, value="0.5")
    for i, bad in ((3, "NaN"), (10, "+Inf"), (20, "7")):
        util[i] = util[i].replace(" 0.5 ", f" {bad} ")
    con = _run(tmp_path, "\n".join(_gpu_up(60) + util) + "\n# EOF\n")
    assert con.execute("SELECT sm_active_seconds FROM device_hours").fetchall() == \
        [(57 * 0.5 * 60,)]  # type: ignore[attr-defined]
    assert con.execute("SELECT dropped_values FROM coverage").fetchall() == [(3,)]  # type: ignore[attr-defined]


def test_partial_hours_and_sample_interval_override(tmp_path: Path) -> None:
    # GPU-2 appeared at 00:45: 15 samples 60 s apart, 900 s; GPU-1 ran the whole hour and
    # sets the node's spacing (the most common samples-per-hour).
    dev2 = DEV.replace("GPU-1", "GPU-2").replace('gpu="0"', 'gpu="1"')
    text = "\n".join(_gpu_up(60) + _gpu_up(60, start=2700, labels=dev2)) + "\n# EOF\n"
    con = _run(tmp_path, text)
    query = "SELECT uuid, observed_seconds FROM device_hours ORDER BY uuid"
    assert con.execute(query).fetchall() == [("GPU-1", 3600.0), ("GPU-2", 900.0)]  # type: ignore[attr-defined]
    con.close()  # type: ignore[attr-defined]
    (tmp_path / "m.duckdb").unlink()
    con = _run(tmp_path, text, sample_interval=30.0)
    assert con.execute(query).fetchall() == [("GPU-1", 1800.0), ("GPU-2", 450.0)]  # type: ignore[attr-defined]


def test_energy_counter_reset_counts_from_zero(tmp_path: Path) -> None:
    lines = _gpu_up(600, until=7200, start=-3600)
    values = {-3000: 100, -600: 500, 0: 600, 1200: 700, 3600: 50}
    lines += ["# TYPE gpu_energy_joules counter"]
    lines += [f"gpu_energy_joules_total{{{DEV}}} {v} {T0 + t}" for t, v in values.items()]
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n", start="2026-10-05T00:00",
               end="2026-10-05T01:00")
    # hour 00:00: last 50 < last of the hour before (600): a reset, so 50.
    assert con.execute("SELECT energy_joules FROM device_hours").fetchall() == [(50.0,)]  # type: ignore[attr-defined]


def test_hours_outside_the_period_are_not_written(tmp_path: Path) -> None:
    lines = _gpu_up(300, until=3 * 3600, start=-3600)
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n", start="2026-10-05T01:00",
               end="2026-10-05T02:00")
    assert con.execute("SELECT hour::VARCHAR FROM device_hours").fetchall() == [  # type: ignore[attr-defined]
        ("2026-10-05 01:00:00",)]


def test_bad_integer_label_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    lines = _gpu_up(60)
    lines += [f'gpu_container_allocation{{{KEY},resource="r",sharing="mps",replicas="four"}}'
              f" 1 {T0 + 60}"]
    with pytest.raises(IngestError, match=r'gpu_container_allocation\{.*pod=p.*\}: label '
                       r"replicas: expected a whole number >= 1, got 'four'"):
        _run(tmp_path, "\n".join(lines) + "\n# EOF\n")
    con = connect(tmp_path / "m.duckdb")
    assert con.execute("SELECT count(*) FROM device_hours").fetchone() == (0,)


def test_allocations_without_any_gpu_up_need_a_sample_interval(tmp_path: Path) -> None:
    text = f'gpu_container_allocation{{{KEY},resource="r",sharing="exclusive",replicas="1"}}' \
           f" 1 {T0 + 60}\n# EOF\n"
    with pytest.raises(IngestError, match="pass --sample-interval"):
        _run(tmp_path, text)
    assert issubclass(FactError, Exception)


@pytest.mark.parametrize(("text", "message"), [
    (f"gpu_up{{{DEV}}} 1\n", r"in.om:1: expected `gpu_up\{...\} VALUE TIMESTAMP`"),
    (f"# TYPE gpu_up gauge\ngpu_up{{{DEV}}} one {T0}\n", r"in.om:2: expected a number"),
    (f'gpu_up{{node="n1",uuid=GPU-1}} 1 {T0}\n', r"in.om:1: expected labels like"),
])
def test_malformed_lines_name_the_file_and_line(tmp_path: Path, text: str,
                                                 message: str) -> None:
    with pytest.raises(OpenMetricsError, match=message):
        _run(tmp_path, text)


def test_escaped_label_values_and_other_families(tmp_path: Path) -> None:
    key = KEY.replace('pod="p"', r'pod="we\"ird\\pod"')
    lines = ["# HELP gpu_temperature_celsius ignored", f"gpu_temperature_celsius{{{DEV}}} 40 {T0}"]
    lines += _gpu_up(60)
    lines += [f'gpu_container_allocation{{{key},resource="r",sharing="exclusive",replicas="1",'
              f'label_team="a b,c"}} 1 {T0 + t}' for t in range(60, 601, 60)]
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n")
    assert con.execute("SELECT pod, labels, allocated_seconds FROM allocation_hours"  # type: ignore[attr-defined]
                       ).fetchall() == [('we"ird\\pod', {"team": "a b,c"}, 600.0)]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OpenMetricsError, match=r"nope\.om: cannot read"):
        OpenMetricsSource(str(tmp_path / "nope.om"), resolve("2026-10", None, None))


def test_fractional_grants_become_grant_facts(tmp_path: Path) -> None:
    """A HAMi grant (memory 0.25, cores 0.3) and a gpushare grant (memory only) scraped twice
    (two jobs): one grant_hours row per allocation, the fractions as exported; an allocation
    without a grant has no row."""
    lines = _gpu_up(60)
    other = KEY.replace('pod="p"', 'pod="q"')
    plain = KEY.replace('pod="p"', 'pod="r"')
    alloc = ("gpu_container_allocation{%s,resource=\"nvidia.com/gpumem\",sharing=\"fractional\","
             "replicas=\"2\",job=\"%s\"} 1 %d")
    for job in ("gpu-ledger-exporter", ""):  # the job-less copy: backfilled history
        for key in (KEY, other, plain):
            lines += [alloc % (key, job, T0 + t) for t in range(60, 3601, 60)]
        lines += [f'gpu_container_memory_fraction{{{KEY},job="{job}"}} 0.25 {T0 + t}'
                  for t in range(60, 3601, 60)]
        lines += [f'gpu_container_core_fraction{{{KEY},job="{job}"}} 0.3 {T0 + t}'
                  for t in range(60, 3601, 60)]
        lines += [f'gpu_container_memory_fraction{{{other},job="{job}"}} 0.75 {T0 + t}'
                  for t in range(60, 3601, 60)]
    con = _run(tmp_path, "\n".join(lines) + "\n# EOF\n")
    rows = con.execute("SELECT pod, memory_fraction, core_fraction FROM grant_hours "  # type: ignore[attr-defined]
                       "ORDER BY pod").fetchall()
    assert rows == [("p", 0.25, 0.3), ("q", 0.75, None)]


def test_skipping_the_dedup_window_changes_no_fact(fleet_om_file: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no fact key has two series the spans window is skipped (metering/facts.py): the
    facts equal those of the window run anyway, row for row, and where keys do have two
    series (a restart, two scrape jobs) it still runs."""
    from metering import facts

    period = resolve(None, "2026-10-05", "2026-10-06")
    ran: list[bool] = []
    real = facts._shares_keys
    monkeypatch.setattr(facts, "_shares_keys", lambda t: ran.append(real(t)) or ran[-1])
    rows = {}
    for window in ("when needed", "always"):
        if window == "always":
            monkeypatch.setattr(facts, "_DEDUP_STEPS", frozenset())
        src = OpenMetricsSource(str(fleet_om_file), period)
        con = connect(tmp_path / f"{window}.duckdb")
        ingest(con, src, period, 24)
        src.close()
        rows[window] = {t: fact_rows(con, t) for t in expected_facts()}
    assert ran and not any(ran)  # the fleet has one series per key: skipped
    assert rows["when needed"] == rows["always"]
    ran.clear()
    monkeypatch.setattr(facts, "_DEDUP_STEPS", frozenset(("spans", "held")))
    (tmp_path / "dup").mkdir()
    twice = [*_gpu_up(30, labels=DEV + ',job="a"'), *_gpu_up(30, labels=DEV + ',job="b"')]
    con = _run(tmp_path / "dup", "\n".join(twice) + "\n# EOF\n",
               selector=Selector.parse('job=~"a|b"'))
    assert any(ran)
    assert con.execute("SELECT observed_seconds FROM device_hours"  # type: ignore[attr-defined]
                       ).fetchall() == [(3600.0,)]
