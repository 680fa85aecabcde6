"""Structured logs: JSON lines with request, job, placement, provider and offering; request ids from the HTTP
header into the control loop; secrets never written."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.app import create_app
from broker.config.settings import DEV_API_KEY, Settings
from broker.loop.tick import tick
from broker.observe.logging_setup import (
    JsonFormatter,
    TextFormatter,
    bind,
    configure_logging,
    current_context,
    log_context,
    log_scope,
)
from broker.runtime import Runtime
from tests.builders import job_body
from tests.conftest import MovableClock

REQ_ID = re.compile(r"^req-[0-9a-f]{32}$")


@pytest.fixture
def captured() -> Iterator[Callable[[Settings], io.StringIO]]:
    """Install the broker's handler on a string buffer; restore the root logger afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)

    def install(settings: Settings) -> io.StringIO:
        buffer = io.StringIO()
        configure_logging(settings, stream=buffer)
        return buffer

    yield install
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def records(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_request_id_is_returned_and_a_sane_client_id_kept(client: TestClient) -> None:
    fresh = client.get("/healthz")
    assert REQ_ID.match(fresh.headers["X-Request-ID"])
    assert client.get("/healthz").headers["X-Request-ID"] != fresh.headers["X-Request-ID"]
    assert client.get("/healthz", headers={"X-Request-ID": "trace-42.a:b"}).headers["X-Request-ID"] == "trace-42.a:b"
    for bad in ("x" * 129, "has space", 'quote"d', "tab\tx"):
        assert REQ_ID.match(client.get("/healthz", headers={"X-Request-ID": bad}).headers["X-Request-ID"])
    too_big = client.post("/v1/jobs", content=b"x" * 2_000_000, headers={"Content-Type": "application/json"})
    assert too_big.status_code == 413 and REQ_ID.match(too_big.headers["X-Request-ID"])
    assert REQ_ID.match(client.get("/v1/jobs/job_missing").headers["X-Request-ID"])  # errors carry it too


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_request_id_is_carried_into_the_tick_with_job_context(
    rt: Runtime, client: TestClient, clock: MovableClock, captured: Callable[[Settings], io.StringIO]
) -> None:
    buffer = captured(rt.settings)
    submitted = client.post("/v1/jobs", json=job_body(), headers={"X-Request-ID": "trace-submit-1"})
    assert submitted.status_code == 202 and submitted.headers["X-Request-ID"] == "trace-submit-1"
    job_id = submitted.json()["id"]
    tick(rt, clock())
    clock.advance(hours=3)
    tick(rt, clock())

    lines = records(buffer)
    access = [r for r in lines if r["logger"] == "broker.access" and r.get("request_id") == "trace-submit-1"]
    assert access and access[0]["method"] == "POST" and access[0]["path"] == "/v1/jobs" and access[0]["status"] == 202
    about_job = [r for r in lines if r.get("job_id") == job_id]
    messages = {r["message"] for r in about_job}
    assert {"job placed", "instance launched"} <= messages, messages
    placed = next(r for r in about_job if r["message"] == "job placed")
    job = client.get(f"/v1/jobs/{job_id}").json()
    for r in about_job:
        assert r["request_id"] == "trace-submit-1"  # the submitting request, carried into every tick record
        assert r["tick_id"].startswith("tick-")
        assert r["level"] in ("info", "warning", "error", "debug") and r["ts"].endswith("Z")
    launched = next(r for r in about_job if r["message"] == "instance launched")
    assert launched["placement_id"] == placed["placement_id"]
    assert launched["provider"] == placed["provider"] and launched["offering"] == placed["offering"]
    assert job["state"] in ("running", "succeeded")
    ended = [r for r in about_job if r["message"].startswith("placement ")]
    if job["state"] == "succeeded":
        assert ended and ended[-1]["job_state"] == "succeeded" and ended[-1]["offering"] == placed["offering"]
    ticks = {r["tick_id"] for r in lines if "tick_id" in r}
    assert len(ticks) >= 2  # one id per tick round


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_no_secret_reaches_the_log_even_at_debug(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, captured: Callable[[Settings], io.StringIO]
) -> None:
    rt = make_runtime(
        db_url, log_level="debug", metrics_token="metrics-token-secret-99", callback_secret="cb-secret-77"
    )
    buffer = captured(rt.settings)
    with TestClient(create_app(runtime=rt)) as c:
        made = c.post(
            "/v1/keys", json={"role": "submitter", "name": "ci"}, headers={"Authorization": f"Bearer {DEV_API_KEY}"}
        )
        new_key = made.json()["key"]
        c.post("/v1/jobs", json=job_body(), headers={"Authorization": f"Bearer {new_key}"})
        c.get("/v1/jobs", headers={"X-API-Key": new_key})
        c.get("/v1/jobs", headers={"Authorization": "Bearer ovs_deadbeef_wrong-secret-value-123456"})
        c.get("/metrics", headers={"Authorization": "Bearer metrics-token-secret-99"})
        tick(rt, clock())
    logging.getLogger("test").warning(
        "a careless caller logs %s and headers %s",
        new_key,
        {"Authorization": f"Bearer {DEV_API_KEY}", "x-api-key": new_key},
    )
    try:
        raise RuntimeError(f"connect failed with secret cb-secret-77 and key {DEV_API_KEY}")
    except RuntimeError:
        logging.getLogger("test").exception("failure")
    out = buffer.getvalue()
    assert "a careless caller" in out and "failure" in out and len(out.splitlines()) > 10
    for secret in (
        new_key,
        new_key.split("_", 2)[2],
        DEV_API_KEY,
        "local-development-only",
        "wrong-secret-value-123456",
        "metrics-token-secret-99",
        "cb-secret-77",
    ):
        assert secret not in out, f"{secret!r} leaked into the log"
    assert f"ovs_{new_key.split('_')[1]}_***" in out  # the key id stays, so the record is still useful
    for line in out.splitlines():
        json.loads(line)  # every line is one JSON object, exceptions included


def test_formatters_redact_and_carry_context() -> None:
    record = logging.makeLogRecord(
        {"name": "x", "levelno": logging.INFO, "levelname": "INFO", "msg": "key %s", "args": ("ovs_ab12_" + "s" * 30,)}
    )
    with log_context(job_id="job_1", provider="sim-aws", placement_id=None):
        data = json.loads(JsonFormatter(["topsecret-value"]).format(record))
        text = TextFormatter().format(record)
        assert current_context() == {"job_id": "job_1", "provider": "sim-aws"}
    assert current_context() == {}
    assert data["message"] == "key ovs_ab12_***" and data["job_id"] == "job_1" and data["provider"] == "sim-aws"
    assert "placement_id" not in data
    assert "ovs_ab12_***" in text and "job_id=job_1" in text and "s" * 30 not in text
    literal = logging.makeLogRecord({"msg": "password is topsecret-value", "levelname": "INFO"})
    assert "topsecret-value" not in JsonFormatter(["topsecret-value"]).format(literal)
    with pytest.raises(ValueError, match="unknown log context field"), log_context(secret="x"):
        pass
    with log_context(request_id="outer"), log_scope():
        bind(job_id="job_2", request_id="inner")
        assert current_context() == {"job_id": "job_2", "request_id": "inner"}
        bind(job_id=None)
        assert current_context() == {"request_id": "inner"}
    assert current_context() == {}  # the scope undid the binds, the context block its own field


def test_text_format_is_selectable(captured: Callable[[Settings], io.StringIO], tmp_path: Any) -> None:
    buffer = captured(Settings(data_dir=tmp_path, log_format="text", log_level="info"))
    with log_context(request_id="req-1"):
        logging.getLogger("broker.test").info("hello %s", "world")
    line = buffer.getvalue().strip()
    assert line.endswith("INFO broker.test hello world request_id=req-1"), line


def test_logs_are_text_on_a_terminal_and_json_otherwise_unless_the_setting_says(tmp_path: Any) -> None:
    import os

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    master, slave = os.openpty()  # a real terminal device
    try:
        with open(slave, "w", closefd=True) as tty:
            for setting, stream, expect in (
                ("auto", tty, "text"),
                ("auto", io.StringIO(), "json"),  # a pipe or a file: JSON lines for a collector
                ("json", tty, "json"),
                ("text", io.StringIO(), "text"),
            ):
                handler = configure_logging(Settings(data_dir=tmp_path, log_format=setting), stream=stream)
                record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "t"})
                line = handler.format(record)
                assert line.startswith("{") == (expect == "json"), (setting, line)
        assert Settings(data_dir=tmp_path).log_format == "auto"
    finally:
        os.close(master)
        root.handlers, root.level = handlers, level


def test_the_root_address_redirects_to_the_console(client: TestClient) -> None:
    resp = client.get("/", follow_redirects=False)
    assert resp.status_code == 307 and resp.headers["location"] == "/console/"
    assert client.get("/").text.lstrip().lower().startswith("<!doctype html")
    assert "/" not in client.get("/openapi.json").json()["paths"]
