"""The time vocabulary of metering, defined once: UTC hours, months, periods, hour ranges.

The ledger stores naive timestamps that mean UTC (DuckDB TIMESTAMP); options and sources
speak aware UTC datetimes. `utc_naive` is the one conversion between them. A `Period` is
[start, end) on whole UTC hours (aware); a `Month` is a calendar month (its bounds naive, as
the ledger's `hour` column); an `HourRange` names a run of hours (e.g. without data).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from metering.errors import UsageError

HOUR = timedelta(hours=1)
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class PeriodError(UsageError, ValueError):
    """A period argument is malformed or names no metered time."""


def utc_naive(t: datetime) -> datetime:
    """The ledger's form of a time: naive UTC. An aware time is converted; a naive one is
    taken as UTC already."""
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo is not None else t


def utc_aware(t: datetime) -> datetime:
    """The sources' form of a time: aware UTC. A naive time is taken as UTC."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def fmt_hour(t: datetime) -> str:
    """`2026-10-05T13:00Z`: how messages name an hour."""
    return utc_aware(t).strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True, order=True)
class Month:
    """A calendar month in UTC."""

    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Month:
        """`YYYY-MM`; PeriodError (a ValueError) says what was expected."""
        m = _MONTH.match(text.strip())
        if m is None:
            raise PeriodError(f"expected a month like 2026-10, got {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def start(self) -> datetime:
        """First hour of the month, naive UTC (as the ledger stores hours)."""
        return datetime(self.year, self.month, 1)

    @property
    def end(self) -> datetime:
        """First hour after the month (exclusive bound), naive UTC."""
        return self.next().start

    @property
    def hours(self) -> int:
        return calendar.monthrange(self.year, self.month)[1] * 24

    def period(self) -> Period:
        return Period(utc_aware(self.start), utc_aware(self.end))

    @classmethod
    def of(cls, t: datetime) -> Month:
        """The month holding `t` (naive: UTC)."""
        t = utc_naive(t)
        return cls(t.year, t.month)

    def previous(self) -> Month:
        return Month(self.year - 1, 12) if self.month == 1 else Month(self.year, self.month - 1)

    def next(self) -> Month:
        return Month(self.year + 1, 1) if self.month == 12 else Month(self.year, self.month + 1)


@dataclass(frozen=True)
class Period:
    """[start, end) in UTC (aware), both on the hour."""

    start: datetime
    end: datetime
    clipped: bool = False  # end was cut back to the last complete hour

    @property
    def hours(self) -> int:
        return int((self.end - self.start) / HOUR)

    def naive(self) -> tuple[datetime, datetime]:
        """(start, end) as the ledger stores hours."""
        return utc_naive(self.start), utc_naive(self.end)

    def chunks(self, hours: int) -> Iterator[Period]:
        """Consecutive sub-periods of at most `hours` hours."""
        step = timedelta(hours=hours)
        cur = self.start
        while cur < self.end:
            nxt = min(cur + step, self.end)
            yield Period(cur, nxt)
            cur = nxt

    def label(self) -> str:
        return f"{fmt_hour(self.start)} .. {fmt_hour(self.end)}"

    def months(self) -> list[Month]:
        """The calendar months the period has hours in."""
        out, cur = [], Month.of(self.start)
        while cur.start < utc_naive(self.end):
            out.append(cur)
            cur = cur.next()
        return out

    def clip(self, start: datetime, end: datetime) -> Period | None:
        """The part of the period within [start, end) (naive or aware UTC); None if none."""
        s, e = max(self.start, utc_aware(start)), min(self.end, utc_aware(end))
        return Period(s, e) if s < e else None


DAY = timedelta(days=1)


def midnight(t: datetime) -> datetime:
    """The start of `t`'s day in UTC (aware)."""
    return utc_aware(t).replace(hour=0, minute=0, second=0, microsecond=0)


def daily_window(now: datetime, late_days: int) -> Period:
    """What `meter --daily` meters at `now`: the last closed day (yesterday, UTC) and the
    `late_days` days before it, whose late samples it picks up."""
    today = midnight(now)
    return Period(today - (late_days + 1) * DAY, today)


@dataclass(frozen=True)
class HourRange:
    """A run of whole hours, [start, end) in UTC (naive, as the ledger stores them)."""

    start: datetime
    end: datetime

    @property
    def hours(self) -> int:
        return int((self.end - self.start) / HOUR)

    def label(self) -> str:
        """`2026-10-03T04:00Z .. 2026-10-03T07:00Z`, for log lines."""
        return f"{fmt_hour(self.start)} .. {fmt_hour(self.end)}"

    def describe(self) -> str:
        """`2026-10-03 04:00–07:00 UTC (3 h)`, for reports; the end is exclusive."""
        first = self.start.strftime("%Y-%m-%d %H:%M")
        last_hour = self.end - HOUR
        if last_hour.date() == self.start.date():  # ends within the day, or at its midnight
            last = "24:00" if self.end.hour == 0 else self.end.strftime("%H:%M")
            return f"{first}–{last} UTC ({self.hours} h)"
        return f"{first} – {self.end.strftime('%Y-%m-%d %H:%M')} UTC ({self.hours} h)"


def hour_ranges(hours: Iterable[datetime]) -> list[HourRange]:
    """Hours compressed into runs of consecutive hours."""
    ranges: list[HourRange] = []
    for hour in sorted(set(hours)):
        if ranges and ranges[-1].end == hour:
            ranges[-1] = HourRange(ranges[-1].start, hour + HOUR)
        else:
            ranges.append(HourRange(hour, hour + HOUR))
    return ranges


def parse_month(text: str) -> Month:
    """`--month YYYY-MM`."""
    try:
        return Month.parse(text)
    except PeriodError:
        raise PeriodError(f"--month: expected YYYY-MM (e.g. 2026-10), got {text!r}") from None


def parse_instant(text: str, option: str) -> datetime:
    """An ISO date or date-time; naive means UTC, an offset is converted to UTC."""
    raw = text.strip()
    try:
        t = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise PeriodError(f"{option}: expected an ISO date or date-time in UTC "
                          f"(2026-10-05 or 2026-10-05T13:00Z), got {text!r}") from None
    t = utc_aware(t)
    if t.minute or t.second or t.microsecond:
        raise PeriodError(f"{option}: expected a time on the hour (metering works in whole "
                          f"UTC hours), got {text!r}")
    return t


def resolve(month: str | None, start: str | None, end: str | None,
            now: datetime | None = None) -> Period:
    """Validate the period options. A period still running is cut back to the last complete
    hour; one that has not started yet, or ends before it starts, is an error."""
    if month is not None and (start is not None or end is not None):
        raise PeriodError("--month cannot be combined with --from/--to")
    if month is not None:
        whole = parse_month(month).period()
        s, e = whole.start, whole.end
    elif start is not None and end is not None:
        s, e = parse_instant(start, "--from"), parse_instant(end, "--to")
    else:
        raise PeriodError("expected --month YYYY-MM, or both --from and --to")
    if e <= s:
        raise PeriodError(f"--to: expected a time after --from {fmt_hour(s)}, got {fmt_hour(e)}")
    now = utc_aware(now or datetime.now(UTC))
    current_hour = now.replace(minute=0, second=0, microsecond=0)
    if s >= current_hour:
        raise PeriodError(f"period {fmt_hour(s)} .. {fmt_hour(e)} is in the future "
                          f"(now {fmt_hour(now)}): only complete past hours can be metered")
    if e > current_hour:
        return Period(s, current_hour, clipped=True)
    return Period(s, e)
