"""The `overspill` CLI: user commands against a real uvicorn server, `keys create`, `tick` and `demo`."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml
from typer.testing import CliRunner

from broker.app import create_app
from broker.cli.main import app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from tests.builders import job_body

runner = CliRunner()


@pytest.fixture
def server(rt: Runtime) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(runtime=rt), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_submit_jobs_quote_pools_against_a_server(server: str, tmp_path: Path) -> None:
    env = {"OVERSPILL_URL": server, "OVERSPILL_API_KEY": DEV_API_KEY}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_body(name="cli-job")))
    out = runner.invoke(app, ["submit", str(spec), "--json", "--idempotency-key", "k1"], env=env)
    assert out.exit_code == 0, out.output
    job = json.loads(out.stdout)
    again = json.loads(runner.invoke(app, ["submit", str(spec), "--json", "--idempotency-key", "k1"], env=env).stdout)
    assert again["id"] == job["id"]
    listed = json.loads(runner.invoke(app, ["jobs", "--json"], env=env).stdout)
    assert [j["id"] for j in listed["items"]] == [job["id"]]
    table = runner.invoke(app, ["jobs"], env=env)
    assert "cli-job" in table.output
    narrow = runner.invoke(app, ["jobs"], env={**env, "COLUMNS": "40"})
    assert job["id"] in narrow.stdout and f"${job['spent_usd']}" in narrow.stdout  # never cut: copyable
    assert "too narrow for:" in narrow.stdout
    quoted = runner.invoke(app, ["quote", str(spec)], env={**env, "COLUMNS": "60"})
    first = json.loads(runner.invoke(app, ["quote", str(spec), "--json"], env=env).stdout)["candidates"][0]
    assert first["offering"]["key"] in quoted.stdout and first["expected_cost_usd"] in quoted.stdout
    q = json.loads(runner.invoke(app, ["quote", str(spec), "--json"], env=env).stdout)
    assert q["candidates"]
    pools = json.loads(runner.invoke(app, ["pools", "--accelerator", "V100", "--json"], env=env).stdout)
    assert pools and {p["accelerator"] for p in pools} == {"V100"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(job_body(gpu_count=-1)))
    failed = runner.invoke(app, ["submit", str(bad)], env=env)
    assert failed.exit_code == 2 and "gpu_count" in failed.output  # the caller's to fix
    raised = runner.invoke(
        app, ["update", job["id"], "--max-total-usd", "75", "--max-hourly-usd", "none", "--json"], env=env
    )
    assert raised.exit_code == 0, raised.output
    assert json.loads(raised.stdout)["max_total_usd"] == "75"
    refused = runner.invoke(app, ["update", job["id"], "--deadline", "2020-01-01T00:00:00Z"], env=env)
    assert refused.exit_code == 2 and "deadline" in refused.output
    cancelled = runner.invoke(app, ["cancel", job["id"], "--json"], env=env)
    assert cancelled.exit_code == 0 and json.loads(cancelled.stdout)["state"] == "cancelled"


def test_cli_reports_unreachable_broker(tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_body()))
    out = runner.invoke(app, ["submit", str(spec)], env={"OVERSPILL_URL": "http://127.0.0.1:9"})
    assert out.exit_code == 1 and "cannot reach the broker" in out.output


def test_keys_create_and_tick(tmp_path: Path) -> None:
    env = {"OVERSPILL_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    made = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--role", "finance", "--json"], env=env)
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["key"].startswith("ovs_")
    bad = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--role", "root"], env=env)
    assert bad.exit_code != 0
    ticked = runner.invoke(app, ["tick", "--json"], env=env)
    assert ticked.exit_code == 0, ticked.output
    steps = {s["step"]: s for s in json.loads(ticked.stdout)}
    assert steps["refresh_prices"]["count"] > 0 and not any(s["error"] for s in steps.values())


@pytest.mark.slow(30)
def test_demo_runs_and_reports_savings(tmp_path: Path) -> None:
    out = runner.invoke(app, ["demo", "--jobs", "6", "--hours", "24", "--json", "--throwaway"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert len(result["jobs"]) == 6
    assert all(j["state"] == "succeeded" for j in result["jobs"])
    for j in result["jobs"]:
        assert float(j["spent_usd"]) <= float(j["ceiling_usd"])
        assert j["where"]
    assert float(result["saving_usd"]) > 0
    assert result["database"] == ""  # nothing kept


@pytest.mark.slow(30)
def test_demo_keeps_its_history_in_the_configured_database(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from sqlmodel import Session, create_engine, select

    from broker.store.tables import Job

    env = {"OVERSPILL_DATA_DIR": str(tmp_path / "data")}
    out = runner.invoke(app, ["demo", "--jobs", "3", "--hours", "24"], env=env)
    assert out.exit_code == 0, out.output
    db = tmp_path / "data" / "overspill.db"
    assert f"database: {db}" in out.stderr
    assert "simulating" in out.stdout and "Traceback" not in out.output
    assert "WARNING" not in out.output  # log records go to demo.log, the progress line stays readable
    assert (tmp_path / "data" / "demo.log").exists()
    with Session(create_engine(f"sqlite:///{db}")) as session:
        jobs = session.exec(select(Job)).all()
    assert len(jobs) == 3 and {j.tenant for j in jobs} == {"demo"}  # the development key's tenant: the console
    assert all(j.state == "succeeded" and j.updated_at.replace(tzinfo=UTC) < datetime.now(UTC) for j in jobs)
    again = runner.invoke(app, ["demo", "--jobs", "3"], env=env)
    assert again.exit_code == 2 and "already holds jobs" in again.stderr
    [error] = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert str(db) in error and "Traceback" not in again.output


def test_prices_import_catalog(tmp_path: Path) -> None:
    catalog = tmp_path / "aws_vms.csv"
    catalog.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"
        "p4d.24xlarge,A100,8,96,1152,32.7726,12.1,us-east-1,us-east-1a\n"
        "g5.xlarge,A10G,1,4,16,1.006,,us-east-1,us-east-1b\n"
    )
    env = {"OVERSPILL_DATABASE_URL": f"sqlite:///{tmp_path / 'cat.db'}", "OVERSPILL_SIMULATED": "false"}
    out = runner.invoke(app, ["prices", "import-catalog", str(catalog), "--json"], env=env)
    assert out.exit_code == 0, out.output
    [summary] = json.loads(out.stdout)
    assert summary["offerings"] == 3 and summary["price_changes"] == 3 and summary["feed"] == "catalog:aws_vms.csv"
    again = json.loads(runner.invoke(app, ["prices", "import-catalog", str(catalog), "--json"], env=env).stdout)
    assert again[0]["price_changes"] == 0
    # a second file listing one of those pools at the same price (a subset catalog): moving a pool between feeds
    # is not a price change, and re-importing both files in turn records none
    subset = tmp_path / "aws_gpu.csv"
    subset.write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"
        "p4d.24xlarge,A100,8,96,1152,32.7726,12.1,us-east-1,us-east-1a\n"
    )
    for _ in range(2):
        for path in (subset, catalog):
            moved = json.loads(runner.invoke(app, ["prices", "import-catalog", str(path), "--json"], env=env).stdout)
            assert moved[0]["price_changes"] == 0, moved
    dearer = tmp_path / "aws_gpu_dearer.csv"
    dearer.write_text(subset.read_text().replace(",12.1,", ",12.5,"))
    changed = json.loads(runner.invoke(app, ["prices", "import-catalog", str(dearer), "--json"], env=env).stdout)
    assert changed[0]["price_changes"] == 1  # a real change in a moved pool is still recorded
    broken = tmp_path / "aws_broken.csv"
    broken.write_text("InstanceType,Price\np4d.24xlarge,abc\n")
    failed = runner.invoke(app, ["prices", "import-catalog", str(broken)], env=env)
    assert failed.exit_code == 1 and "aws_broken.csv" in failed.output


@pytest.mark.integration
@pytest.mark.slow(30)
def test_simulate_replays_real_traces(tmp_path: Path) -> None:
    from tests.data import shared_file

    data = shared_file("spot-probes-skynomad").parent
    out = runner.invoke(app, ["simulate", "--data", str(data), "--suite", "deadline", "--quick", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    text = json.dumps(report)
    for policy in ("on_demand", "eager_next_region", "uniform_progress", "overspill", "optimum"):
        assert policy in text
    for rows in report["deadline"]["scenarios"].values():  # --quick leaves the slow research policies out
        assert "forecast" not in {row["policy"] for row in rows} and "overspill" in {row["policy"] for row in rows}
    bad = runner.invoke(app, ["simulate", "--data", str(tmp_path / "nowhere")])
    assert bad.exit_code != 0


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("job.json", '{"name": "x",\n  "gpu_count": }', "invalid JSON at line 2, column 16"),
        ("job.yaml", "name: x\ncommand: [python\nteam: y\n", "invalid YAML at line"),
        ("job.yml", "- a list\n- not a spec\n", "must hold one job spec"),
        ("job.yaml", "a: &x [1]\nb: *x\n", "aliases"),
    ],
)
def test_a_malformed_job_file_is_one_line_naming_the_file_exit_2(
    tmp_path: Path, name: str, content: str, says: str
) -> None:
    spec = tmp_path / name
    spec.write_text(content)
    for command in (["submit", str(spec)], ["quote", str(spec)]):
        out = runner.invoke(app, command, env={"OVERSPILL_URL": "http://127.0.0.1:9", "COLUMNS": "300"})
        assert out.exit_code == 2, out.output
        [line] = out.stderr.strip().splitlines()
        assert line.startswith(f"error: {spec}:") and says in line, line
    missing = runner.invoke(app, ["submit", str(tmp_path / "nope.yaml")], env={"COLUMNS": "300"})
    assert missing.exit_code == 2 and missing.stderr.startswith(f"error: cannot read {tmp_path / 'nope.yaml'}")


def test_tables_keep_ids_and_money_whole_and_drop_optional_columns_when_narrow() -> None:
    import io

    from rich.console import Console

    from broker.cli.output import Column, print_table

    columns = [Column("id", "id"), Column("note", "text", drop=2), Column("spent", "money"), Column("x", drop=1)]
    row = ["job_18e3f0c2a4b64e4f9a1d2c3b4a5f6e7d", "waiting for spot capacity in us-east-1", "$12345.67", "extra"]
    for width in (200, 60, 30):
        out = io.StringIO()
        print_table(Console(file=out, width=width), columns, [row])
        text = out.getvalue()
        assert row[0] in text and row[2] in text, text  # on one line each, never cut or folded
        assert "…" not in text
        assert ("too narrow for" in text) == (width < 80), text
    out = io.StringIO()
    print_table(Console(file=out, width=60), columns, [row])
    assert "too narrow for: note;" in out.getvalue() and "extra" in out.getvalue()  # the highest `drop` goes first


def test_database_commands_say_which_database_and_never_create_one_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OVERSPILL_DATA_DIR", "OVERSPILL_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for command in (
        ["keys", "create", "--tenant", "acme"],
        ["report", "run", "--period", "2026-10"],
        ["tick"],
        ["prices", "refresh"],
    ):
        out = runner.invoke(app, command, env={"COLUMNS": "300"})
        assert out.exit_code == 2, (command, out.output)
        assert f"no broker database at {elsewhere / '.overspill' / 'overspill.db'}" in out.stderr
        assert "OVERSPILL_DATA_DIR" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (elsewhere / ".overspill").exists()
    env = {"OVERSPILL_DATA_DIR": str(tmp_path / "data"), "OVERSPILL_SIMULATED": "false", "COLUMNS": "300"}
    made = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--json"], env=env)
    assert made.exit_code == 0, made.output
    assert f"database: {tmp_path / 'data' / 'overspill.db'}" in made.stderr
    assert json.loads(made.stdout)["tenant"] == "acme"
    unknown = runner.invoke(app, ["report", "run", "--period", "2026-10", "--tenant", "acmee"], env=env)
    assert unknown.exit_code == 2 and "unknown tenant 'acmee'" in unknown.stderr and "acme" in unknown.stderr
    report = runner.invoke(
        app, ["report", "run", "--period", "2026-10", "--tenant", "acme", "--out", str(tmp_path)], env=env
    )
    assert report.exit_code == 0, report.output
    bad_role = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--role", "root"], env=env)
    assert bad_role.exit_code == 2 and bad_role.stderr.startswith("error: --role:")


def test_simulate_says_where_its_traces_come_from_and_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "skypilot_v8_aws_vms_pfamily_gpu_subset.csv").write_text("InstanceType\n")
    monkeypatch.setenv("OVERSPILL_SHARED_DATA", str(tmp_path))
    out = runner.invoke(app, ["simulate", "--suite", "deadline"], env={"COLUMNS": "300"})
    assert out.exit_code == 2
    assert f"traces folder {tmp_path} (from OVERSPILL_SHARED_DATA) lacks spot-probes-skynomad/" in out.stderr
    assert "philly" not in out.stderr  # the deadline suite does not need the job trace
    nowhere = runner.invoke(app, ["simulate", "--data", str(tmp_path / "nowhere")], env={"COLUMNS": "300"})
    assert nowhere.exit_code == 2 and "(from --data) does not exist" in nowhere.stderr
