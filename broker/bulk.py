"""Many rows in one statement: a bulk INSERT and a bulk UPDATE by primary key, for the tick's set-based writes.

On PostgreSQL each is a single statement whatever the number of rows: every column is sent as one array and the
server unnests them (`INSERT ... SELECT FROM unnest(...)`, `UPDATE ... FROM unnest(...) WHERE id = v.id`), so a
batch of placements costs one round trip and one statement execution per table, not one per row. Elsewhere
(SQLite) they fall back to an executemany of the equivalent statement, with the same effect.

Contract: `rows` are dicts with the same keys, values in Python form (Decimal, tz-aware datetime, str, int, None,
dict for a JSON column); the statements run in the caller's transaction (`conn`), which commits or rolls back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import JSON, Integer, Table, bindparam, insert, update
from sqlalchemy.engine import Connection

from broker.db import Money, UTCDateTime


def _pg_array_type(column: Any) -> str:
    """The PostgreSQL array type a column's values are sent as (JSON goes as text, cast on the server)."""
    kind = column.type
    if isinstance(kind, Money):
        return "numeric[]"
    if isinstance(kind, UTCDateTime):
        return "timestamptz[]"
    if isinstance(kind, Integer):
        return "bigint[]"
    if isinstance(kind, JSON):
        return "text[]"
    return "text[]"


def _pg_value(column: Any, value: Any) -> Any:
    if value is not None and isinstance(column.type, JSON):
        return json.dumps(value)
    return value


@cache
def _pg_insert_sql(table: Table, names: tuple[str, ...]) -> str:
    columns = [table.c[n] for n in names]
    arrays = ", ".join(f"%s::{_pg_array_type(c)}" for c in columns)
    aliases = ", ".join(f"v{i}" for i in range(len(names)))
    selected = ", ".join(f"v{i}::json" if isinstance(c.type, JSON) else f"v{i}" for i, c in enumerate(columns))
    quoted = ", ".join(f'"{n}"' for n in names)
    return f'INSERT INTO "{table.name}" ({quoted}) SELECT {selected} FROM unnest({arrays}) AS v({aliases})'


@cache
def _pg_update_sql(table: Table, key: str, names: tuple[str, ...]) -> str:
    columns = [table.c[n] for n in (key, *names)]
    arrays = ", ".join(f"%s::{_pg_array_type(c)}" for c in columns)
    aliases = ", ".join(f"v{i}" for i in range(len(columns)))
    sets = ", ".join(
        f'"{n}" = v.v{i + 1}' + ("::json" if isinstance(table.c[n].type, JSON) else "") for i, n in enumerate(names)
    )
    return f'UPDATE "{table.name}" AS t SET {sets} FROM unnest({arrays}) AS v({aliases}) WHERE t."{key}" = v.v0'


def _columns_of(table: Table, rows: Sequence[dict[str, Any]], names: tuple[str, ...]) -> tuple[list[Any], ...]:
    return tuple([_pg_value(table.c[n], row[n]) for row in rows] for n in names)


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` into `table` in one statement (PostgreSQL) or one executemany (elsewhere)."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(insert(table), list(rows))
        return
    names = tuple(rows[0])
    conn.exec_driver_sql(_pg_insert_sql(table, names), _columns_of(table, rows, names))


def bulk_update(conn: Connection, table: Table, key: str, rows: Sequence[dict[str, Any]]) -> None:
    """Set, for each row, its other keys' columns on the row of `table` whose `key` column equals its `key` value:
    one statement (PostgreSQL) or one executemany (elsewhere)."""
    if not rows:
        return
    names = tuple(n for n in rows[0] if n != key)
    if conn.dialect.name != "postgresql":
        statement = (
            update(table)
            .where(table.c[key] == bindparam("b_key"))
            .values({n: bindparam(f"b_{n}", type_=table.c[n].type) for n in names})
        )
        conn.execute(statement, [{"b_key": row[key], **{f"b_{n}": row[n] for n in names}} for row in rows])
        return
    conn.exec_driver_sql(_pg_update_sql(table, key, names), _columns_of(table, rows, (key, *names)))
