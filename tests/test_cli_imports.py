"""The CLI stays fast by importing nothing it does not need: `overspill --help` and the commands that speak HTTP load
no database or table module (SQLModel, SQLAlchemy, `broker.store`), no web framework (FastAPI) and not the broker's
settings. Each case runs the real entry point in a fresh interpreter and reads `sys.modules` after it ran.
(benchmarks/cli_bench.py measures the time; this test holds the cause.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.app import create_app
from broker.runtime import Runtime
from tests.served_api import served

HEAVY_ROOTS = ("sqlmodel", "sqlalchemy", "fastapi", "starlette", "alembic", "pydantic_settings")
HEAVY_MODULES = ("broker.store", "broker.config.settings", "broker.runtime", "broker.app")

RUN = """
import json, sys
args, out = json.loads(sys.argv[1]), sys.argv[2]
sys.argv = ["overspill", *args]
from broker.cli.main import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def loaded_by(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    """(exit code, modules imported, stdout) of `overspill ARGS` run in a fresh interpreter."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(args), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
    )
    assert out.exists(), done.stderr
    answer = json.loads(out.read_text())
    return answer["code"], answer["modules"], done.stdout + done.stderr


def heavy(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] in HEAVY_ROOTS or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
    ]


@pytest.mark.parametrize("args", [["--help"], ["jobs", "--help"], ["costs", "--help"], ["report", "--help"]])
def test_help_imports_no_database_or_web_module(args: list[str], tmp_path: Path) -> None:
    code, modules, output = loaded_by(args, tmp_path)
    assert code == 0 and "Usage" in output
    assert heavy(modules) == []
    assert "httpx" not in modules  # --help speaks no HTTP


def test_http_commands_import_no_database_or_web_module(rt: Runtime, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: t\nimage: ghcr.io/acme/train:1\naccelerators: [A100]\ngpu_count: 1\n"
        "work_gpu_hours: '1'\nmax_total_usd: '20'\n"
    )
    with served(create_app(runtime=rt)) as url:
        env = {"OVERSPILL_URL": url}
        for args in (["jobs"], ["pools", "--limit", "3"], ["quote", str(spec)], ["submit", str(spec), "--json"]):
            code, modules, output = loaded_by(args, tmp_path, env)
            assert code == 0, output
            assert "httpx" in modules  # it did speak HTTP
            assert heavy(modules) == [], args
        code, modules, output = loaded_by(["jobs", "--json"], tmp_path, env)
        assert code == 0 and len(json.loads(output)["items"]) == 1  # the job the CLI submitted
        assert heavy(modules) == []


def test_database_commands_load_the_store_when_they_run(tmp_path: Path) -> None:
    """The laziness is real: a database command imports the store when (and only when) it runs."""
    code, modules, output = loaded_by(
        ["keys", "create", "--tenant", "demo"], tmp_path, {"OVERSPILL_DATA_DIR": str(tmp_path / "data")}
    )
    assert code == 0, output
    assert "broker.store.tables" in modules and "sqlalchemy" in modules
