"""Energy and carbon per holder (issue 28): each device-hour's measured joules split among its
holders, priced by a time-of-use tariff and turned into CO2e, checked against months worked by
hand with exact fractions (never by calling the code under test), and the invariant
holders + idle + down = the device's energy, cost and CO2e, exactly, for any fleet."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from math import floor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering.costmodel import CostModel, CostModelError, load_cost_model
from metering.db import connect
from metering.pricing import price_period
from tests.ledger_rows import ins
from tests.test_pricing import _fleets, alloc, grant, mig

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
T0 = datetime(2026, 10, 1, 0, 0)  # a Thursday
T1 = T0 + timedelta(hours=1)
MJ_PER_KWH = 3_600_000_000  # millijoules

# H100: 35,040 / (48 x 730 h) = 1.00 capital + 0.25 overhead; 700 W x PUE 1.2 x 0.12/kWh =
# 0.1008 of energy when the flat (TCO) rate prices it.
BASE = """
currency: EUR
pricing:
  default: {hourly: 1.00, memory_gb: 40}
  gpus:
    - model: "NVIDIA H100 80GB HBM3"
      derived: {purchase_price: 35040, depreciation_months: 48, hours_per_month: 730,
                power_watts: 700, electricity_per_kwh: 0.12, pue: 1.2, overhead_hourly: 0.25}
teams:
  namespaces: [{namespace: research, team: science}, {namespace: "ml-*", team: ml}]
"""
ENERGY = """
energy:
  price_per_kwh: 0.30
  pue: 1.2
  tariff:
    - {hours: "22-06", price_per_kwh: 0.10}
carbon: {grams_per_kwh: 400}
"""


def model(tmp_path: Path, extra: str = "") -> CostModel:
    path = tmp_path / "cost-model.yaml"
    path.write_text(BASE + extra)
    return load_cost_model(path)


@pytest.fixture
def con() -> Any:
    c = connect(":memory:")
    yield c
    c.close()


def device(con: Any, uuid: str, joules: float | None, *, model_name: str = H100,
           hour: datetime = T0, up: float = 3600, is_mig: bool = False,
           estimated: bool = False, cluster: str = "default") -> None:
    con.execute(ins("device_hours") + "VALUES (?, 'n1', '0', ?, ?, ?, 3600, ?, NULL, ?)",
                [hour, uuid, model_name, is_mig, up, joules])
    con.execute("UPDATE device_hours SET cluster = ?, energy_estimated = ? WHERE uuid = ? AND "
                "hour = ?", [cluster, estimated, uuid, hour])


def energy(con: Any, where: str = "true") -> dict[str, tuple[Decimal, Decimal | None,
                                                            Decimal | None, str]]:
    """pod (or 'idle:uuid' / 'down:uuid') -> (joules, cost, grams, rule), summed over hours."""
    out: dict[str, tuple[Decimal, Decimal | None, Decimal | None, str]] = {}
    for team, pod, uuid, j, c, g, rule in con.execute(
            "SELECT team, pod, uuid, sum(energy_joules), sum(energy_cost), sum(co2e_grams), "
            f"any_value(rule) FROM energy_hours WHERE {where} GROUP BY ALL").fetchall():
        out[pod or f"{team}:{uuid}"] = (j, c, g, rule)
    return out


def money(kwh: Fraction, price: str, pue: str = "1.2") -> Decimal:
    """A device-hour's energy cost, rounded half up to the micro."""
    micros = kwh * Fraction(pue) * Fraction(price) * 1_000_000
    return Decimal(floor(micros + Fraction(1, 2))) / 1_000_000


def grams(kwh: Fraction, per_kwh: str, pue: str = "1.2") -> Decimal:
    mg = kwh * Fraction(pue) * Fraction(per_kwh) * 1000
    return Decimal(floor(mg + Fraction(1, 2))) / 1000


def split(total: Decimal, part_mj: int, all_mj: int, unit: int) -> Decimal:
    """A holder's part of a device-hour figure: floor(total x part / all) in `unit`s."""
    return Decimal(floor(Fraction(total) * unit * part_mj / all_mj)) / unit


# --- hand-computed months ------------------------------------------------------------------


def test_an_exclusive_gpu_pays_its_capital_rate_and_its_measured_energy(
        con: Any, tmp_path: Path) -> None:
    """700 W for the hour (2.52 MJ = 0.7 kWh) held by one pod at 01:00 (0.30/kWh): energy
    0.7 x 1.2 x 0.30 = 0.252, carbon 0.7 x 1.2 x 400 = 336 g; compute 1.25 (capital +
    overhead), where the flat rate was 1.3508."""
    hour = T0 + timedelta(hours=8)  # 08:00, outside the night tariff
    device(con, "GPU-0", 2_520_000.0, hour=hour)
    alloc(con, "train", "GPU-0", hour=hour)
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(days=1))
    assert energy(con) == {"train": (Decimal("2520000.000"), Decimal("0.252000"),
                                     Decimal("336.000"), "held")}
    assert con.execute("SELECT cost FROM charges").fetchall() == [(Decimal("1.250000"),)]
    # Without `energy:` the flat TCO rate stays, and the joules are still split (unpriced).
    price_period(con, model(tmp_path), T0, T0 + timedelta(days=1))
    assert con.execute("SELECT cost FROM charges").fetchall() == [(Decimal("1.350800"),)]
    assert energy(con) == {"train": (Decimal("2520000.000"), None, None, "held")}


def test_mig_instances_split_energy_by_gpm_activity_else_by_slices(
        con: Any, tmp_path: Path) -> None:
    """H100 (GPM): 1.8 MJ; 3g.40gb active half the hour = 3/14 of the device, 2g.20gb busy
    all hour = 2/7; the rest idle. A100 (no GPM): 1.44 MJ; a 3g.20gb holder pays its 3/7."""
    hour = T0 + timedelta(hours=12)
    device(con, "GPU-M", 1_800_000.0, hour=hour, is_mig=True)
    mig(con, "GPU-M", "MIG-1", "3g.40gb", 3, hour=hour, gpm=1800)
    mig(con, "GPU-M", "MIG-2", "2g.20gb", 2, hour=hour, gpm=3600)
    alloc(con, "half", "GPU-M", mig_uuid="MIG-1", sharing="mig", sm=None, hour=hour)
    alloc(con, "busy", "GPU-M", mig_uuid="MIG-2", sharing="mig", sm=None, hour=hour)
    device(con, "GPU-A", 1_440_000.0, model_name=A100, hour=hour, is_mig=True)
    mig(con, "GPU-A", "MIG-3", "3g.20gb", 3, hour=hour)
    alloc(con, "slices", "GPU-A", mig_uuid="MIG-3", sharing="mig", sm=None, hour=hour)
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(days=1))
    got = energy(con)
    h_mj, a_mj = 1_800_000_000, 1_440_000_000
    parts = {"half": (h_mj, floor(h_mj * Fraction(1, 2) * Fraction(3, 7)), "mig-activity"),
             "busy": (h_mj, floor(h_mj * Fraction(2, 7)), "mig-activity"),
             "slices": (a_mj, floor(a_mj * Fraction(3, 7)), "mig-slices")}
    for pod, (dev_mj, mj, rule) in parts.items():
        kwh = Fraction(dev_mj, MJ_PER_KWH)
        assert got[pod] == (Decimal(mj) / 1000, split(money(kwh, "0.30"), mj, dev_mj, 10**6),
                            split(grams(kwh, "400"), mj, dev_mj, 1000), rule), pod
    idle_mj = h_mj - parts["half"][1] - parts["busy"][1]
    assert got["idle:GPU-M"][0] == Decimal(idle_mj) / 1000  # 1.8 MJ x 1/2 = 900,000 J
    assert got["idle:GPU-M"][1] == money(Fraction(h_mj, MJ_PER_KWH), "0.30") \
        - got["half"][1] - got["busy"][1]  # type: ignore[operator]


def test_time_slicing_splits_by_sm_share_and_keeps_the_idle_remainder(
        con: Any, tmp_path: Path) -> None:
    """1.44 MJ (0.4 kWh) at 12:00 on a GPU time-sliced 4 ways: x busy 900 s (1/4), y 1800 s
    (1/2), the remaining quarter idle. 0.4 kWh x 1.2 x 0.30 = 0.144; x 0.036, y 0.072, idle
    0.036; CO2e 192 g: 48, 96, 48."""
    hour = T0 + timedelta(hours=12)
    device(con, "GPU-T", 1_440_000.0, hour=hour)
    alloc(con, "x", "GPU-T", sharing="time-slicing", replicas=4, units=1, sm=900, hour=hour)
    alloc(con, "y", "GPU-T", sharing="time-slicing", replicas=4, units=2, sm=1800, hour=hour)
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(days=1))
    assert energy(con) == {
        "x": (Decimal("360000.000"), Decimal("0.036000"), Decimal("48.000"), "sm-share"),
        "y": (Decimal("720000.000"), Decimal("0.072000"), Decimal("96.000"), "sm-share"),
        "idle:GPU-T": (Decimal("360000.000"), Decimal("0.036000"), Decimal("48.000"), "idle")}


def test_a_gpu_down_part_of_the_hour_keeps_that_part_apart(con: Any, tmp_path: Path) -> None:
    """Up 45 minutes, held all of them: 3.6 MJ, a quarter (900 kJ) is the down time's."""
    hour = T0 + timedelta(hours=12)
    device(con, "GPU-D", 3_600_000.0, hour=hour, up=2700)
    alloc(con, "p", "GPU-D", seconds=2700, hour=hour)
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(days=1))
    got = energy(con)
    assert got["p"][:3] == (Decimal("2700000.000"), Decimal("0.270000"), Decimal("360.000"))
    assert got["down:GPU-D"][:3] == (Decimal("900000.000"), Decimal("0.090000"),
                                     Decimal("120.000"))
    assert "idle:GPU-D" not in got


def test_a_time_of_use_tariff_crossing_midnight(con: Any, tmp_path: Path) -> None:
    """1 kWh an hour from 21:00 to 07:00: 21:00 and 06:00 at 0.30, the eight hours 22-06 at
    0.10: (2 x 0.30 + 8 x 0.10) x PUE 1.2 = 1.68."""
    start = T0 + timedelta(hours=21)
    for h in range(10):
        device(con, "GPU-0", 3_600_000.0, hour=start + timedelta(hours=h))
        alloc(con, "p", "GPU-0", hour=start + timedelta(hours=h))
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(days=2))
    hand = 2 * money(Fraction(1), "0.30") + 8 * money(Fraction(1), "0.10")
    assert hand == Decimal("1.68")
    assert energy(con)["p"][1] == hand
    rows = con.execute("SELECT hour::TIME::VARCHAR, price_per_kwh FROM energy_hours "
                       "ORDER BY hour").fetchall()
    assert [p for _, p in rows] == [Decimal("0.3")] + [Decimal("0.1")] * 8 + [Decimal("0.3")]


def test_tariff_days_and_time_zone(con: Any, tmp_path: Path) -> None:
    """A weekend price all day (Sat 3 Oct 2026) and a night price 22-06 in Berlin (UTC+2 in
    October): 20:00 UTC on Thursday is 22:00 there; 19:00 UTC is not."""
    extra = """
energy:
  price_per_kwh: 0.30
  timezone: Europe/Berlin
  tariff:
    - {hours: "0-24", days: [sat, sun], price_per_kwh: 0.05}
    - {hours: "22-06", price_per_kwh: 0.10}
"""
    cm = model(tmp_path, extra)
    assert cm.energy is not None
    sat_noon = datetime(2026, 10, 3, 12)
    assert [cm.energy.price_at(h) for h in (T0 + timedelta(hours=19), T0 + timedelta(hours=20),
                                            sat_noon, datetime(2026, 10, 5, 4))] == \
        [Decimal("0.30"), Decimal("0.10"), Decimal("0.05"), Decimal("0.30")]  # Mon 06:00 Berlin


def test_two_clusters_with_their_own_carbon_intensity(con: Any, tmp_path: Path) -> None:
    """eu at 50 g/kWh; us from an hourly CSV (300 g at 10:00, the flat 400 elsewhere). 1 kWh
    each hour, PUE 1 (no `energy:`): eu 2 x 50 = 100 g, us 300 + 400 = 700 g."""
    (tmp_path / "grid.csv").write_text(
        "datetime,carbon_intensity\n2026-10-01T10:00:00Z,300\n2026-10-01T13:00:00+02:00,250\n")
    extra = ("carbon: {grams_per_kwh: 400, intensity_csv: grid.csv}\n"
             "clusters:\n  eu:\n    carbon: {grams_per_kwh: 50}\n")
    for cluster in ("eu", "us"):
        for h in (10, 12):
            device(con, f"GPU-{cluster}", 3_600_000.0, hour=T0 + timedelta(hours=h),
                   cluster=cluster)
    price_period(con, model(tmp_path, extra), T0, T0 + timedelta(days=1))
    got = dict(con.execute("SELECT cluster, sum(co2e_grams) FROM energy_hours GROUP BY 1"
                           ).fetchall())
    # 13:00+02:00 is 11:00 UTC, an hour without energy here: it changes nothing.
    assert got == {"eu": Decimal(2 * 50), "us": Decimal(300 + 400)}


def test_counter_reset_and_missing_counter_are_estimated_from_power(
        con: Any, tmp_path: Path) -> None:
    """OpenMetrics in, hand-computed facts out: GPU-R's counter resets (its hour is 60
    power samples of 500 W, 60 s apart = 1.8 MJ); GPU-N has no counter (250 W = 0.9 MJ);
    GPU-C's counter is whole (600 kJ) and wins over its power samples."""
    from metering.ingest import ingest
    from metering.openmetrics_source import OpenMetricsSource
    from metering.period import resolve

    t0 = int(datetime(2026, 10, 5, tzinfo=__import__("datetime").UTC).timestamp())
    lines: list[str] = []
    for uuid, watts, counter in (("GPU-R", 500, {0: 9e6, 3600: 1000}),
                                 ("GPU-N", 250, {}),
                                 ("GPU-C", 800, {0: 100, 3600: 600_100})):
        dev = f'node="n1",gpu="0",uuid="{uuid}",model="L4"'
        lines += [f"gpu_up{{{dev}}} 1 {t0 + t}" for t in range(60, 3601, 60)]
        lines += [f"gpu_power_watts{{{dev}}} {watts} {t0 + t}" for t in range(60, 3601, 60)]
        lines += [f"gpu_energy_joules_total{{{dev}}} {v} {t0 + t}" for t, v in counter.items()]
    key = 'node="n1",namespace="research",pod="p",container="c",uuid="GPU-R",mig_uuid=""'
    lines += [f'gpu_container_allocation{{{key},resource="nvidia.com/gpu",sharing="exclusive",'
              f'replicas="1"}} 1 {t0 + t}' for t in range(60, 3601, 60)]
    f = tmp_path / "in.om"
    f.write_text("\n".join(sorted(lines, key=lambda s: int(s.rsplit(" ", 1)[1])))
                 + "\n# EOF\n")
    period = resolve(None, "2026-10-05T00:00", "2026-10-05T01:00")
    src = OpenMetricsSource(str(f), period)
    try:
        ingest(con, src, period)
    finally:
        src.close()
    facts = dict((u, (j, e)) for u, j, e in con.execute(
        "SELECT uuid, energy_joules, energy_estimated FROM device_hours").fetchall())
    assert facts == {"GPU-R": (60 * 500 * 60.0, True), "GPU-N": (60 * 250 * 60.0, True),
                     "GPU-C": (600_000.0, False)}
    price_period(con, model(tmp_path, ENERGY), datetime(2026, 10, 5), datetime(2026, 10, 6))
    rows = con.execute("SELECT team, uuid, energy_joules, estimated, energy_cost FROM "
                       "energy_hours ORDER BY uuid").fetchall()
    # 00:00 is in the night tariff: 0.10/kWh x PUE 1.2. 1.8 MJ = 0.5 kWh -> 0.06.
    assert rows == [("idle", "GPU-C", Decimal("600000.000"), False, money(Fraction(1, 6), "0.10")),
                    ("idle", "GPU-N", Decimal("900000.000"), True, money(Fraction(1, 4), "0.10")),
                    ("science", "GPU-R", Decimal("1800000.000"), True, Decimal("0.060000"))]


def test_a_device_without_any_energy_figure_has_no_energy_rows(con: Any,
                                                                tmp_path: Path) -> None:
    device(con, "GPU-0", None)
    alloc(con, "p", "GPU-0")
    price_period(con, model(tmp_path, ENERGY), T0, T1)
    assert energy(con) == {}  # unknown, never 0 J


# --- the invariant ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(facts=_fleets(), data=st.data(), split_by=st.sampled_from(["replicas", "sm"]))
def test_holders_plus_idle_plus_down_are_the_device_energy_exactly(
        tmp_path: Path, facts: list[tuple[str, Any]], data: st.DataObject,
        split_by: str) -> None:
    cm = model(tmp_path, ENERGY + f"sharing: {{split: {split_by}}}\n")
    c = connect(":memory:")
    try:
        seen_mig: set[tuple[str, datetime]] = set()
        for kind, f in facts:
            if kind == "device":
                uuid, name, hour, up, is_mig = f
                joules = data.draw(st.one_of(st.none(), st.floats(0, 1e7)))
                device(c, uuid, joules, model_name=name, hour=hour, up=up, is_mig=is_mig)
            elif kind == "mig":
                uuid, mig_uuid, profile, slices, hour, gpm = f
                if (mig_uuid, hour) not in seen_mig:
                    seen_mig.add((mig_uuid, hour))
                    mig(c, uuid, mig_uuid, profile, slices, hour, gpm)
            elif kind == "grant":
                grant(c, f["pod"], f["uuid"], f["memory"], f["cores"], ns=f["ns"],
                      hour=f["hour"])
            else:
                alloc(c, f.pop("pod"), f.pop("uuid"), **f)
        price_period(c, cm, T0, T0 + timedelta(hours=3))
        devices = c.execute("SELECT hour, uuid, energy_joules FROM device_hours "
                            "WHERE energy_joules IS NOT NULL").fetchall()
        rows = {(h, u): (j, cost, g, n) for h, u, j, cost, g, n in c.execute(
            "SELECT hour, uuid, sum(energy_joules), sum(energy_cost), sum(co2e_grams), "
            "count(*) FROM energy_hours GROUP BY ALL").fetchall()}
        for hour, uuid, joules in devices:
            mj = round(joules * 1000)
            kwh = Fraction(mj, MJ_PER_KWH)
            price = "0.10" if hour.hour >= 22 or hour.hour < 6 else "0.30"
            want = (Decimal(mj) / 1000, money(kwh, price), grams(kwh, "400"))
            got = rows.pop((hour, uuid), (Decimal(0), Decimal(0), Decimal(0), 0))
            assert got[:3] == want, (hour, uuid)
        assert rows == {}  # no energy rows for a device-hour without an energy figure
        assert c.execute("SELECT count(*) FROM energy_hours WHERE energy_joules < 0 OR "
                         "energy_cost < 0 OR co2e_grams < 0").fetchone() == (0,)
    finally:
        c.close()


# --- the cost model --------------------------------------------------------------------------


def _error(tmp_path: Path, extra: str) -> str:
    with pytest.raises(CostModelError) as info:
        model(tmp_path, extra)
    return str(info.value).replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize(("extra", "message"), [
    ("energy: {pue: 1.2}\n",
     "cost-model.yaml: energy.price_per_kwh: expected a number >= 0 (the price of one kWh)"),
    ("energy: {price_per_kwh: 0.2, pue: 0.9}\n",
     "cost-model.yaml: energy.pue: expected a number >= 1 and <= 10, got 0.9"),
    ("energy: {price_per_kwh: 0.2, timezone: Mars/Olympus}\n",
     "cost-model.yaml: energy.timezone: expected an IANA time zone like Europe/Berlin, "
     'got "Mars/Olympus"'),
    ("energy: {price_per_kwh: 0.2, tariff: [{hours: '22-22', price_per_kwh: 0.1}]}\n",
     'cost-model.yaml: energy.tariff[0].hours: expected START-END in whole hours, 0-23 and '
     '1-24, like "07-22" or "22-06" (crossing midnight), got "22-22"'),
    ("energy: {price_per_kwh: 0.2, tariff: [{hours: '1-5', days: [sun, fri2], "
     "price_per_kwh: 0.1}]}\n",
     "cost-model.yaml: energy.tariff[0].days: expected one of mon | tue | wed | thu | fri | "
     'sat | sun (did you mean "fri"?), got "fri2"'),
    ("energy: {price_per_kwh: 0.2, tarif: []}\n",
     "cost-model.yaml: energy.tarif: expected a known key: price_per_kwh, pue, tariff, "
     'timezone, got unknown key "tarif" (did you mean "tariff"?)'),
    ("energy: {price_per_kwh: 0.1234567}\n",
     "cost-model.yaml: energy.price_per_kwh: expected a price with at most 6 decimal places, "
     "got 0.1234567"),
    ("carbon: {grams_per_kwh: -1}\n",
     "cost-model.yaml: carbon.grams_per_kwh: expected a number >= 0 and <= 10000, got -1"),
    ("carbon: {grams_per_kwh: 1, intensity_csv: none.csv}\n",
     "cost-model.yaml: carbon.intensity_csv: expected a CSV of timestamp,gCO2e/kWh lines "
     "(none.csv: no such file)"),
])
def test_bad_energy_and_carbon_sections_are_one_line_errors(
        tmp_path: Path, extra: str, message: str) -> None:
    assert _error(tmp_path, extra) == message


@pytest.mark.parametrize(("csv", "problem"), [
    ("t,g\n2026-10-01T00:00:00Z,1\n2026-10-01T00:00:00Z,2\n",
     "grid.csv:3: hour 2026-10-01T00:00Z already given"),
    ("2026-10-01T00:00:00Z,1\n2026-10-01T01:00:00,2\n",
     "grid.csv:2: expected an ISO 8601 timestamp with its UTC offset like "
     "2026-10-01T00:00:00Z, got '2026-10-01T01:00:00'"),
    ("2026-10-01T00:30:00Z,1\n", "grid.csv:1: expected a timestamp on the hour, got "
     "'2026-10-01T00:30:00Z'"),
    ("2026-10-01T00:00:00Z,abc\n", "grid.csv:1: expected gCO2e/kWh, a number 0-10000 "
     "(3 decimals at most), got 'abc'"),
    ("2026-10-01T00:00:00Z,1,2\n", "grid.csv:1: expected 2 fields (timestamp, gCO2e/kWh), "
     "got 3"),
    ("timestamp,g\n", "grid.csv: no hours (expected lines of timestamp,gCO2e/kWh)"),
])
def test_a_bad_intensity_csv_names_its_line(tmp_path: Path, csv: str, problem: str) -> None:
    (tmp_path / "grid.csv").write_text(csv)
    assert _error(tmp_path, "carbon: {grams_per_kwh: 1, intensity_csv: grid.csv}\n") == (
        "cost-model.yaml: carbon.intensity_csv: expected a CSV of timestamp,gCO2e/kWh lines "
        f"({problem})")


def test_the_packaged_examples_parse_and_the_docs_name_every_key(tmp_path: Path) -> None:
    """The commented-out `energy:` and `carbon:` examples of cost-model.yaml, uncommented,
    are a valid cost model; docs/cost-model.md names every key."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "cost-model.yaml").read_text()
    examples = []
    for section in ("energy", "carbon"):
        lines = text.split(f"\n# {section}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        examples.append(f"{section}:\n" + "\n".join(line[2:] for line in lines))
    (tmp_path / "grid-intensity.csv").write_text("timestamp,g\n2026-10-01T00:00:00Z,123\n")
    cm = model(tmp_path, "\n".join(examples) + "\n")
    assert cm.energy is not None and cm.carbon is not None
    assert cm.energy.price_at(datetime(2026, 10, 3, 23)) == Decimal("0.10")  # Sat night
    assert cm.energy.price_at(datetime(2026, 10, 3, 12)) == Decimal("0.12")  # Sat noon
    assert cm.energy.price_at(datetime(2026, 10, 1, 12)) == Decimal("0.20")  # Thu noon
    assert cm.carbon.grams_at(T0) == Decimal(123) and cm.carbon.grams_at(T1) == Decimal(350)
    docs = (root / "docs" / "cost-model.md").read_text()
    for key in ("energy", "price_per_kwh", "pue", "timezone", "tariff", "hours", "days",
                "carbon", "grams_per_kwh", "intensity_csv"):
        assert f"`{key}" in docs, key


def test_co2e_left_over_by_the_holders_floors_stays_on_an_idle_row(tmp_path: Path,
                                                                    con: Any) -> None:
    """Two exclusive holders split 49 J: every joule and micro is held, but each holder's
    CO2e floors to 3 of the hour's 7 mg; the milligram left goes to an idle row, not lost
    (found by test_holders_plus_idle_plus_down_are_the_device_energy_exactly)."""
    device(con, "GPU-0", 49.0, hour=T0 + timedelta(hours=1))
    for pod in ("p0", "p1"):
        alloc(con, pod, "GPU-0", sm=None, hour=T0 + timedelta(hours=1))
    price_period(con, model(tmp_path, ENERGY), T0, T0 + timedelta(hours=3))
    kwh = Fraction(49_000, MJ_PER_KWH)
    got = energy(con)
    assert sum(g for _, _, g, _ in got.values() if g is not None) == grams(kwh, "400")
    assert got["idle:GPU-0"][:3] == (Decimal(0), Decimal(0), Decimal("0.001"))
