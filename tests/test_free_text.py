"""One "no control characters" rule on every free-text field of the API (issue 32, Low), on SQLite and PostgreSQL:
a NUL, tab, newline, DEL, C1 control or line separator in a job's, schedule's or key's name, a correction's note, a
schedule's cron or time zone is a 422 naming the field (a NUL gave a plain-text 500 on PostgreSQL and was stored on
SQLite), and nothing is stored. A `checkpoint_uri` is checked as sent: control characters or surrounding whitespace
(which URI parsing strips before the check) are refused instead of stored raw. A command argument may hold tabs
and newlines (argv does), never a NUL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from broker.store.tables import ApiKey, Job
from tests.builders import agent_store, job_body

CONTROLS = ["\x00", "\t", "\n", "\r", "\x1b", "\x7f", "\x85", "\u2028"]


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    return agent_store(tmp_path, ("aws/us-east-1",))["aws/us-east-1"]


@pytest.fixture
def api(db_url: str, make_runtime: Callable[..., Runtime], store_uri: str) -> Iterator[tuple[TestClient, Runtime]]:
    rt = make_runtime(db_url, checkpoint_stores={"aws/us-east-1": store_uri})
    with TestClient(create_app(runtime=rt)) as c:
        c.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
        yield c, rt


def refused(resp: object, field: str) -> None:
    assert resp.status_code == 422, resp.text  # type: ignore[attr-defined]
    errors = resp.json()["errors"]  # type: ignore[attr-defined]
    assert [e["field"] for e in errors] == [field], errors
    assert any(word in errors[0]["message"] for word in ("control characters", "NUL", "whitespace"))


@pytest.mark.parametrize("bad", CONTROLS)
def test_control_characters_in_names_are_refused_naming_the_field(api: tuple[TestClient, Runtime], bad: str) -> None:
    c, rt = api
    refused(c.post("/v1/jobs", json=job_body(name=f"train{bad}x")), "name")
    refused(c.post("/v1/keys", json={"role": "submitter", "name": f"ci{bad}"}), "name")
    schedule = {"name": f"monthly{bad}", "cron": "0 6 1 * *"}
    refused(c.post("/v1/report-schedules", json=schedule), "name")
    refused(c.post("/v1/report-schedules", json={"name": "m", "cron": f"0 6 1 * *{bad}"}), "cron")
    refused(
        c.post("/v1/report-schedules", json={"name": "m", "cron": "0 6 1 * *", "timezone": f"UTC{bad}"}), "timezone"
    )
    refused(c.post("/v1/costs/corrections", json={"entry_id": 1, "usd": "1", "note": f"fix{bad}"}), "note")
    with Session(rt.engine) as s:
        assert s.exec(select(Job)).all() == []
        assert [k.name for k in s.exec(select(ApiKey)).all()] == ["bootstrap admin"]


@pytest.mark.parametrize("bad", ["\x00s3://x", " {}", "{}\t", "{}\n", "{}\r", "\x00{}", "{}a\tb/", "{}ck\npt/"])
def test_a_checkpoint_uri_is_checked_as_sent_not_as_cleaned(
    api: tuple[TestClient, Runtime], store_uri: str, bad: str
) -> None:
    c, rt = api
    uri = bad.format(f"{store_uri}tenants/demo/ckpt/")
    refused(c.post("/v1/jobs", json=job_body(checkpoint_uri=uri)), "checkpoint_uri")
    ok = c.post("/v1/jobs", json=job_body(checkpoint_uri=f"{store_uri}tenants/demo/ckpt/"))
    assert ok.status_code in (201, 202), ok.text
    with Session(rt.engine) as s:
        assert [j.checkpoint_uri for j in s.exec(select(Job)).all()] == [f"{store_uri}tenants/demo/ckpt/"]


def test_command_arguments_may_hold_tabs_and_newlines_never_nul(api: tuple[TestClient, Runtime]) -> None:
    c, _ = api
    ok = c.post("/v1/jobs", json=job_body(command=["python", "-c", "import sys\n\tprint(1)"]))
    assert ok.status_code in (201, 202), ok.text
    refused(c.post("/v1/jobs", json=job_body(command=["python", "a\x00b"])), "command.1")
