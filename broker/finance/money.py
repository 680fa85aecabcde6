"""The one display rule for money and quantities: what every finance surface shows a person.

The ledger keeps money exact (1e-10 USD, `broker.finance.ledger.LEDGER_QUANTUM`) and sums it exactly; people
read cents. Every surface that shows amounts to a person (CSV and HTML/PDF reports, `overspill costs`, the
console through the API's `display` strings) rounds here and nowhere else:

- `cents(d)`: one amount, rounded half-even (banker's rounding) to 0.01 USD.
- `allocate(values)`: a column of amounts, each rounded to cents so that the rounded lines add up exactly to the
  rounded exact total (`cents(sum(values))`): each line is first cut down to whole cents, then the cents still
  missing go one each to the lines with the largest remainders (ties: the earlier line). A line that is already
  a whole number of cents (0 included) never moves. So a table's footer is both the rounded exact total and the
  sum of the lines above it. (`broker.finance.costs.shown` applies it to cost, wasted and savings columns and
  derives the on-demand equivalent from them, so a line's figures also add up across.)
- `usd(d)` / `plain(d)`: "$1,234.56" / "-$0.40" for pages, "1234.56" for files and scripts (an amount given
  here is rounded by `cents` first; pass allocated figures to keep a column's sum).
- `quantity(q)`: usage quantities (hours, GB, GB-hours) to `QUANTITY_PLACES` decimals, half-even.

Exact values stay where a machine reads them: the ledger, the API's `*_usd` fields, and the FOCUS export (whose
cost columns are decimals at the ledger's full precision, as the FOCUS 1.2 spec asks for billed amounts).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")
QUANTITY_PLACES = 4
_QUANTUM = Decimal(1).scaleb(-QUANTITY_PLACES)


def cents(d: Decimal) -> Decimal:
    """`d` rounded half-even to cents."""
    return d.quantize(CENT, rounding=ROUND_HALF_EVEN)


def allocate(values: Sequence[Decimal]) -> list[Decimal]:
    """`values` rounded to cents so that they sum exactly to `cents(sum(values))` (largest remainder)."""
    floors = [v.quantize(CENT, rounding=ROUND_FLOOR) for v in values]
    total = cents(sum(values, Decimal(0)))
    missing = int((total - sum(floors, Decimal(0))) / CENT)  # 0 <= missing <= count of lines with a remainder
    if missing:  # the largest remainders first (ties: the earlier line)
        for i in heapq.nsmallest(missing, range(len(values)), key=lambda i: (floors[i] - values[i], i)):
            floors[i] += CENT
    return floors


def plain(d: Decimal) -> str:
    """An amount for files and scripts: "1234.56", "-0.40", "0.00"."""
    text = f"{cents(d):f}"
    return "0.00" if text == "-0.00" else text


def usd(d: Decimal) -> str:
    """An amount for people: "$1,234.56", "-$0.40"."""
    c = cents(d)
    if c == 0:
        return "$0.00"
    return f"{'-' if c < 0 else ''}${abs(c):,.2f}"


def quantity(q: Decimal) -> str:
    """A usage quantity (hours, GB, GB-hours) to QUANTITY_PLACES decimals, half-even: "44.0796", "3.0000"."""
    text = f"{q.quantize(_QUANTUM, rounding=ROUND_HALF_EVEN):f}"
    return text.removeprefix("-") if text.strip("-0.") == "" else text
