"""`overspill costs` talks to a real uvicorn server with the caller's key and prints the grouped sums, in cents
that add up to the rounded exact total."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal

from typer.testing import CliRunner

from broker.cli.main import app
from broker.finance.money import cents
from broker.runtime import Runtime
from tests.finance_data import seed_ledger
from tests.test_cli import server  # noqa: F401  (the uvicorn fixture)


def test_costs_summary_over_the_api(server: str, rt: Runtime) -> None:  # noqa: F811
    total = seed_ledger(rt.engine, "demo", datetime(2026, 11, 1, tzinfo=UTC), days=1, entries=120)
    out = CliRunner().invoke(app, ["costs", "--group-by", "team,provider", "--url", server, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["group_by"] == ["team", "provider"] and Decimal(data["total"]["cost_usd"]) == total
    assert sum(Decimal(r["cost_usd"]) for r in data["rows"]) == total
    # people read cents: the display figures add up to the exact total rounded half-even, column by column
    assert total != cents(total) and data["total"]["display"]["cost_usd"] == str(cents(total))
    for field in ("cost_usd", "wasted_usd", "savings_usd", "on_demand_usd"):
        shown = [Decimal(r["display"][field]) for r in data["rows"]]
        assert all(d == cents(d) for d in shown) and sum(shown) == Decimal(data["total"]["display"][field])
    assert data["as_of"].startswith("2026-11-0")
    table = CliRunner().invoke(app, ["costs", "--url", server], env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "total" in table.output and "nlp" in table.output, table.output
    assert "data as of 2026-11-0" in table.output and "saved $" in table.output and "what spot saved" in table.output
    assert not re.search(r"\d\.\d{3,}", table.output), table.output  # no raw ledger precision
    [total_line] = [line for line in table.output.splitlines() if "total" in line]
    assert str(cents(total)) in total_line
    narrow = CliRunner().invoke(app, ["costs", "--group-by", "team,provider", "--url", server], env={"COLUMNS": "40"})
    for r in [*data["rows"], data["total"]]:  # on a narrow terminal no amount is cut
        assert all(r["display"][f] in narrow.stdout for f in ("cost_usd", "wasted_usd", "savings_usd")), narrow.stdout
    assert "…" not in narrow.stdout
    bad = CliRunner().invoke(app, ["costs", "--group-by", "colour", "--url", server])
    assert bad.exit_code == 2 and "group_by" in bad.output  # the caller's to fix: a usage error
