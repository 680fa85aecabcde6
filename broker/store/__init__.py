"""Persistence: the SQLModel tables, the engines (sync and async), schema migrations and the bulk helpers.

`tables` (every row type), `db` and `db_async` (engines and sessions for SQLite and PostgreSQL), `migrate` and
`migrations/` (Alembic), `bulk` (batched writes), `shards` (the loop's work split across replicas), `simstore` (the
simulated market's persisted state) and `copystate` (checkpoint-copy progress).

May import: `providers/` (domain types) and `broker.config`. Nothing above it: no route, loop step or service.
"""
