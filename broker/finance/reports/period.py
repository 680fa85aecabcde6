"""Report periods: `[start, end)` in UTC, from a name ("2026-10", "2026-10-05") or relative to a schedule's fire
time (previous_month, previous_week, previous_day, month_to_date).

Periods are UTC because the ledger is cut at UTC midnight (and cloud billing periods are UTC months); a
schedule's time zone only decides when it fires.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

RELATIVE = ("previous_month", "previous_week", "previous_day", "month_to_date")


class PeriodError(ValueError):
    """A period name that is not YYYY-MM, YYYY-MM-DD or a relative period."""


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def parse_period(text: str) -> tuple[datetime, datetime]:
    """`2026-10` is that month, `2026-10-05` that day (UTC)."""
    if re.fullmatch(r"\d{4}-\d{2}", text):
        year, month = int(text[:4]), int(text[5:])
        if not 1 <= month <= 12:
            raise PeriodError(f"period {text!r}: month must be 01-12")
        return _month(year, month)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        try:
            day = date.fromisoformat(text)
        except ValueError as exc:
            raise PeriodError(f"period {text!r}: {exc}") from exc
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return start, start + timedelta(days=1)
    raise PeriodError(f"period {text!r}: use YYYY-MM (a month) or YYYY-MM-DD (a day)")


def relative_period(kind: str, at: datetime) -> tuple[datetime, datetime]:
    """The period a schedule firing at `at` reports on."""
    at = at.astimezone(UTC)
    today = datetime(at.year, at.month, at.day, tzinfo=UTC)
    if kind == "previous_month":
        first = datetime(at.year, at.month, 1, tzinfo=UTC)
        prev = first - timedelta(days=1)
        return _month(prev.year, prev.month)
    if kind == "previous_week":
        monday = today - timedelta(days=today.weekday())
        return monday - timedelta(days=7), monday
    if kind == "previous_day":
        return today - timedelta(days=1), today
    if kind == "month_to_date":
        start, _ = _month(at.year, at.month)
        return start, max(at, start)
    raise PeriodError(f"period {kind!r}: use one of {', '.join(RELATIVE)}")


def label(start: datetime, end: datetime) -> str:
    """A short name for a period: 2026-10 for a whole month, 2026-10-05 for a day, else start_end."""
    month_start, month_end = _month(start.year, start.month)
    if (start, end) == (month_start, month_end):
        return start.strftime("%Y-%m")
    if end - start == timedelta(days=1) and start == datetime(start.year, start.month, start.day, tzinfo=UTC):
        return start.strftime("%Y-%m-%d")
    return f"{start:%Y%m%dT%H%M%SZ}_{end:%Y%m%dT%H%M%SZ}"
