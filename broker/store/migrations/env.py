"""Alembic environment: runs migrations on the connection handed in by `broker.store.migrate`."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import broker.store.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from sqlalchemy import create_engine

        connectable = create_engine(config.get_main_option("sqlalchemy.url") or "")
        with connectable.connect() as conn:
            context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
