"""The `overspill` command line: run the broker (serve, tick, demo), use it (submit, jobs, logs, quote, pools) and
administer it (keys create). Tables for people, `--json` for scripts.

Fast by construction: importing this module (what `--help` and every command pay) loads Typer, Rich, YAML and
the client's error type, nothing of the broker's database, tables, settings or web framework, nor the HTTP library.
A command that speaks HTTP loads `overspill.client` when it runs; a command that opens the database (`keys create`,
`prices ...`, `tick`, `report run`, `costs import-bill`) loads the store when it runs. tests/test_cli_imports.py
holds this; benchmarks/cli_bench.py measures it."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from broker.cli import watch
from broker.cli.connect import client as _client
from broker.cli.output import Column, fail, money, plural, print_table, usage_error
from broker.finance.cli import costs_app, report_app
from overspill.errors import ApiError

if TYPE_CHECKING:
    pass

app = typer.Typer(help="Overspill: burst GPU training jobs to the cheapest suitable pool within a cost ceiling.")
keys_app = typer.Typer(help="API keys.")
app.add_typer(keys_app, name="keys")
prices_app = typer.Typer(help="Price feeds and catalogs.")
app.add_typer(prices_app, name="prices")
app.add_typer(report_app, name="report")
app.add_typer(costs_app, name="costs")
watch.register(app)  # logs, attempts, status (broker/cli/watch.py)
console = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="OVERSPILL_URL", help="broker URL")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="OVERSPILL_API_KEY", help="API key")]


MAX_SPEC_BYTES = 1_000_000  # the API's default body limit: a bigger spec could not be sent anyway


def _no_alias_loader() -> type:
    """YAML's safe loader without aliases: a job spec never needs one, and a few hundred bytes of nested aliases
    expand to gigabytes (the "billion laughs"). Built on first use: only the commands that read a spec load YAML."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in a job spec", event.start_mark
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def _yaml_problem(exc: Any) -> str:
    """A YAML error (`yaml.YAMLError`) as one line: `line L, column C: problem`."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context or 'invalid YAML'}"
    return " ".join(str(exc).split())


def _load_spec(path: Path) -> dict[str, Any]:
    """A job spec from a YAML or JSON file: at most `MAX_SPEC_BYTES`, no YAML aliases. Anything wrong is a usage
    error: one line naming the file and what is wrong, exit code 2."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        usage_error(f"cannot read {path}: {exc.strerror or exc}")
    if len(raw) > MAX_SPEC_BYTES:
        usage_error(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        usage_error(f"{path}: not UTF-8 text (byte {exc.start})")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            usage_error(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
    else:
        import yaml

        try:
            data = yaml.load(text, Loader=_no_alias_loader())
        except yaml.YAMLError as exc:
            usage_error(f"{path}: invalid YAML at {_yaml_problem(exc)}")
    if not isinstance(data, dict):
        usage_error(f"{path}: must hold one job spec (a mapping of fields), not {type(data).__name__}")
    return data


def _nullcontext() -> Any:
    from contextlib import nullcontext

    return nullcontext()


def _fail(exc: ApiError) -> None:
    """An API error as one line: exit 2 when the request was the caller's to fix (4xx), else 1."""
    if 400 <= exc.status < 500:
        usage_error(str(exc))
    fail(exc)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default OVERSPILL_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default OVERSPILL_PORT or 8000)")] = None,
    loop: Annotated[bool, typer.Option(help="run the control loop too")] = True,
    workers: Annotated[int, typer.Option(min=1, max=64, help="API worker processes (3 suit a 2-core machine)")] = 1,
) -> None:
    """Run the REST API (and the control loop on an interval)."""
    import subprocess

    import uvicorn

    from broker.cli.db import describe as describe_database
    from broker.cli.env import load_settings
    from broker.cli.listen import PortUnavailable, listen
    from broker.observe.logging_setup import configure_logging
    from overspill.defaults import DEV_API_KEY

    os.environ.setdefault("OVERSPILL_LOCAL_POOL", "true")  # `make run`: this machine runs real jobs (providers/local)
    settings = load_settings()
    bind_host, bind_port = host or settings.host, port or settings.port
    try:  # bound before anything is built or printed: a port in use is one line, with no banner and no key
        sock = listen(bind_host, bind_port)
    except PortUnavailable as exc:
        usage_error(f"{exc}; stop what holds it, or choose another with --port or OVERSPILL_PORT")
    configure_logging(settings)
    # X-Forwarded-For is trusted only from the proxies configured (uvicorn by default trusts 127.0.0.1, so any
    # local process could pose as any client address to the rate limiter and the audit log)
    proxies = settings.forwarded_allow_ips.strip()
    options: dict[str, Any] = {
        "host": bind_host,
        "port": bind_port,
        "log_level": "warning",
        "log_config": None,  # uvicorn's records go through the broker's (JSON) handler
        "access_log": False,  # the broker writes its own access records, with the request id
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
    }

    def banner() -> None:
        where = f"http://{bind_host}:{bind_port}" if ":" not in bind_host else f"http://[{bind_host}]:{bind_port}"
        console.print(f"[bold]Overspill[/bold] on {where}  (OpenAPI: /docs, console: /console/)", soft_wrap=True)
        console.print(
            f"database: {describe_database(settings)}   simulated pools: {settings.simulated}", soft_wrap=True
        )
        if settings.bootstrap_api_key == DEV_API_KEY:
            console.print(f"development admin key for tenant {settings.bootstrap_tenant!r}: {DEV_API_KEY}")

    if workers == 1:
        from broker.app import create_app

        server = uvicorn.Server(uvicorn.Config(create_app(settings, loop=loop), **options))
        banner()
        server.run(sockets=[sock])
        if not server.started:  # the app's startup failed (uvicorn logged why): a failure, as uvicorn.run says it
            raise typer.Exit(3)
        return
    import inspect

    from uvicorn.supervisors import Multiprocess

    from broker.runtime import build_runtime

    build_runtime(settings)  # migrate and install the bootstrap key once, before the workers start
    config = uvicorn.Config("broker.app:app_from_env", factory=True, workers=workers, **options)
    ticker = subprocess.Popen([sys.argv[0], "tick", "--loop"]) if loop else None
    banner()
    try:
        supervisor_options: dict[str, Any] = {"sockets": [sock]}
        if "target" in inspect.signature(Multiprocess).parameters:  # older uvicorn took the server's run
            supervisor_options["target"] = uvicorn.Server(config).run
        Multiprocess(config, **supervisor_options).run()
    finally:
        sock.close()
        if ticker is not None:
            ticker.terminate()
            ticker.wait(timeout=30)


@app.command()
def tick(
    loop: Annotated[bool, typer.Option(help="keep ticking every tick_interval_seconds")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run the control loop once (for cron or a serverless schedule)."""
    import logging
    import threading

    from broker.cli.db import open_settings
    from broker.cli.env import load_settings
    from broker.loop.runner import run_forever
    from broker.loop.tick import tick as run_tick
    from broker.observe.logging_setup import configure_logging
    from broker.runtime import build_runtime

    settings = load_settings() if loop else open_settings()
    if loop:
        configure_logging(settings)
        rt = build_runtime(settings)
        if settings.tick_metrics_port:
            from prometheus_client import start_http_server

            start_http_server(settings.tick_metrics_port, addr=settings.host, registry=rt.metrics.registry)
        run_forever(rt, threading.Event())
        return
    # one round: log (warnings only with --json, whose stdout is the report), and leave logging as it was after
    handler = configure_logging(settings, level="warning" if as_json else None)
    try:
        rt = build_runtime(settings)
        report = run_tick(rt, rt.clock())
    finally:
        logging.getLogger().removeHandler(handler)
    rows = [{"step": s.name, "count": s.count, "seconds": round(s.seconds, 4), "error": s.error} for s in report.steps]
    if as_json:
        print(json.dumps(rows))
    else:
        table = Table("step", "count", "seconds", "error")
        for r in rows:
            table.add_row(r["step"], str(r["count"]), f"{r['seconds']:.3f}", r["error"])
        console.print(table)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def demo(
    jobs: Annotated[int, typer.Option(min=1, max=500, help="number of jobs to submit")] = 24,
    hours: Annotated[float, typer.Option(min=1, max=24 * 14, help="simulated hours to run at most")] = 36.0,
    seed: Annotated[int, typer.Option(help="market seed")] = 7,
    throwaway: Annotated[
        bool, typer.Option("--throwaway", help="use a temporary database (nothing is kept; same figures each run)")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run a simulated day of bursting in seconds: what ran where, what it cost, what spot saved.

    By default the history is kept in the configured database (OVERSPILL_DATA_DIR, ./.overspill), ending before
    now, so `overspill serve` then shows it in the console and the reports."""
    from broker.cli.db import describe as describe_database
    from broker.cli.env import load_settings
    from broker.demo import DemoRefused, print_summary, run_demo

    settings = None if throwaway else load_settings()
    if settings is not None and not as_json:
        err.print(f"database: {describe_database(settings)}", soft_wrap=True, highlight=False)
    try:
        result = run_demo(n_jobs=jobs, hours=hours, seed=seed, progress=not as_json, settings=settings)
    except DemoRefused as exc:
        usage_error(str(exc))
    if as_json:
        print(json.dumps(result.as_dict(), default=str))
        return
    print_summary(result, Console(width=max(console.width, 120)))
    if result.warnings:
        where = f" (in {result.log_path})" if result.log_path else ""
        console.print(f"{result.warnings} warnings were logged{where}.", soft_wrap=True)
    if result.database:
        console.print(
            f"The history is kept in {describe_database(settings) if settings else result.database}: run "
            "`overspill serve` (from this folder, or with the same OVERSPILL_DATA_DIR) and open "
            f"http://{settings.host if settings else '127.0.0.1'}:{settings.port if settings else 8000}/console/",
            soft_wrap=True,
        )


def _traces_folder(given: Path | None) -> tuple[Path, str]:
    """Where `simulate` reads its traces, and why there: `--data`, else OVERSPILL_SHARED_DATA, else the
    `shared/data` folder beside the repository's folder."""
    import os

    if given is not None:
        return given, "--data"
    env = os.environ.get("OVERSPILL_SHARED_DATA")
    if env:
        return Path(env), "OVERSPILL_SHARED_DATA"
    return Path(__file__).resolve().parent.parent.parent.parent / "shared" / "data", "default (../shared/data)"


@app.command()
def simulate(
    data: Annotated[
        Path | None,
        typer.Option(help="folder of real traces and catalogs (default: OVERSPILL_SHARED_DATA, else ../shared/data)"),
    ] = None,
    suite: Annotated[str, typer.Option(help="deadline, markets, burst or all")] = "all",
    quick: Annotated[
        bool, typer.Option(help="a smaller run, for a first look: fewer jobs, no slow research policy (forecast)")
    ] = False,
    png: Annotated[Path | None, typer.Option(help="also draw the comparison chart here")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay real spot availability, price and job traces through every policy (ours and the baselines)."""
    from federation.simulate import run_simulation
    from federation.simulate.experiments import CATALOG, PHILLY, SEGMENTS

    if suite not in ("deadline", "markets", "burst", "all"):
        usage_error(f"--suite: {suite!r} is not a suite; use deadline, markets, burst or all")
    folder, source = _traces_folder(data)
    needed = [CATALOG]
    needed += [SEGMENTS] if suite in ("deadline", "all") else []
    needed += [PHILLY] if suite in ("burst", "all") else []
    if not folder.is_dir():
        usage_error(f"traces folder {folder} (from {source}) does not exist; set OVERSPILL_SHARED_DATA or --data")
    missing = [str(rel) for rel in needed if not (folder / rel).is_file()]
    if missing:
        usage_error(f"traces folder {folder} (from {source}) lacks {', '.join(missing)}")
    err.print(f"traces from {folder.resolve()} ({source})", soft_wrap=True, highlight=False)
    try:
        with console.status("replaying traces...") if not as_json else _nullcontext():
            report = run_simulation(folder, suite=suite, quick=quick, png=png)  # type: ignore[arg-type]
    except ValueError as exc:
        usage_error(str(exc))
    if as_json:
        print(json.dumps(report.to_json(), default=str))
    else:
        print(report.tables())
        if png is not None:
            console.print(f"chart: {png}")


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="job spec, YAML or JSON")],
    idempotency_key: Annotated[str | None, typer.Option(help="makes retries safe")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit a job."""
    _job_command(
        lambda: _client(url, api_key).submit(_load_spec(file), idempotency_key),
        as_json,
        lambda job: f"submitted [bold]{job['id']}[/bold] ({job['state']}), ceiling {money(job['max_total_usd'])}",
    )


def _job_command(call: Callable[[], dict[str, Any]], as_json: bool, said: Callable[[dict[str, Any]], str]) -> None:
    """Run a job command against the broker: the job as JSON, or one line about it; an API error exits 1."""
    try:
        job = call()
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(job))
    else:
        console.print(said(job))


@app.command()
def update(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    max_total_usd: Annotated[str | None, typer.Option(help="new total ceiling, USD")] = None,
    max_hourly_usd: Annotated[str | None, typer.Option(help="new hourly ceiling, USD ('none' removes it)")] = None,
    deadline: Annotated[str | None, typer.Option(help="new deadline, ISO 8601 with a zone ('none' removes it)")] = None,
    priority: Annotated[int | None, typer.Option(help="new priority (-1000..1000)")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Change a job's ceilings, deadline or priority; a paused job resumes under the new limits."""
    changes: dict[str, object] = {}
    if max_total_usd is not None:
        changes["max_total_usd"] = max_total_usd
    for name, value in (("max_hourly_usd", max_hourly_usd), ("deadline", deadline)):
        if value is not None:
            changes[name] = None if value.lower() == "none" else value
    if priority is not None:
        changes["priority"] = priority
    _job_command(
        lambda: _client(url, api_key).update(job_id, changes),
        as_json,
        lambda job: f"updated [bold]{job['id']}[/bold] ({job['state']}), ceiling {money(job['max_total_usd'])}",
    )


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Cancel a job; the next tick stops any instance it holds."""
    _job_command(
        lambda: _client(url, api_key).cancel(job_id), as_json, lambda job: f"cancelled [bold]{job['id']}[/bold]"
    )


@app.command()
def notice(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Development drill: deliver a spot interruption notice to the job's running attempt, as its cloud would;
    the agent checkpoints, the job is re-placed and resumes (the local pool; refused in production)."""
    _job_command(
        lambda: _client(url, api_key).notice(job_id),
        as_json,
        lambda got: (
            f"notice delivered to {got['instance_id']} (attempt {got['placement_id']}), deadline {got['deadline']}"
        ),
    )


@app.command()
def events(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new events until the job has ended")
    ] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """A job's timeline, oldest first: when it was placed, launched, started, noticed, checkpointed, re-placed,
    finished, and what it cost (one line per event; --json: one JSON object per line)."""
    client = _client(url, api_key)
    try:
        stream = client.follow_events(job_id) if follow else iter(client.events(job_id))
        for event in stream:
            if as_json:
                print(json.dumps(event), flush=True)
            else:
                at = str(event["at"]).replace("T", " ")[:19]
                print(f"{at}  {event['kind']:<24} {event['message']}", flush=True)
    except ApiError as exc:
        _fail(exc)


@app.command(name="jobs")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="filter by state")] = None,
    team: Annotated[str | None, typer.Option(help="filter by team")] = None,
    limit: Annotated[int, typer.Option(help="page size")] = 50,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    try:
        page = _client(url, api_key).jobs(state=state, team=team, limit=limit)
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(page))
        return
    columns = [
        Column("id", "id"),
        Column("name", "text", drop=2),
        Column("team", "text", drop=4),
        Column("state", "id"),
        Column("where", "text", drop=3),
        Column("progress", "text", drop=6),
        Column("spent", "money"),
        Column("ceiling", "money", drop=1),
        Column("note", "text", drop=5),
    ]
    rows = []
    for j in page["items"]:
        p = j.get("placement") or {}
        where = f"{p.get('provider')}/{p.get('zone')} {p.get('capacity_type')}" if p else ""
        rows.append(
            [
                j["id"],
                j["name"],
                j["team"],
                j["state"],
                where,
                watch.progress_text(j),
                money(j["spent_usd"]),
                money(j["max_total_usd"]),
                j["wait_reason"][:60],
            ]
        )
    print_table(console, columns, rows)


@app.command()
def quote(
    file: Annotated[Path, typer.Argument(help="job spec, YAML or JSON")],
    limit: Annotated[int, typer.Option(help="pools to show")] = 10,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Rank pools for a job spec without submitting it."""
    try:
        q = _client(url, api_key).quote(_load_spec(file), limit)
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(q))
        return
    # the ranking is by expected cost and finish: the wait (an on-prem queue) and the expected cost explain why a
    # cheap pool ranks below a dearer one, so they stay at any width; the rank number (the rows are in rank
    # order) goes first, then the finish time, then $/h
    columns = [
        Column("#", "number", drop=3),
        Column("pool", "id"),
        Column("$/h", "money", drop=1),
        Column("expected $", "money"),
        Column("wait h", "number"),
        Column("finish (UTC)", "id", drop=2),
    ]
    rows = [
        [
            str(c["rank"]),
            c["offering"]["key"],
            money(c["offering"]["hourly_usd"]),
            money(c["expected_cost_usd"]),
            f"{c['expected_wait_hours']:.2f}",
            c["expected_finish_at"][:16].replace("T", " "),
        ]
        for c in q["candidates"]
    ]
    print_table(console, columns, rows)
    if not q["placeable_now"]:
        console.print(f"[yellow]not placeable now:[/yellow] {q['wait_reason']}")
    rejected = q["rejections"][:limit]
    console.print(f"{plural(q['rejections_total'], 'pool')} rejected{'; first reasons:' if rejected else ''}")
    for r in rejected:
        console.print(f"  {r['offering_key']}: {r['reason']} ({r['message']})")


@app.command()
def pools(
    accelerator: Annotated[str | None, typer.Option(help="e.g. A100")] = None,
    provider: Annotated[str | None, typer.Option(help="e.g. sim-aws")] = None,
    limit: Annotated[int, typer.Option(help="rows")] = 50,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Pools with live prices and their freshness."""
    try:
        rows = _client(url, api_key).pools(accelerator=accelerator, provider=provider, limit=limit)
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(rows))
        return
    columns = [
        Column("pool", "id"),
        Column("gpus", "id"),
        Column("$/h", "money"),
        Column("source", "text", drop=3),
        Column("age s", "number", drop=2),
        Column("interrupts/h", "number", drop=4),
        Column("wait h", "number", drop=1),
        Column("sim", "text", drop=5),
    ]
    print_table(
        console,
        columns,
        [
            [
                o["key"],
                f"{o['accelerator_count']}x{o['accelerator']}",
                money(o["hourly_usd"]),
                o["price_source"],
                f"{o['age_seconds']:.0f}",
                f"{o['interruption_rate_per_hour']:.3f}",
                f"{o['expected_wait_hours']:.2f}",
                "yes" if o["simulated"] else "",
            ]
            for o in rows
        ],
    )


@prices_app.command("refresh")
def prices_refresh(as_json: JsonFlag = False) -> None:
    """Refresh every configured price feed now (whether or not it is due)."""
    from sqlmodel import Session, select

    from broker.cli.db import open_settings
    from broker.loop.feeds import refresh_prices
    from broker.runtime import build_runtime
    from broker.store.tables import FeedStatus

    rt = build_runtime(open_settings())
    now = rt.clock()
    with console.status("refreshing price feeds..."):
        refresh_prices(rt, now, force=True)
    with Session(rt.engine) as session:
        feeds = [f for f in session.exec(select(FeedStatus)).all() if f.name.startswith("prices:")]
    rows = [
        {
            "feed": f.name,
            "pools": f.items,
            "ok": f.last_success_at == now,
            "error": f.last_error if f.last_error_at == now else "",
        }
        for f in feeds
    ]
    if as_json:
        print(json.dumps(rows))
    else:
        table = Table("feed", "pools", "ok", "error")
        for r in rows:
            table.add_row(r["feed"], str(r["pools"]), "yes" if r["ok"] else "[red]no[/red]", r["error"])
        console.print(table)
    if not all(r["ok"] for r in rows):
        raise typer.Exit(1)


@prices_app.command("import-catalog")
def prices_import_catalog(
    files: Annotated[list[Path], typer.Argument(help="SkyPilot-format vms.csv files (.csv or .csv.gz)")],
    provider: Annotated[str | None, typer.Option(help="provider name, if not clear from the file name")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Load catalogs you already have (SkyPilot schema v5-v8) into the broker's pools."""
    from broker.cli.db import open_settings
    from broker.runtime import build_runtime
    from broker.services.prices import ImportSummary, import_catalog_files
    from pricing.feeds import FeedError

    rt = build_runtime(open_settings())
    done: list[ImportSummary] = []

    def report(s: ImportSummary) -> None:
        done.append(s)
        if not as_json:
            console.print(
                f"{s.path.name}: {s.offerings} pools from {s.rows} rows ({s.skipped} skipped), "
                f"{s.price_changes} price changes"
            )
            for w in s.warnings[:5]:
                console.print(f"  [yellow]warning:[/yellow] {w}")

    try:
        with console.status("importing...", spinner="dots") if not as_json else _nullcontext():
            import_catalog_files(rt, files, rt.clock(), provider=provider, on_file=report)
    except (FeedError, OSError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps([{**s.__dict__, "path": str(s.path)} for s in done]))


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="tenant the key belongs to")],
    role: Annotated[str, typer.Option(help="admin, submitter or finance")] = "submitter",
    name: Annotated[str, typer.Option(help="what the key is for")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Create an API key directly in the database (prints it once)."""
    from broker.api.auth import Role, create_key
    from broker.cli.db import open_settings
    from broker.config.tenants import InvalidTenant, validate_tenant
    from broker.store.db import make_engine, utcnow
    from broker.store.migrate import upgrade

    try:
        role_ = Role(role)
    except ValueError:
        usage_error(f"--role: {role!r} is not a role; use admin, submitter or finance")
    try:
        validate_tenant(tenant)
    except InvalidTenant as exc:
        usage_error(f"--tenant: {exc}")
    engine = make_engine(open_settings())
    upgrade(engine)
    key = create_key(engine, tenant=tenant, role=role_, name=name, now=utcnow())
    if as_json:
        print(json.dumps({"tenant": tenant, "role": role, "key": key}))
    else:
        console.print(f"API key for tenant {tenant!r} ({role}); shown once:\n{key}")


@app.command(
    "agent",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def agent_command(ctx: typer.Context) -> None:
    """The instance agent: `overspill agent run --spec URI ...` runs one job attempt on this machine (see
    `overspill agent --help`; instances run the same program from its wheel: `python3 -m agent`)."""
    from agent.__main__ import main as agent_main

    raise typer.Exit(agent_main(ctx.args or ["--help"]))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
