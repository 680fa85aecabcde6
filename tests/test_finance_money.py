"""The display rule (`broker.finance.money`), what "saved by spot" counts (`broker.finance.costs`), and how periods
are titled for people (`broker.finance.reports.period.title`)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from broker.finance.costs import Entry, Sums, group, shown
from broker.finance.money import allocate, cents, plain, quantity, usd
from broker.finance.reports.period import title

D = Decimal
NOV = datetime(2026, 11, 1, tzinfo=UTC)


def test_cents_round_half_even() -> None:
    assert [cents(D(x)) for x in ("0.005", "0.015", "0.025", "-0.005", "2.675", "1.0049999999")] == [
        D("0.00"),
        D("0.02"),
        D("0.02"),
        D("0.00"),
        D("2.68"),
        D("1.00"),
    ]


def test_allocated_lines_add_up_to_the_rounded_exact_total() -> None:
    rng = random.Random(5)
    for _ in range(300):
        values = [D(rng.randrange(-2_000_000, 9_000_000)) / D(10**8) for _ in range(rng.randrange(1, 40))]
        lines = allocate(values)
        assert sum(lines, D(0)) == cents(sum(values, D(0)))
        assert all(line == cents(line) for line in lines)
        assert all(abs(line - v) < D("0.01") for line, v in zip(lines, values, strict=True))  # each within a cent
        assert all(line == v for line, v in zip(lines, values, strict=True) if v == cents(v))  # whole cents stay


def test_allocation_gives_the_missing_cents_to_the_largest_remainders() -> None:
    # rounded one by one: 0.00 + 0.00 + 0.00 = 0.00, but the total is 0.012 -> 0.01: the largest remainder gets it
    assert allocate([D("0.004"), D("0.003"), D("0.005")]) == [D("0"), D("0"), D("0.01")]
    # three thirds of a dollar: 0.33 + 0.33 + 0.34 (the tie goes to the first line)
    assert allocate([D(1) / 3] * 3) == [D("0.34"), D("0.33"), D("0.33")]
    assert allocate([D("-0.004"), D("-0.004"), D("0.012")]) == [D("0"), D("-0.01"), D("0.01")]  # credits too
    assert allocate([]) == []


def test_formats() -> None:
    assert usd(D("1040.5957590104")) == "$1,040.60" and usd(D("-0.4")) == "-$0.40" and usd(D("-0.001")) == "$0.00"
    assert plain(D("44.0796000001")) == "44.08" and plain(D("-0.001")) == "0.00" and plain(D("20")) == "20.00"
    assert quantity(D("3.000000000000000000000000002")) == "3.0000" and quantity(D("44.07965")) == "44.0796"
    assert quantity(D("-0.00001")) == "0.0000"


def _entry(kind: str, usd_: str, on_demand: str, *, capacity: str = "spot", team: str = "nlp") -> Entry:
    return Entry(
        1, "job_1", "plc_1", team, "atlas", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge", "i-1", capacity, kind,
        NOV, NOV + timedelta(hours=1), D("1"), D(usd_), D(on_demand), D("1"), "Hours", None,
    )  # fmt: skip


def test_saved_by_spot_counts_useful_compute_only() -> None:
    """A preempted spot job: 10 h of compute at $3 (on-demand $10), 2 h of it lost and redone; its disk and public
    address billed at list price. Spot saved 8 h x $7; the lost 2 h ($6) are a loss, not a $14 saving."""
    entries = [
        _entry("compute", "30", "100"),
        _entry("compute", "-6", "-20"),  # the lost hours moved out of compute...
        _entry("wasted", "6", "20"),  # ...into wasted, at what they cost (their on-demand price recorded)
        _entry("disk", "0.5", "0.5"),
        _entry("public_ip", "0.05", "0.05"),
        _entry("egress", "1", "1"),
        _entry("correction", "-0.25", "-0.25"),
    ]
    s = Sums()
    for e in entries:
        s.add(e)
    assert s.cost_usd == D("31.30") and s.wasted_usd == D("6")
    assert s.on_demand_usd == D("81.30")  # 80 of useful compute on-demand + the rest at cost; nothing for lost work
    assert s.savings_usd == D("56")  # 8 h x ($10 - $3)
    assert s.on_demand_usd - s.cost_usd == s.savings_usd - s.wasted_usd == D("50")  # net of the loss
    kinds = {k[0]: v for k, v in group(entries, ["kind"]).rows.items()}
    assert all(kinds[k].savings_usd == 0 for k in ("wasted", "disk", "public_ip", "egress", "correction"))
    # a disk billed at more than its recorded on-demand price still claims no saving
    assert Sums(D("1"), D("1"), D("0"), 1).savings_usd == 0
    odd = Sums()
    odd.add(_entry("disk", "1", "5"))
    assert odd.savings_usd == 0


def test_shown_columns_add_up_and_lines_add_up_across() -> None:
    lines = [Sums(D("91.7333333333"), D("91.7333333333"), D("0"), 1)]  # on-demand: no saving
    lines += [Sums(D("16.384"), D("54.621"), D("0"), 1), Sums(D("0.1812"), D("0"), D("0.1812"), 1)]  # spot, wasted
    lines += [Sums(D(n) / 7, D(n) / 3, D(0), 1) for n in range(1, 9)]
    rows, total = shown(lines)
    assert rows[0].cost_usd == rows[0].on_demand_usd == D("91.73") and rows[0].savings_usd == 0
    assert rows[2].on_demand_usd == 0 and rows[2].savings_usd == 0 and rows[2].cost_usd == rows[2].wasted_usd
    for field in ("cost_usd", "wasted_usd", "savings_usd"):
        exact = sum((getattr(s, field) for s in lines), D(0))
        assert getattr(total, field) == cents(exact) == sum((getattr(r, field) for r in rows), D(0))
    for r in [*rows, total]:
        assert r.on_demand_usd == r.cost_usd - r.wasted_usd + r.savings_usd


def at(month: int, day: int, hour: int = 0, minute: int = 0, year: int = 2026) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "end", "through", "expected"),
    [
        (NOV, at(12, 1), None, "November 2026"),
        (NOV, at(12, 1), at(11, 25, 10, 30), "1-25 November 2026 (month to date)"),  # the current month
        (NOV, at(12, 1), at(11, 26), "1-25 November 2026 (month to date)"),  # data up to midnight: 25 days
        (NOV, at(12, 1), NOV, "1 November 2026 (month to date)"),  # nothing accrued yet
        (NOV, at(11, 25, 5), None, "1-25 November 2026 (month to date)"),  # a month_to_date schedule's period
        (NOV, at(11, 25), None, "1-24 November 2026 (month to date)"),
        (at(11, 5), at(11, 6), None, "5 November 2026"),
        (at(11, 16), at(11, 23), None, "16-22 November 2026"),
        (at(10, 26), at(11, 2), None, "26 October - 1 November 2026"),
        (at(12, 28), at(1, 4, year=2027), None, "28 December 2026 - 3 January 2027"),
        (at(11, 2, 6), at(11, 3), None, "2026-11-02 06:00 to 2026-11-03 00:00 UTC"),
        (at(11, 2), at(11, 9), at(11, 4), "2-8 November 2026 (to date)"),
    ],
)
def test_period_titles(start: datetime, end: datetime, through: datetime | None, expected: str) -> None:
    assert title(start, end, through=through) == expected
