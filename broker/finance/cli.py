"""CLI commands for finance: `overspill report run` (local, with a progress display), `overspill costs` (a summary
from the API) and `overspill costs import-bill FILE` (local: import a FOCUS billing export and reconcile)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

report_app = typer.Typer(help="Cost reports (CSV, FOCUS 1.2, HTML, PDF).")
costs_app = typer.Typer(help="Costs from the ledger; provider bill import.", invoke_without_command=True)
console = Console()
err = Console(stderr=True)


@report_app.command("run")
def report_run(
    period: Annotated[str, typer.Option(help="a month (2026-10) or a day (2026-10-05), UTC")],
    fmt: Annotated[str, typer.Option("--format", help="csv, focus, html or pdf")] = "csv",
    out: Annotated[Path, typer.Option(help="directory to write the report to")] = Path("."),
    tenant: Annotated[str | None, typer.Option(help="tenant (default OVERSPILL_BOOTSTRAP_TENANT)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Produce a report of a period from the broker's database, record the run, and write the file."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from broker.cli.db import open_settings, require_tenant
    from broker.cli.output import usage_error
    from broker.finance.manage import run_public
    from broker.finance.reports.period import PeriodError, parse_period
    from broker.finance.reports.render import FORMATS
    from broker.finance.reports.runs import run_report
    from broker.runtime import build_runtime

    if fmt not in FORMATS:
        usage_error(f"--format: {fmt!r} is not a format; use one of {', '.join(FORMATS)}")
    try:
        start, end = parse_period(period)
    except PeriodError as exc:
        usage_error(f"--period: {exc}")
    settings = open_settings()
    rt = build_runtime(settings)
    who = require_tenant(rt.engine, tenant or settings.bootstrap_tenant)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err, disable=as_json
    ) as progress:
        task = progress.add_task(f"{fmt} report {period}", total=1.0)

        def step(message: str, fraction: float) -> None:
            progress.update(task, description=f"{fmt} report {period}: {message}", completed=fraction)

        run = run_report(rt, who, fmt, start, end, rt.clock(), progress=step)
    out.mkdir(parents=True, exist_ok=True)
    target = out / run.filename
    target.write_bytes(run.content or b"")
    public = run_public(run)
    as_of = f"data as of {public.data_as_of:%Y-%m-%d %H:%M} UTC" if public.data_as_of else "no ledger entries"
    result = {"id": run.id, "file": str(target), "sha256": run.sha256, "bytes": run.size_bytes, "entries": run.entries}
    result |= {
        "period_title": public.period_title,
        "data_as_of": public.data_as_of.isoformat() if public.data_as_of else None,
    }
    if as_json:
        print(json.dumps(result))
    else:
        console.print(
            f"{target}: {public.period_title}, {as_of} ({run.size_bytes} bytes, {run.entries} ledger entries, "
            f"sha256 {run.sha256[:16]}…)"
        )


@costs_app.callback()
def costs_summary(
    ctx: typer.Context,
    group_by: Annotated[str, typer.Option(help="comma list: team, project, job, placement, provider, ...")] = "team",
    from_: Annotated[str | None, typer.Option("--from", help="ISO 8601 (default: start of this month)")] = None,
    to: Annotated[str | None, typer.Option(help="ISO 8601 (default: now)")] = None,
    url: Annotated[str | None, typer.Option("--url", envvar="OVERSPILL_URL", help="broker URL")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="OVERSPILL_API_KEY", help="API key")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Cost, compute lost to preemptions, on-demand equivalent and what spot saved, grouped as asked (a finance or
    admin key); amounts in cents (`--json`: the API's exact figures and its display strings)."""
    if ctx.invoked_subcommand is not None:
        return
    from broker.cli.output import fail, print_unbroken
    from overspill.client import ApiError, BrokerClient

    params = {"group_by": group_by, "from": from_, "to": to}
    try:
        data: dict[str, Any] = BrokerClient(url, api_key)._call(
            "GET", "/v1/costs", params={k: v for k, v in params.items() if v}
        )
    except ApiError as exc:
        fail(exc, 2 if 400 <= exc.status < 500 else 1)
    if as_json:
        print(json.dumps(data))
        return
    console.print(summary_title(data), soft_wrap=True, highlight=False)
    print_unbroken(console, summary_table(data))
    console.print(SUMMARY_LEGEND, soft_wrap=True, highlight=False, style="dim")


def _when(iso: str) -> str:
    """An ISO 8601 UTC time from the API as "2026-11-25 10:30 UTC"."""
    return iso[:16].replace("T", " ") + " UTC"


SUMMARY_MONEY = (("cost_usd", "cost $"), ("wasted_usd", "lost $"), ("on_demand_usd", "on-demand $"))
SUMMARY_MONEY += (("savings_usd", "saved $"),)
SUMMARY_LEGEND = (
    "lost: compute lost to preemptions; on-demand: the same use at on-demand prices; saved: what spot saved"
)
GROUP_MIN_WIDTH = 12  # a group column (team, pool, job...) wraps below its natural width, never below this


def summary_title(data: dict[str, Any]) -> str:
    """The window of a `/v1/costs` answer and its data's "as of" time, one line above the table."""
    as_of = f"data as of {_when(data['as_of'])}" if data.get("as_of") else "no ledger entries"
    return f"{_when(data['from'])} to {_when(data['to'])} ({as_of})"


def summary_table(data: dict[str, Any]) -> Table:
    """A `/v1/costs` answer as a table of its display figures (cents, each column adding up to its total:
    `broker.finance.money`). Short headers (`SUMMARY_LEGEND` explains them), so that at 80 columns every column
    keeps its label, every amount stays whole and the total row says "total" (the table is printed wider than the
    terminal, by `print_unbroken`, rather than squeezing any of them)."""
    keys = data["group_by"]
    table = Table()
    for i, key in enumerate(keys):
        natural = max([len(str(r[key])) for r in data["rows"]] or [0])
        least = max(len(key), len("total") if i == 0 else 0, min(natural, GROUP_MIN_WIDTH))
        table.add_column(key, overflow="fold", min_width=least)  # a long pool or job name wraps, never ends in "…"
    for _, header in (*SUMMARY_MONEY, (None, "entries")):
        table.add_column(header, justify="right", no_wrap=True, overflow="fold", min_width=len(header))
    for r in data["rows"]:
        table.add_row(*[str(r[k]) for k in keys], *[r["display"][m] for m, _ in SUMMARY_MONEY], str(r["entries"]))
    if table.rows:
        table.rows[-1].end_section = True
    total = data["total"]
    table.add_row(
        *(["total"] + [""] * (len(keys) - 1)),
        *[total["display"][m] for m, _ in SUMMARY_MONEY],
        str(total.get("entries", "")),
        style="bold",
    )
    return table


@costs_app.command("import-bill")
def import_bill_cmd(
    file: Annotated[Path, typer.Argument(help="FOCUS export: .csv, .csv.gz or .parquet")],
    provider: Annotated[str | None, typer.Option(help="aws, gcp, azure... (default: from ProviderName)")] = None,
    tenant: Annotated[str | None, typer.Option(help="tenant (default OVERSPILL_BOOTSTRAP_TENANT)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Import a provider billing export and show the ledger vs bill difference per resource."""
    from broker.cli.db import open_settings, require_tenant
    from broker.cli.output import fail
    from broker.finance.billing import BillError, import_bill, reconcile
    from broker.finance.money import plain, usd
    from broker.runtime import build_runtime

    settings = open_settings()
    rt = build_runtime(settings)
    who = require_tenant(rt.engine, tenant or settings.bootstrap_tenant)
    try:
        with console.status(f"importing {file.name}..."):
            summary = import_bill(rt, who, file, rt.clock(), provider=provider)
    except (BillError, OSError) as exc:
        fail(exc)
    result = reconcile(rt, who, summary.id) or {}
    if as_json:
        print(json.dumps(result))
        return
    console.print(
        f"{file.name}: {summary.rows} rows, {summary.resources} resources "
        f"({summary.skipped_without_resource} rows without a resource), billed {usd(summary.billed_usd)}"
    )
    table = Table("resource", "ledger $", "billed $", "difference $", "status")
    for r in result.get("rows", []):
        amounts = [plain(Decimal(r[k])) for k in ("ledger_usd", "billed_usd", "difference_usd")]
        table.add_row(r["resource_id"], *amounts, r["status"])
    console.print(table)
