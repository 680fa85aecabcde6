"""Attack: tenant names were never checked, and they reach report file names and store prefixes: a tenant named
`../../etc` could be created through the bootstrap setting or `overspill keys create --tenant`. One rule
(`broker.config.tenants.validate_tenant`) now holds wherever a tenant enters; the names in use stay valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from broker.api.auth import Role, create_key
from broker.cli.main import app
from broker.config.settings import Settings
from broker.store.db import make_engine, utcnow
from broker.store.migrate import upgrade

HOSTILE = [
    "../../etc",
    "..",
    "a/b",
    "Acme",
    "acme ",
    " acme",
    "acme\n",
    "",
    "-acme",
    "_x",
    "a" * 64,
    "ä",
    "a.b",
    "a\x00",
]
IN_USE = ["demo", "acme", "other", "globex", "t", "tenant-a", "team_1", "a" * 63]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_tenant_name_is_refused_by_the_one_rule(name: str) -> None:
    from broker.config.tenants import InvalidTenant, validate_tenant

    with pytest.raises(InvalidTenant):
        validate_tenant(name)


@pytest.mark.parametrize("name", IN_USE)
def test_tenant_names_in_use_stay_valid(name: str) -> None:
    from broker.config.tenants import validate_tenant

    assert validate_tenant(name) == name


def test_bootstrap_tenant_with_path_traversal_stops_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSPILL_BOOTSTRAP_TENANT", "../../etc")
    with pytest.raises(ValidationError, match="bootstrap_tenant"):
        Settings()
    monkeypatch.setenv("OVERSPILL_BOOTSTRAP_TENANT", "acme")
    assert Settings().bootstrap_tenant == "acme"


def test_keys_create_with_path_traversal_tenant_is_refused_naming_the_option(tmp_path: Path) -> None:
    env = {"OVERSPILL_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    runner = CliRunner()
    refused = runner.invoke(app, ["keys", "create", "--tenant", "../../etc", "--role", "admin"], env=env)
    assert refused.exit_code != 0 and "--tenant" in refused.output, refused.output
    made = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--role", "admin", "--json"], env=env)
    assert made.exit_code == 0 and json.loads(made.stdout)["tenant"] == "acme", made.output


def test_key_creation_in_code_refuses_a_hostile_tenant(tmp_path: Path) -> None:
    engine = make_engine(Settings(database_url=f"sqlite:///{tmp_path / 'k.db'}"))
    upgrade(engine)
    with pytest.raises(ValueError, match="tenant"):
        create_key(engine, tenant="../reports", role=Role.ADMIN, name="x", now=utcnow())
    assert create_key(engine, tenant="acme", role=Role.ADMIN, name="x", now=utcnow()).startswith("ovs_")
