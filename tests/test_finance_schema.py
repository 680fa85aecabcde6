"""The Alembic migrations and the SQLModel tables describe the same schema (the finance migration included)."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlmodel import SQLModel

import broker.tables  # noqa: F401  (registers the tables)
from broker.migrate import upgrade

FINANCE_TABLES = {"budget", "budget_alert", "report_schedule", "report_run", "bill_import", "bill_line"}


def test_migrations_match_the_tables(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'schema.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == []
    tables = set(inspect(engine).get_table_names())
    assert tables >= FINANCE_TABLES
    columns = {c["name"] for c in inspect(engine).get_columns("cost_entry")}
    assert {"region", "zone", "instance_type", "resource_id", "quantity", "unit", "corrects_id", "note"} <= columns
