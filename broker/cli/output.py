"""How the `overspill` command line writes: tables that never cut an id or an amount, and one-line errors.

Contract:
- `print_table(console, columns, rows)` prints a table in the console's width. Columns of kind `id`, `money` and
  `number` are never cut or wrapped (ids stay copyable into `update`/`cancel`; amounts stay whole); `text` columns
  wrap. When the terminal is too narrow, optional columns (`drop` > 0) are left out, highest `drop` first, and
  the table says which; if the columns that must stay still do not fit, the table is printed wider than the
  terminal (which wraps the lines) rather than cutting a value.
- `print_unbroken(console, table)` prints a ready-made table whose `no_wrap` columns must not be cut, wider than
  the terminal when they need it.
- `money(amount)`: an amount from the API (a decimal string, exact) as people read it: "$1,234.56", rounded
  half-even to cents by `broker.finance.money.usd`, the one display rule; `--json` keeps the API's exact strings.
  Anything that is not a number is shown as given.
- `plural(n, noun)`: "1 job", "2 jobs".
- `fail(message, code=1)`: the same one line for an error that is not the caller's (the broker unreachable, a
  feed down), exit code 1.
- `usage_error(message)` prints `error: <message>` as one line on stderr and exits with code 2: how every error
  that is the caller's to fix ends (a bad file, an unknown tenant, a missing database).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal, NoReturn

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from broker.finance.money import usd

err = Console(stderr=True)

Kind = Literal["id", "money", "number", "text"]
TEXT_MIN_WIDTH = 12  # a wrapped text column is never squeezed below this
BORDER = 3  # a column's share of the box: padding on both sides and its rule


@dataclass(frozen=True, slots=True)
class Column:
    """One column: `kind` says whether it may wrap; `drop` > 0 makes it optional (dropped highest first)."""

    header: str
    kind: Kind = "text"
    drop: int = 0


def money(amount: object) -> str:
    """An exact amount from the API, in cents for people (see the module contract)."""
    if amount is None or amount == "":
        return ""
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        return str(amount)
    return usd(value) if value.is_finite() else str(amount)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` and the noun, singular for exactly one: "1 job", "0 jobs", "3 pools"."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def usage_error(message: str) -> NoReturn:
    """One line on stderr (`error: ...`), exit code 2."""
    fail(message, 2)


def fail(message: object, code: int = 1) -> NoReturn:
    """`error: <message>` as one unwrapped line on stderr (markup in the message is printed as is), then exit with
    `code` (1: the broker or the world failed; 2: the caller's to fix, see `usage_error`)."""
    err.print(Text("error: ", style="red") + Text(" ".join(str(message).split())), soft_wrap=True)
    raise typer.Exit(code)


def _natural(header: str, cells: Sequence[str]) -> int:
    return max([len(header), *(len(line) for c in cells for line in (c.splitlines() or [""]))])


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
    """Print `rows` under `columns` (see the module contract)."""
    shown = list(range(len(columns)))
    natural = [_natural(c.header, [r[i] for r in rows]) for i, c in enumerate(columns)]

    def least(i: int) -> int:
        return natural[i] if columns[i].kind != "text" else min(natural[i], TEXT_MIN_WIDTH)

    def needed(cols: list[int]) -> int:
        return sum(least(i) + BORDER for i in cols) + 1

    dropped: list[str] = []
    for i in sorted((i for i, c in enumerate(columns) if c.drop > 0), key=lambda i: -columns[i].drop):
        if needed(shown) <= console.width:
            break
        shown.remove(i)
        dropped.append(columns[i].header)
    table = Table()
    for i in shown:
        c = columns[i]
        if c.kind == "text":
            table.add_column(c.header, overflow="fold")
        else:
            table.add_column(
                c.header,
                no_wrap=True,
                min_width=natural[i],
                overflow="fold",
                justify="right" if c.kind in ("money", "number") else "left",
            )
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    width = console.width
    if needed(shown) > width:  # what must stay does not fit: let the terminal wrap the lines, never cut a value
        console.width = needed(shown)
    try:
        console.print(table)
    finally:
        console.width = width
    if dropped:
        note = f"(too narrow for: {', '.join(dropped)}; widen the terminal or use --json)"
        console.print(note, style="dim", soft_wrap=True, highlight=False)


def print_unbroken(console: Console, table: Table) -> None:
    """Print `table`, widening the console for this table when its `no_wrap` columns would not fit otherwise."""
    least = Measurement.get(console, console.options.update(width=10_000), table).minimum
    width = console.width
    if least > width:
        console.width = least
    try:
        console.print(table)
    finally:
        console.width = width
