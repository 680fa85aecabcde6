"""Schema migrations: bring a database to the newest Alembic revision, safely from many processes at once.

On PostgreSQL a transaction-level advisory lock serialises concurrent upgrades (several replicas or Lambda
invocations starting together); on SQLite the database's write lock does the same.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_ADVISORY_LOCK_ID = 0x0_5E5_711  # "overspill"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def upgrade(engine: Engine) -> None:
    """Apply every pending migration (idempotent)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _ADVISORY_LOCK_ID})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
