"""`overspill costs` talks to a real uvicorn server with the caller's key and prints the grouped sums."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from typer.testing import CliRunner

from broker.cli import app
from broker.runtime import Runtime
from tests.finance_data import seed_ledger
from tests.test_cli import server  # noqa: F401  (the uvicorn fixture)


def test_costs_summary_over_the_api(server: str, rt: Runtime) -> None:  # noqa: F811
    total = seed_ledger(rt.engine, "demo", datetime(2026, 11, 1, tzinfo=UTC), days=1, entries=120)
    out = CliRunner().invoke(app, ["costs", "--group-by", "team,provider", "--url", server, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["group_by"] == ["team", "provider"] and Decimal(data["total"]["cost_usd"]) == total
    assert sum(Decimal(r["cost_usd"]) for r in data["rows"]) == total
    table = CliRunner().invoke(app, ["costs", "--url", server])
    assert table.exit_code == 0 and "total" in table.output and "nlp" in table.output
    bad = CliRunner().invoke(app, ["costs", "--group-by", "colour", "--url", server])
    assert bad.exit_code == 1 and "group_by" in bad.output
