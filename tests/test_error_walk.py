"""Every error a newcomer meets first is one line that names the thing to fix (issue 31): each case is run the way a
user meets it, the CLI as a real process, the API over its HTTP interface.

- a bad `OVERSPILL_*` setting names the variable and the parse error (no traceback);
- `OVERSPILL_URL` (or `--url`) without a scheme is refused with the expected form;
- `overspill serve` on a port in use says so in one line and prints no banner and no development key;
- a body that is not JSON names the line and column where it breaks (not the character offset as a field);
- an unknown accelerator is named with the nearest known names, on submit and on quote.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from overspill.defaults import DEV_API_KEY
from tests.builders import job_body

CLI = [sys.executable, "-c", "from broker.cli.main import main; main()"]


def overspill(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**clean, "COLUMNS": "80", "OVERSPILL_DATA_DIR": str(tmp_path / "data"), **env},
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed as a usage error: exit 2, one line on stderr, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OVERSPILL_ONPREM_GPUS", '{"A100": "x"}', "A100: Input should be a valid integer"),
        ("OVERSPILL_ONPREM_GPUS", "A100=32", "not valid JSON: Expecting value: line 1 column 1"),
        ("OVERSPILL_PORT", "abc", "Input should be a valid integer"),
        ("OVERSPILL_ENV", "prod", "Input should be 'development' or 'production'"),
    ],
)
def test_bad_setting_names_the_variable(variable: str, value: str, says: str, tmp_path: Path) -> None:
    for command in (["serve"], ["demo", "--jobs", "1"]):
        line = one_line(overspill(command, tmp_path, **{variable: value}))
        assert line.startswith(f"error: {variable}: ") and says in line, line


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000", "broker.internal"])
def test_url_without_scheme_is_refused_with_the_expected_form(url: str, tmp_path: Path) -> None:
    line = one_line(overspill(["jobs"], tmp_path, OVERSPILL_URL=url))
    assert f"OVERSPILL_URL: '{url}' has no scheme (did you mean http://{url}?)" in line
    assert "expected http://HOST[:PORT]" in line
    line = one_line(overspill(["jobs", "--url", url], tmp_path))
    assert line.startswith(f"error: --url: '{url}' has no scheme")


def test_serve_on_a_port_in_use_is_one_line_without_banner_or_key(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = overspill(["serve", "--port", str(port)], tmp_path)
    line = one_line(done)
    assert f"127.0.0.1:{port} is already in use" in line and "--port or OVERSPILL_PORT" in line
    assert done.stdout == "" and DEV_API_KEY not in done.stderr  # nothing claimed the broker was up
    assert not (tmp_path / "data").exists()  # refused before anything was built


def test_invalid_json_body_names_line_and_column(client: TestClient) -> None:
    body = '{\n  "name": "x",\n  "gpu_count": 1,\n}'
    resp = client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422
    problem = resp.json()
    expected = "invalid JSON at line 4, column 1: Expecting property name enclosed in double quotes"
    assert problem["detail"] == f"body: {expected}"
    assert problem["errors"] == [{"field": "body", "location": "body", "message": expected, "type": "json_invalid"}]


def test_unknown_accelerator_is_named_with_the_nearest_known(client: TestClient) -> None:
    for path in ("/v1/jobs", "/v1/quotes"):
        resp = client.post(path, json=job_body(accelerators=["A10O"]))
        assert resp.status_code == 422, resp.text
        problem = resp.json()
        assert problem["detail"].startswith("accelerators: unknown accelerator A10O; known: A100, A10, "), problem
        assert problem["errors"][0]["field"] == "accelerators"
    # a known name passes this check (and is ranked or queued as before)
    assert client.post("/v1/quotes", json=job_body(accelerators=["a100"])).status_code == 200


HTTP_COMMANDS = [
    ["jobs"],
    ["pools"],
    ["cancel", "job_x"],
    ["notice", "job_x"],
    ["events", "job_x"],
    ["logs", "job_x"],
    ["update", "job_x", "--priority", "1"],
]


@pytest.mark.parametrize("command", HTTP_COMMANDS, ids=lambda c: c[0])
def test_every_http_command_says_in_one_line_that_the_broker_cannot_be_reached(
    command: list[str], tmp_path: Path
) -> None:
    """Each HTTP command, run against a port where no broker listens, reaches the client and fails in one line
    naming the broker's address: a command whose code path is broken (a name it cannot resolve, an import it
    forgot) fails here with a traceback instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    done = overspill([*command, "--url", f"http://127.0.0.1:{port}", "--api-key", DEV_API_KEY], tmp_path)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], done.stderr
