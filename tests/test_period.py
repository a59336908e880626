"""Metering period options: months, ISO bounds, whole hours, nothing in the future."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from metering.cli_meter import main
from metering.period import Period, PeriodError, resolve

NOW = datetime(2026, 11, 21, 22, 4, tzinfo=UTC)


def test_month_covers_the_calendar_month() -> None:
    p = resolve("2026-10", None, None, now=NOW)
    assert p.start == datetime(2026, 10, 1, tzinfo=UTC)
    assert p.end == datetime(2026, 11, 1, tzinfo=UTC)
    assert p.hours == 31 * 24 and not p.clipped


def test_december_ends_in_january() -> None:
    p = resolve("2025-12", None, None, now=NOW)
    assert p.end == datetime(2026, 1, 1, tzinfo=UTC)


def test_from_to_dates_and_times_are_utc() -> None:
    p = resolve(None, "2026-10-05", "2026-10-05T13:00+02:00", now=NOW)
    assert p.start == datetime(2026, 10, 5, tzinfo=UTC)
    assert p.end == datetime(2026, 10, 5, 11, tzinfo=UTC)
    assert resolve(None, "2026-10-05T03:00Z", "2026-10-06", now=NOW).hours == 21


@pytest.mark.parametrize("month", ["2026-13", "2026-1", "Oct 2026", "2026-10-01", ""])
def test_malformed_month(month: str) -> None:
    with pytest.raises(PeriodError, match="--month: expected YYYY-MM"):
        resolve(month, None, None, now=NOW)


def test_end_not_after_start() -> None:
    with pytest.raises(PeriodError, match="--to: expected a time after --from"):
        resolve(None, "2026-10-05", "2026-10-05", now=NOW)
    with pytest.raises(PeriodError, match="--to"):
        resolve(None, "2026-10-06", "2026-10-05", now=NOW)


def test_period_in_the_future() -> None:
    with pytest.raises(PeriodError, match="in the future"):
        resolve("2027-01", None, None, now=NOW)
    with pytest.raises(PeriodError, match="in the future"):
        resolve(None, "2026-11-21T22:00", "2026-11-22", now=NOW)


def test_running_month_is_cut_to_the_last_complete_hour() -> None:
    p = resolve("2026-11", None, None, now=NOW)
    assert p.end == datetime(2026, 11, 21, 22, tzinfo=UTC) and p.clipped


def test_bounds_must_be_on_the_hour_and_well_formed() -> None:
    with pytest.raises(PeriodError, match="--from: expected a time on the hour"):
        resolve(None, "2026-10-05T10:30", "2026-10-06", now=NOW)
    with pytest.raises(PeriodError, match="--to: expected an ISO date"):
        resolve(None, "2026-10-05", "tomorrow", now=NOW)
    with pytest.raises(PeriodError, match="both --from and --to"):
        resolve(None, "2026-10-05", None, now=NOW)
    with pytest.raises(PeriodError, match="cannot be combined"):
        resolve("2026-10", "2026-10-05", None, now=NOW)


def test_chunks_tile_the_period() -> None:
    p = Period(datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 2, 2, tzinfo=UTC))
    chunks = list(p.chunks(8))
    assert [c.hours for c in chunks] == [8, 8, 8, 2]
    assert chunks[0].start == p.start and chunks[-1].end == p.end
    assert all(a.end == b.start for a, b in itertools.pairwise(chunks))


def test_cli_rejects_bad_periods_with_usage_exit(capsys: pytest.CaptureFixture[str],
                                                tmp_path: object) -> None:
    assert main(["--openmetrics", "x.om", "--month", "2026/10", "--no-price"]) == 2
    assert "--month: expected YYYY-MM" in capsys.readouterr().err
    assert main(["--openmetrics", "x.om", "--month", "2099-01", "--no-price"]) == 2
    err = capsys.readouterr().err
    assert "in the future" in err and "Traceback" not in err
    assert main(["--openmetrics", "x.om"]) == 2  # no period at all
