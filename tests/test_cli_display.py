"""What the CLI shows people at 80 columns (issue 31): money in cents (`--json` keeps the API's exact strings), the
quote's ranking with the columns that explain it, the cost summary with every column labelled and its total row
saying "total", and counts that agree with their noun."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from broker.cli.main import app
from broker.cli.output import money, plural
from broker.runtime import Runtime
from overspill.defaults import DEV_API_KEY
from tests.builders import job_body
from tests.finance_data import seed_ledger
from tests.test_cli import server  # noqa: F401  (the uvicorn fixture)

runner = CliRunner()
MANY_DECIMALS = re.compile(r"\$\d[\d,]*\.\d{3,}")


def test_money_and_counts_for_people() -> None:
    assert money("12.3456789012") == "$12.35" and money("0") == "$0.00" and money("1234.5") == "$1,234.50"
    assert money("0.125") == "$0.12"  # half-even, the one display rule (broker.finance.money)
    assert money(None) == "" and money("n/a") == "n/a"
    assert plural(1, "job") == "1 job" and plural(0, "job") == "0 jobs" and plural(2, "entry", "entries") == "2 entries"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_jobs_and_quote_at_80_columns(server: str, tmp_path: Path) -> None:  # noqa: F811
    env = {"OVERSPILL_URL": server, "OVERSPILL_API_KEY": DEV_API_KEY, "COLUMNS": "80"}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_body(max_total_usd="49.123456")))
    job = json.loads(runner.invoke(app, ["submit", str(spec), "--json"], env=env).stdout)
    assert job["max_total_usd"] == "49.123456"  # --json: the exact figure
    table = runner.invoke(app, ["jobs"], env=env)
    assert table.exit_code == 0, table.output
    assert "$49.12" in table.stdout and not MANY_DECIMALS.search(table.stdout), table.stdout
    quote = runner.invoke(app, ["quote", str(spec), "--limit", "5"], env=env)
    assert quote.exit_code == 0, quote.output
    header = next(line for line in quote.stdout.splitlines() if "pool" in line)
    assert "expected $" in header and "wait h" in header, quote.stdout  # what the ranking is by, and why
    ranking = quote.stdout[: quote.stdout.index("rejected")]  # the table (the reasons echo the spec's own figures)
    assert all(len(line) <= 80 for line in ranking.splitlines()), quote.stdout
    assert not MANY_DECIMALS.search(ranking)
    assert re.search(r"^\d+ pools? rejected", quote.stdout, re.M), quote.stdout
    assert json.loads(runner.invoke(app, ["quote", str(spec), "--json"], env=env).stdout)["candidates"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("group_by", ["team", "team,provider", "team,provider,region"])
def test_costs_at_80_columns_label_every_column(server: str, rt: Runtime, group_by: str) -> None:  # noqa: F811
    total = seed_ledger(rt.engine, "demo", datetime(2026, 11, 1, tzinfo=UTC), days=1, entries=30)
    env = {"OVERSPILL_URL": server, "OVERSPILL_API_KEY": DEV_API_KEY, "COLUMNS": "80"}
    window = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z"]
    out = runner.invoke(app, ["costs", "--group-by", group_by, *window], env=env)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    header = next(line for line in lines if "cost $" in line)
    for label in [*group_by.split(","), "cost $", "lost $", "on-demand $", "saved $", "entries"]:
        assert f" {label} " in header, (label, out.stdout)  # labelled, not cut
    [total_line] = [line for line in lines if line.startswith("│ total ")]
    assert f"{Decimal(total).quantize(Decimal('0.01'))}" in total_line
    assert "…" not in out.stdout and "lost: compute lost to preemptions" in out.stdout
