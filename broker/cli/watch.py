"""Watching a job from the CLI: `overspill logs` (with `-f`, across attempts), `overspill attempts`, `overspill
status`. HTTP only: imports nothing of the broker's database or table layers (the CLI stays fast).

`logs JOB -f` waits for the job's first placement (printing why it waits: the job's state and note, whenever
they change), streams each attempt's log as it grows, prints a marker line to stderr when a new attempt starts,
and ends once the job is over. `logs JOB --attempt N` reads attempt N (1 = the first). On a job whose attempt runs
no instance agent (the simulated market, Slurm) it says so and exits 1 rather than printing nothing. Markers and
notes go to stderr, so stdout holds the job's output only.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.cli.connect import client as _client
from overspill.defaults import TERMINAL_STATES
from overspill.errors import ApiError

if TYPE_CHECKING:
    from overspill.client import BrokerClient

console = Console()
err = Console(stderr=True, highlight=False, soft_wrap=True)

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="OVERSPILL_URL", help="broker URL")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="OVERSPILL_API_KEY", help="API key")]
JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
POLL_SECONDS = 1.0  # how often `logs -f` looks at the job while it waits for an attempt


def _fail(exc: ApiError) -> None:
    err.print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1)


def _pool(a: dict[str, Any]) -> str:
    return f"{a['provider']}/{a['zone']} {a['instance_type']} {a['capacity_type']}"


def no_agent_reason(a: dict[str, Any]) -> str:
    """Why attempt `a` has no log."""
    return (
        f"attempt {a['number']} ran on {a['pool']} ({a['provider']}), a pool whose instances run no Overspill agent "
        "(a simulated market or a Slurm cluster): no log is collected there; its timeline is in the job's events"
    )


def _write(out: Any, data: bytes) -> None:
    out.write(data)
    out.flush()


def logs(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="wait for the job to be placed, then print its log as it grows, across attempts"
        ),
    ] = False,
    attempt: Annotated[
        str | None, typer.Option(help="an attempt number (1 = the first; see `overspill attempts`) or placement id")
    ] = None,
    offset: Annotated[int, typer.Option(min=0, help="the byte of the log to start at")] = 0,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Print a job's output (stdout and stderr as its instance agent stored them), while it runs or after."""
    client = _client(url, api_key)
    out = sys.stdout.buffer
    try:
        if follow and attempt is None:
            code = follow_job(client, job_id, out, offset=offset)
        else:
            code = read_attempt(client, job_id, attempt, out, offset=offset, follow=follow)
    except ApiError as exc:
        _fail(exc)
        return
    raise typer.Exit(code)


def read_attempt(
    client: BrokerClient, job_id: str, attempt: str | None, out: Any, *, offset: int = 0, follow: bool = False
) -> int:
    """Print one attempt's log (the latest by default); the exit code."""
    attempts = client.attempts(job_id)
    chosen = _find(attempts, attempt) if attempt is not None else (attempts[-1] if attempts else None)
    if chosen is None:
        job = client.get(job_id)
        err.print(f"job {job_id} is {job['state']}: {escape(job['wait_reason'] or 'no attempt yet')}")
        err.print("no attempt has run yet: nothing is logged (`overspill logs -f` waits for it)")
        return 0
    if not chosen["has_log"]:
        err.print(escape(no_agent_reason(chosen)))
        return 1
    if follow:
        for piece in client.follow_logs(job_id, chosen["placement_id"], offset):
            _write(out, piece)
        return 0
    while True:
        page = client.log_page(job_id, chosen["placement_id"], offset)
        if not page.data:
            break
        _write(out, page.data)
        offset = page.next_offset
    return 0


def _find(attempts: list[dict[str, Any]], attempt: str) -> dict[str, Any] | None:
    for a in attempts:
        if str(a["number"]) == attempt or a["placement_id"] == attempt:
            return a
    raise ApiError(404, f"no attempt {attempt!r} of this job (it has {len(attempts)}; see `overspill attempts`)")


def follow_job(
    client: BrokerClient,
    job_id: str,
    out: Any,
    *,
    offset: int = 0,
    poll_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow the job across its attempts until it is over (see the module docstring); the exit code."""
    current: str | None = None  # the placement whose log is streamed
    told: set[str] = set()  # attempts without a log already explained
    said = ""
    while True:
        job = client.get(job_id)
        attempts = client.attempts(job_id)
        latest = attempts[-1] if attempts else None
        if latest is not None and latest["placement_id"] != current and latest["has_log"]:
            if current is not None:
                offset = 0  # a new attempt's log starts at its beginning
            current = latest["placement_id"]
            err.print(f"==> attempt {latest['number']} on {escape(_pool(latest))} ({current}) <==")
            said = ""
        elif latest is not None and not latest["has_log"] and latest["placement_id"] not in told:
            told.add(latest["placement_id"])
            err.print(escape(no_agent_reason(latest)))
        waiting = (
            f"job {job_id} is {job['state']}: {job['wait_reason']}" if job["state"] in ("pending", "starting") else ""
        )
        if waiting and waiting != said:
            err.print(escape(waiting))
            said = waiting
        if current is not None and latest is not None and latest["placement_id"] == current:
            for piece in client.follow_logs(job_id, current, offset):  # until the attempt ends
                offset += len(piece)
                _write(out, piece)
            job = client.get(job_id)
            if job["state"] in TERMINAL_STATES and client.attempts(job_id)[-1]["placement_id"] == current:
                return _ended(job)
            continue
        if job["state"] in TERMINAL_STATES:
            return _ended(job)
        sleep(POLL_SECONDS if poll_seconds is None else poll_seconds)


def _ended(job: dict[str, Any]) -> int:
    err.print(f"==> job {job['id']} {job['state']} <==")
    return 0


def attempts(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List a job's attempts: where each ran, its state, when it started and ended, its cost and why it ended."""
    try:
        items = _client(url, api_key).attempts(job_id)
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(items))
        return
    table = Table(show_edge=False)
    for name in ("#", "pool", "state", "started", "ended", "cost", "end reason"):
        table.add_column(name, overflow="fold")
    for a in items:
        table.add_row(
            str(a["number"]),
            escape(_pool(a)),
            a["state"],
            _time(a["started_at"]),
            _time(a["ended_at"]),
            f"${a['cost_usd']}",
            escape(a["end_reason"]),
        )
    console.print(table)
    if not items:
        err.print(f"job {job_id} has no attempt yet")


def _time(at: str | None) -> str:
    return at.replace("T", " ")[:19] if at else ""


def progress_text(job: dict[str, Any]) -> str:
    """'1200/5000 (24%)' from the job's reported progress; '' when it reports none."""
    p = job.get("progress")
    if not p:
        return ""
    return f"{p['done']:g}/{p['total']:g} ({p['fraction'] * 100:.0f}%)"


def checkpoint_text(job: dict[str, Any]) -> str:
    c = job.get("checkpoint")
    if not c:
        return ""
    units = f" at {c['units']:g}" if c.get("units") is not None else ""
    return f"{c['fraction'] * 100:.0f}% of the work{units} ({c['work_hours']} h)"


def status(
    job_id: Annotated[str, typer.Argument(help="the job's id")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """One job: its state and note, where it runs, reported progress, last durable checkpoint and work left."""
    try:
        job = _client(url, api_key).get(job_id)
    except ApiError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(job))
        return
    p = job.get("placement") or {}
    rows = [
        ("job", job["id"]),
        ("name", job["name"]),
        ("state", job["state"]),
        ("note", job["wait_reason"]),
        ("where", f"{p['provider']}/{p['zone']} {p['instance_type']} {p['capacity_type']}" if p else ""),
        ("attempts", str(job["attempts"])),
        ("progress", progress_text(job) or "not reported"),
        ("checkpoint", checkpoint_text(job) or "none yet"),
        ("work left", f"{job['remaining_work_hours']} h of {job['work_hours']} h"),
        ("spent", f"${job['spent_usd']} of ${job['max_total_usd']}"),
    ]
    table = Table(show_header=False, show_edge=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(name, escape(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add `logs`, `attempts` and `status` to the CLI."""
    app.command()(logs)
    app.command()(attempts)
    app.command()(status)
