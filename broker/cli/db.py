"""Which database a local `overspill` command opens (`keys create`, `report run`, `costs import-bill`,
`prices ...`, `tick`), said out loud.

Contract:
- `open_settings()` returns the settings and prints `database: <where>` on stderr (an absolute path for SQLite, the
  URL without its password otherwise), so the user sees which broker the command acts on.
- When neither `OVERSPILL_DATA_DIR` nor `OVERSPILL_DATABASE_URL` is set, the default SQLite database is
  `./.overspill/overspill.db` under the current folder. A command run from another folder would silently create
  an empty database there (a key the server never sees, a report with no entries), so a missing default
  database is a usage error (exit 2) saying where it looked and how to point at the right one. An explicitly
  configured location is opened (and created) as configured.
- `require_tenant(engine, tenant)` fails with a usage error naming the known tenants when no key, job or ledger
  entry belongs to `tenant`.
"""

from __future__ import annotations

from sqlalchemy import Engine, make_url, union
from sqlmodel import select

from broker.cli.env import load_settings
from broker.cli.output import err, usage_error
from broker.config.settings import Settings
from broker.config.tenants import InvalidTenant, validate_tenant
from broker.store.tables import ApiKey, CostEntryRow, Job

DB_FILE = "overspill.db"


def describe(settings: Settings) -> str:
    """Where the database is, for people: an absolute file path for SQLite, the URL without its password."""
    url = make_url(settings.resolved_database_url)
    if url.get_backend_name() == "sqlite" and url.database:
        from pathlib import Path

        return str(Path(url.database).resolve())
    return url.render_as_string(hide_password=True)


def open_settings() -> Settings:
    """The settings of a command that opens the database, after checking and saying which database it is."""
    settings = load_settings()
    explicit = {"data_dir", "database_url", "database_url_arn"} & settings.model_fields_set
    if not explicit and not settings.database_url:
        path = (settings.data_dir / DB_FILE).resolve()
        if not path.exists():
            usage_error(
                f"no broker database at {path} (the default, ./.overspill under the current folder): run this "
                "from the folder `overspill serve` runs in, or set OVERSPILL_DATA_DIR or OVERSPILL_DATABASE_URL"
            )
    err.print(f"database: {describe(settings)}", soft_wrap=True, highlight=False)
    return settings


def known_tenants(engine: Engine) -> list[str]:
    """Tenants with a key, a job or a ledger entry."""
    query = union(select(ApiKey.tenant), select(Job.tenant), select(CostEntryRow.tenant))
    with engine.connect() as conn:
        return sorted(str(t) for (t,) in conn.execute(query))


def require_tenant(engine: Engine, tenant: str) -> str:
    try:
        validate_tenant(tenant)
    except InvalidTenant as exc:
        usage_error(f"--tenant: {exc}")
    known = known_tenants(engine)
    if tenant not in known:
        usage_error(f"unknown tenant {tenant!r} in this database; known: {', '.join(known) or 'none'}")
    return tenant
