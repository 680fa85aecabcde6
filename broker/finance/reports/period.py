"""Report periods: `[start, end)` in UTC, from a name ("2026-10", "2026-10-05") or relative to a schedule's fire
time (previous_month, previous_week, previous_day, month_to_date).

`label` names a period in file names; `title` names it for people ("November 2026", "1-25 November 2026 (month
to date)").

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
    """A short name for a period, for file names and ids: 2026-10 for a whole month, 2026-10-05 for a day, else
    start_end. People read `title`."""
    month_start, month_end = _month(start.year, start.month)
    if (start, end) == (month_start, month_end):
        return start.strftime("%Y-%m")
    if end - start == timedelta(days=1) and start == datetime(start.year, start.month, start.day, tzinfo=UTC):
        return start.strftime("%Y-%m-%d")
    return f"{start:%Y%m%dT%H%M%SZ}_{end:%Y%m%dT%H%M%SZ}"


MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_TICK = timedelta(microseconds=1)


def _midnight(t: datetime) -> bool:
    return t == datetime(t.year, t.month, t.day, tzinfo=UTC)


def _day(d: date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def _days(first: date, last: date) -> str:
    """An inclusive range of days: "16-22 November 2026", "28 October - 3 November 2026", "1 November 2026"."""
    if first == last:
        return _day(first)
    if (first.year, first.month) == (last.year, last.month):
        return f"{first.day}-{last.day} {MONTHS[last.month - 1]} {last.year}"
    if first.year == last.year:
        return f"{first.day} {MONTHS[first.month - 1]} - {_day(last)}"
    return f"{_day(first)} - {_day(last)}"


def title(start: datetime, end: datetime, *, through: datetime | None = None) -> str:
    """A period `[start, end)` for people. `through`, for a period that had not ended when the report was made,
    is where its data stops (the ledger's latest accrued time; the period's start without data).

    A whole month is "November 2026"; a month cut short (a month-to-date schedule, or the current month) is
    "1-25 November 2026 (month to date)", its last day the one `through` (or `end`) falls in; whole days are
    "25 November 2026" or "16-22 November 2026"; anything else "2026-11-01 00:00 to 2026-11-25 06:00 UTC".
    A period still running that is not a month says "(to date)"."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    covered = end if through is None else max(start, min(end, through.astimezone(UTC)))
    month_start, month_end = _month(start.year, start.month)
    if start == month_start and end <= month_end:
        if end == month_end and through is None:
            return f"{MONTHS[start.month - 1]} {start.year}"
        last = (covered - _TICK).date() if covered > start else start.date()
        return f"{_days(start.date(), last)} (month to date)"
    suffix = "" if through is None else " (to date)"
    if _midnight(start) and _midnight(end):
        return _days(start.date(), (end - _TICK).date()) + suffix
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC{suffix}"
