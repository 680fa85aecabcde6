"""An SDK user's path: a client generated from the served OpenAPI document by openapi-python-client (the tool runs in
its own virtualenv, .ci/openapi-client-venv, which .ci/run installs) quotes, submits, watches and cancels a job,
reads costs, and downloads a report in every format, against the broker served over HTTP by uvicorn. Its
authentication comes from the document's security scheme (the generated `AuthenticatedClient`), not from hand-set
headers, and its errors parse as problem details."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from tests.builders import job_body
from tests.served_api import served as serve

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]
PACKAGE = "overspill_generated_client"


def generator() -> str:
    found = os.environ.get("OVERSPILL_OPENAPI_CLIENT_GEN") or str(
        REPO / ".ci/openapi-client-venv/bin/openapi-python-client"
    )
    if not Path(found).is_file():
        pytest.skip("openapi-python-client not found: run .ci/run, or set OVERSPILL_OPENAPI_CLIENT_GEN")
    return found


@pytest.fixture
def served(tmp_path: Path, make_runtime: Any, clock: Any) -> Iterator[tuple[str, Runtime]]:
    rt = make_runtime(f"sqlite:///{tmp_path / 'sdk.db'}")
    tick(rt, clock())
    with serve(create_app(runtime=rt)) as url:
        yield url, rt


@pytest.fixture
def sdk(served: tuple[str, Runtime], tmp_path: Path) -> Any:
    """The generated package, built from the document the running broker serves."""
    url, _ = served
    spec = tmp_path / "openapi.json"
    # the first request builds the document, which on a loaded machine takes longer than httpx's 5 s default
    spec.write_text(json.dumps(httpx.get(f"{url}/openapi.json", timeout=120).json()))
    out = tmp_path / "generated"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"package_name_override": PACKAGE, "project_name_override": PACKAGE}))
    run = subprocess.run(
        [generator(), "generate", "--path", str(spec), "--output-path", str(out), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        # its post-generation hooks run `ruff` (a dev dependency: beside this interpreter, whatever PATH says)
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stdout + run.stderr, run.stdout + run.stderr  # every operation was generated
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))


def api(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.api.{name}")


def model(name: str) -> Any:
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def test_a_generated_client_quotes_submits_watches_cancels_and_downloads_every_report(
    sdk: Any, served: tuple[str, Runtime], clock: Any
) -> None:
    url, rt = served
    client = sdk.AuthenticatedClient(base_url=url, token=DEV_API_KEY)
    JobCreate = model("JobCreate")

    quote = api("catalog.quotes_create").sync(client=client, body=JobCreate.from_dict(job_body()))
    assert isinstance(quote, model("QuoteResponse")) and quote.feasible and quote.candidates

    submitted = api("jobs.jobs_submit").sync_detailed(
        client=client, body=JobCreate.from_dict(job_body(name="from-the-sdk")), idempotency_key="sdk-1"
    )
    assert submitted.status_code == 202
    job = submitted.parsed
    assert isinstance(job, model("JobPublic")) and job.name == "from-the-sdk" and job.state == "pending"
    assert job.created_at.tzinfo is not None  # `Z` parsed as UTC

    tick(rt, clock.advance(minutes=1))
    watched = api("jobs.jobs_get").sync(job.id, client=client)
    assert watched.id == job.id and watched.state != "pending", watched.state
    events = api("jobs.jobs_events").sync(job.id, client=client)
    assert [e.kind for e in events.items][:1] == ["submitted"], events

    cancelled = api("jobs.jobs_cancel").sync(job.id, client=client)
    assert cancelled.state == "cancelled"

    listed = api("jobs.jobs_list").sync(client=client)
    assert job.id in [j.id for j in listed.items]
    summary = api("costs.costs_summary").sync(client=client, group_by="team")
    assert isinstance(summary, model("CostSummary")) and summary.currency == "USD"

    RunCreate = model("RunCreate")
    period = f"{clock():%Y-%m}"
    starts = {"csv": b"", "focus": b"", "html": b"<!", "pdf": b"%PDF"}
    for fmt, start in starts.items():
        run = api("reports.report_runs_create").sync(
            client=client, body=RunCreate.from_dict({"period": period, "format": fmt})
        )
        assert run.state == "succeeded", (fmt, run.state, run.error)
        downloaded = api("reports.report_runs_download").sync_detailed(run.id, client=client)
        assert downloaded.status_code == 200, fmt
        content = downloaded.parsed.payload.read()
        assert content.startswith(start) and len(content) == run.size_bytes, (fmt, content[:40])
        expected = {"csv": "text/csv", "focus": "text/csv", "html": "text/html", "pdf": "application/pdf"}[fmt]
        assert downloaded.headers["content-type"].split(";")[0] == expected
        if fmt in ("csv", "focus"):
            assert b"," in content.splitlines()[0]


def test_generated_errors_are_problem_details_and_a_client_without_a_key_gets_401(
    sdk: Any, served: tuple[str, Runtime]
) -> None:
    url, _ = served
    client = sdk.AuthenticatedClient(base_url=url, token=DEV_API_KEY)
    missing = api("jobs.jobs_get").sync_detailed("job_nope", client=client)
    assert missing.status_code == 404
    problem = missing.parsed
    assert isinstance(problem, model("Problem")) and problem.status == 404
    assert (problem.errors[0].field, problem.errors[0].location) == ("job", "path")

    anonymous = sdk.Client(base_url=url)
    refused = api("jobs.jobs_list").sync_detailed(client=anonymous)
    assert refused.status_code == 401 and refused.parsed.errors[0].location == "header"
    assert api("health.health_live").sync(client=anonymous).status == "ok"
