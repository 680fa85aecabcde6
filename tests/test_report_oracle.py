"""The agent's report callback (`POST /v1/placements/{id}/reports`) is no existence oracle (issue 32, Low): until a
report's signature is verified, a known and an unknown placement get the same answer, byte for byte, on SQLite and
PostgreSQL. Only a correctly signed report (which only the placement's instance can make) learns more.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from agent import protocol as proto
from broker.api.auth import callback_token
from broker.runtime import Runtime
from tests.builders import job_body, running_placement
from tests.conftest import MovableClock

KNOWN = "plc_known0000001"
UNKNOWN = "plc_unknown00001"


@pytest.fixture
def known(client: TestClient, rt: Runtime, clock: MovableClock) -> str:
    job = client.post("/v1/jobs", json=job_body())
    assert job.status_code in (201, 202), job.text
    with Session(rt.engine) as s:
        s.add(running_placement(KNOWN, job.json()["id"], "demo", clock()))
        s.commit()
    return KNOWN


def forged(placement_id: str, how: str, rt: Runtime) -> dict[str, object]:
    report = proto.Report(placement_id, 7, proto.ReportKind.PROGRESS, "2026-11-02T08:00:00+00:00")
    if how == "unsigned":
        body = report
    elif how == "wrong key":
        body = report.signed("00" * 32)
    elif how == "another placement's key":
        body = report.signed(callback_token(rt.settings, "plc_someoneelse01"))
    else:  # names another placement than the path's, signed for that one
        body = proto.Report("plc_someoneelse01", 7, proto.ReportKind.PROGRESS, report.at).signed(
            callback_token(rt.settings, "plc_someoneelse01")
        )
    return dict(json.loads(body.to_json()))


@pytest.mark.parametrize("how", ["unsigned", "wrong key", "another placement's key", "names another placement"])
def test_known_and_unknown_placements_get_the_same_answer_until_the_signature_is_verified(
    client: TestClient, rt: Runtime, known: str, how: str
) -> None:
    answers = []
    for pid in (known, UNKNOWN):
        resp = client.post(f"/v1/placements/{pid}/reports", json=forged(pid, how, rt), headers={"Authorization": ""})
        answers.append((resp.status_code, resp.text.replace(pid, "<id>")))
    assert answers[0] == answers[1], answers
    assert answers[0][0] == 403


def test_a_verified_report_learns_whether_its_placement_exists(client: TestClient, rt: Runtime, known: str) -> None:
    for pid, status in ((known, 200), (UNKNOWN, 404)):
        report = proto.Report(pid, 7, proto.ReportKind.HEARTBEAT, "2026-11-02T08:00:00+00:00")
        body = json.loads(report.signed(callback_token(rt.settings, pid)).to_json())
        assert client.post(f"/v1/placements/{pid}/reports", json=body).status_code == status
