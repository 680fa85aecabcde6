"""`overspill.client.Client`, the public Python client (overspill/client.py): a notebook submits, watches and cancels a
job in three lines against the broker served over HTTP, and every error is an `ApiError` carrying the problem
details (status, detail, each field at fault with its location)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.loop.tick import tick
from broker.runtime import Runtime
from overspill.client import ApiError, Client
from tests.builders import job_body
from tests.served_api import served


@pytest.fixture
def broker(tmp_path: Path, make_runtime: Any, clock: Any) -> Iterator[tuple[str, Runtime]]:
    rt = make_runtime(f"sqlite:///{tmp_path / 'client.db'}")
    tick(rt, clock())
    with served(create_app(runtime=rt)) as url:
        yield url, rt


def test_a_notebook_submits_watches_and_cancels_in_three_lines(broker: tuple[str, Runtime], clock: Any) -> None:
    url, rt = broker
    api = Client(url, api_key=DEV_API_KEY)

    job = api.submit(job_body(name="notebook"))
    tick(rt, clock.advance(minutes=1))  # the broker places it
    watched = api.watch(job["id"], interval=0.05, timeout=0.3)  # still going when the timeout passes
    cancelled = api.cancel(job["id"])

    # placed: its instance is still coming up (starting) or up (running); either way not ended
    assert job["state"] == "pending" and watched["id"] == job["id"] and watched["state"] in ("starting", "running")
    assert cancelled["state"] == "cancelled"
    assert api.watch(job["id"], interval=0.05)["state"] == "cancelled"  # ended: returns at once, no timeout needed
    assert next(e["kind"] for e in api.events(job["id"])) == "submitted"
    assert job["id"] in [j["id"] for j in api.jobs()["items"]]
    assert api.quote(job_body())["feasible"] is True
    api.close()


def test_watch_follows_a_job_until_it_ends_and_reports_each_change(broker: tuple[str, Runtime]) -> None:
    url, _ = broker
    with Client(url, api_key=DEV_API_KEY) as api:
        job = api.submit(job_body(name="watched"))
        changes: list[str] = []
        stop = threading.Timer(0.3, lambda: api.cancel(job["id"]))  # someone else cancels it meanwhile
        stop.start()
        try:
            final = api.watch(job["id"], interval=0.05, timeout=30, on_change=lambda j: changes.append(j["state"]))
        finally:
            stop.cancel()
        assert final["state"] == "cancelled"
        assert changes[0] == "pending" and changes[-1] == "cancelled"


def test_errors_carry_the_problem_details(broker: tuple[str, Runtime]) -> None:
    url, _ = broker
    api = Client(url, api_key=DEV_API_KEY)
    with pytest.raises(ApiError) as refused:
        api.submit(job_body(gpu_count=-1))
    assert refused.value.status == 422 and "gpu_count" in str(refused.value)
    assert refused.value.errors[0]["field"] == "gpu_count" and refused.value.errors[0]["location"] == "body"
    with pytest.raises(ApiError) as missing:
        api.get("job_nope")
    assert missing.value.status == 404 and missing.value.errors[0]["location"] == "path"
    with pytest.raises(ApiError) as anonymous:
        Client(url, api_key="ovs_nobody_" + "x" * 20).jobs()
    assert anonymous.value.status == 401
    with pytest.raises(ApiError) as unreachable:
        Client("http://127.0.0.1:9", api_key=DEV_API_KEY).jobs()
    assert unreachable.value.status == 0 and "cannot reach" in str(unreachable.value)
