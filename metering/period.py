"""The metering period: `--month YYYY-MM` or `--from`/`--to`, whole UTC hours, in the past."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


class PeriodError(ValueError):
    """A period argument is malformed or names no metered time."""


@dataclass(frozen=True)
class Period:
    """[start, end) in UTC, both on the hour."""

    start: datetime
    end: datetime
    clipped: bool = False  # end was cut back to the last complete hour

    @property
    def hours(self) -> int:
        return int((self.end - self.start) / HOUR)

    def chunks(self, hours: int) -> Iterator[Period]:
        """Consecutive sub-periods of at most `hours` hours."""
        step = timedelta(hours=hours)
        cur = self.start
        while cur < self.end:
            nxt = min(cur + step, self.end)
            yield Period(cur, nxt)
            cur = nxt

    def label(self) -> str:
        return f"{_fmt(self.start)} .. {_fmt(self.end)}"


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%MZ")


def parse_month(text: str) -> tuple[datetime, datetime]:
    m = _MONTH.match(text.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise PeriodError(f"--month: expected YYYY-MM (e.g. 2026-10), got {text!r}")
    year, month = int(m.group(1)), int(m.group(2))
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def parse_instant(text: str, option: str) -> datetime:
    """An ISO date or date-time; naive means UTC, an offset is converted to UTC."""
    raw = text.strip()
    try:
        t = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise PeriodError(f"{option}: expected an ISO date or date-time in UTC "
                          f"(2026-10-05 or 2026-10-05T13:00Z), got {text!r}") from None
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
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
        s, e = parse_month(month)
    elif start is not None and end is not None:
        s, e = parse_instant(start, "--from"), parse_instant(end, "--to")
    else:
        raise PeriodError("expected --month YYYY-MM, or both --from and --to")
    if e <= s:
        raise PeriodError(f"--to: expected a time after --from {_fmt(s)}, got {_fmt(e)}")
    now = (now or datetime.now(UTC)).astimezone(UTC)
    current_hour = now.replace(minute=0, second=0, microsecond=0)
    if s >= current_hour:
        raise PeriodError(f"period {_fmt(s)} .. {_fmt(e)} is in the future (now {_fmt(now)}): "
                          "only complete past hours can be metered")
    if e > current_hour:
        return Period(s, current_hour, clipped=True)
    return Period(s, e)
