"""Energy and carbon in the cost model: the measured-energy price (with a time-of-use tariff)
and the carbon intensity (a flat figure, or an hourly table as grid operators publish it).

The cost model's `energy:` and `carbon:` sections resolve to these types (metering/costmodel.py
parses them); pricing turns them into one price and one intensity per hour of the period
(`hourly_factors`) and metering/sql/pricing.sql splits each device-hour's measured joules
among its holders (docs/cost-model.md, "Energy and carbon").
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Final
from zoneinfo import ZoneInfo

from metering.errors import InputError

DAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_GRAMS_PER_KWH: Final = Decimal(10_000)  # the dirtiest grids are near 1,000
JOULES_PER_KWH: Final = 3_600_000


@dataclass(frozen=True)
class TariffWindow:
    """One `energy.tariff[]` entry: a price for the hours [start, end) of the listed days, in
    the tariff's time zone. start > end crosses midnight ("22-06": 22:00 to 06:00); each hour
    is checked on its own, by its own weekday."""

    key: str  # energy.tariff[0], for messages
    start: int  # 0-23
    end: int  # 1-24
    days: frozenset[int]  # datetime.weekday(): 0 = Monday
    price_per_kwh: Decimal

    def covers(self, local: datetime) -> bool:
        if local.weekday() not in self.days:
            return False
        h = local.hour
        return self.start <= h < self.end if self.start < self.end else \
            (h >= self.start or h < self.end)


@dataclass(frozen=True)
class EnergyPricing:
    """`energy:`: measured kWh x PUE x the price of the hour. With it the device-hour rate is
    the capital + overhead part only (a derived price drops its power_watts term)."""

    price_per_kwh: Decimal
    pue: Decimal
    tariff: tuple[TariffWindow, ...] = ()
    timezone: str = "UTC"

    def price_at(self, hour: datetime) -> Decimal:
        """The price of one kWh in the hour starting at `hour` (naive UTC): the first tariff
        window that covers it, else price_per_kwh."""
        local = hour.replace(tzinfo=UTC).astimezone(ZoneInfo(self.timezone))
        return next((w.price_per_kwh for w in self.tariff if w.covers(local)),
                    self.price_per_kwh)


@dataclass(frozen=True)
class Carbon:
    """`carbon:`: grams of CO2e per kWh, flat or per hour from a CSV. `intensity` holds the
    CSV's hours (naive UTC hour starts); hours it lacks use grams_per_kwh. A cost model read
    back from the ledger has no CSV at hand: its intensity is empty (the grams were priced
    already and are stored with the energy rows)."""

    grams_per_kwh: Decimal
    intensity_csv: str | None = None  # as written in the cost model
    intensity: Mapping[datetime, Decimal] = field(default_factory=dict)

    def grams_at(self, hour: datetime) -> Decimal:
        return self.intensity.get(hour, self.grams_per_kwh)


class IntensityError(InputError):
    """A carbon intensity CSV is malformed; str() is `FILE:LINE: problem`."""


def _timestamp(text: str) -> datetime | None:
    """An ISO 8601 timestamp with its offset (Z or +hh:mm), as naive UTC; None otherwise."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    return t.astimezone(UTC).replace(tzinfo=None)


def read_intensity(path: Path, name: str) -> dict[datetime, Decimal]:
    """Hour start (naive UTC) -> gCO2e/kWh from a CSV of `timestamp,grams_per_kwh` lines.
    Strict: a first line that is not data is a header; every other line has exactly two
    fields, a timestamp on the hour with its UTC offset and a number 0-10000; no hour twice.
    Any problem is an IntensityError naming `name:line`."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise IntensityError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise IntensityError(f"{name}: cannot read it ({e})") from None
    out: dict[datetime, Decimal] = {}
    for line, row in enumerate(csv.reader(text.splitlines()), start=1):
        where = f"{name}:{line}"
        if len(row) != 2:
            raise IntensityError(f"{where}: expected 2 fields (timestamp, gCO2e/kWh), "
                                 f"got {len(row)}")
        hour = _timestamp(row[0])
        if hour is None:
            if line == 1 and not out:
                continue  # the header
            raise IntensityError(f"{where}: expected an ISO 8601 timestamp with its UTC "
                                 f"offset like 2026-10-01T00:00:00Z, got {row[0]!r}")
        if hour.minute or hour.second or hour.microsecond:
            raise IntensityError(f"{where}: expected a timestamp on the hour, got {row[0]!r}")
        if hour in out:
            raise IntensityError(f"{where}: hour {hour:%Y-%m-%dT%H:%M}Z already given")
        try:
            value = Decimal(row[1].strip())
        except InvalidOperation:
            value = Decimal("NaN")
        if (not value.is_finite() or value < 0 or value > MAX_GRAMS_PER_KWH
                or value != value.quantize(Decimal("0.001"))):
            raise IntensityError(f"{where}: expected gCO2e/kWh, a number 0-"
                                 f"{MAX_GRAMS_PER_KWH} (3 decimals at most), got {row[1]!r}")
        out[hour] = value
    if not out:
        raise IntensityError(f"{name}: no hours (expected lines of timestamp,gCO2e/kWh)")
    return out


def hours_of(start: datetime, end: datetime) -> list[datetime]:
    n = int((end - start).total_seconds() // 3600)
    return [start + timedelta(hours=i) for i in range(n)]
