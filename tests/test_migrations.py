"""The Alembic migrations build exactly the schema the SQLModel tables declare, on SQLite and PostgreSQL, and
form one linear history (a second head means two branches both added a migration without re-chaining)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlmodel import SQLModel

import broker.store.tables  # noqa: F401  (registers every table on SQLModel.metadata)
from broker.config.settings import Settings
from broker.store import migrate
from broker.store.db import make_engine


def test_one_linear_history() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert len(script.get_heads()) == 1, f"several migration heads: {script.get_heads()}"
    revisions = list(script.walk_revisions())
    assert revisions[-1].down_revision is None


def test_migrated_schema_matches_the_tables(db_url: str) -> None:
    engine = make_engine(Settings(database_url=db_url))
    migrate.upgrade(engine)
    migrate.upgrade(engine)  # idempotent
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    # type comparison is left to Alembic's defaults; any table, column, index or nullability drift shows here
    assert diff == [], f"migrations and broker/store/tables.py disagree: {diff}"
