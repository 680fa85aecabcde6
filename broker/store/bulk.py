"""Many rows in one statement: a bulk INSERT and a bulk UPDATE by primary key, for the tick's set-based writes.

On PostgreSQL each is a single statement whatever the number of rows: the rows go as one JSON parameter that the
server reads as a set of typed records (`INSERT ... SELECT FROM json_to_recordset(...)`, `UPDATE ... FROM
json_to_recordset(...) WHERE id = v.id`), so a batch of placements costs one round trip and one statement per
table, not one per row. JSON, not arrays: the driver dumps arrays element by element in Python, several times
slower than one `json.dumps`; Decimal goes as its exact text, so nothing is rounded. Elsewhere
(SQLite) they fall back to an executemany of the equivalent statement, with the same effect.

Reads by many ids the same way: `among` is `column IN ids` as one array parameter on PostgreSQL (an IN list costs
the driver a placeholder per id), and `select_among` runs a query for any number of ids (one statement on
PostgreSQL, IN lists of 1,000 elsewhere).

Contract of the writes: `rows` are dicts with the same keys, values in Python form (Decimal, tz-aware datetime,
str, int, None, dict for a JSON column); the statements run in the caller's transaction (`conn`), which commits
or rolls back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any

from sqlalchemy import JSON, Boolean, Float, Integer, String, Table, any_, bindparam, insert, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from broker.store.db import Money, UTCDateTime


def _pg_type(column: Any) -> str:
    """The PostgreSQL type a column's values are read as from the batch's JSON."""
    kind = column.type
    if isinstance(kind, Money):
        return "numeric"
    if isinstance(kind, UTCDateTime):
        return "timestamptz"
    if isinstance(kind, Integer):
        return "bigint"
    if isinstance(kind, JSON):
        return "json"
    if isinstance(kind, Boolean):
        return "boolean"
    if isinstance(kind, Float):
        return "double precision"
    return "text"


def _recordset(table: Table, names: tuple[str, ...]) -> str:
    fields = ", ".join(f'"{n}" {_pg_type(table.c[n])}' for n in names)
    return f"json_to_recordset(%s::json) AS v({fields})"


@cache
def _pg_insert_sql(table: Table, names: tuple[str, ...]) -> str:
    quoted = ", ".join(f'"{n}"' for n in names)
    return f'INSERT INTO "{table.name}" ({quoted}) SELECT {quoted} FROM {_recordset(table, names)}'


@cache
def _pg_update_sql(table: Table, key: str, names: tuple[str, ...]) -> str:
    sets = ", ".join(f'"{n}" = v."{n}"' for n in names)
    return f'UPDATE "{table.name}" AS t SET {sets} FROM {_recordset(table, (key, *names))} WHERE t."{key}" = v."{key}"'


def _json_value(value: Any) -> str:
    """Decimal as its exact text, a timestamp in ISO 8601 with its offset (what PostgreSQL's input reads back)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; the broker only handles tz-aware UTC")
        return value.isoformat()
    raise TypeError(f"cannot send {type(value).__name__} in a bulk statement")


def _batch(rows: Sequence[dict[str, Any]], names: tuple[str, ...]) -> tuple[str]:
    return (json.dumps([{n: row[n] for n in names} for row in rows], default=_json_value),)


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` into `table` in one statement (PostgreSQL) or one executemany (elsewhere)."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(insert(table), list(rows))
        return
    names = tuple(rows[0])
    conn.exec_driver_sql(_pg_insert_sql(table, names), _batch(rows, names))


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
    conn.exec_driver_sql(_pg_update_sql(table, key, names), _batch(rows, (key, *names)))


def among(conn: Connection, column: Any, values: Sequence[str]) -> Any:
    """`column IN values`: on PostgreSQL as `column = ANY(array)`, one parameter however many values."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam("among", list(values), type_=ARRAY(String)))
    return column.in_(values)


def select_among(conn: Connection, query: Any, column: Any, ids: Sequence[str]) -> list[Any]:
    """The rows of `query` whose `column` is among `ids`: one statement on PostgreSQL, one per 1,000 ids elsewhere."""
    size = (len(ids) or 1) if conn.dialect.name == "postgresql" else 1000
    rows: list[Any] = []
    for start in range(0, len(ids), size):
        rows.extend(conn.execute(query.where(among(conn, column, ids[start : start + size]))).all())
    return rows
