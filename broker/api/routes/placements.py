"""/v1/placements/{id}/...: what instances send the broker (no API key: an instance proves itself with its
placement's token).

- `POST /v1/placements/{id}/reports`: the instance agent's signed report (agent/protocol.py `Report`), the callback
  path beside the tenant mailbox; signed with the placement's report key, the same secret as the callback token,
  so the signature proves the sender (an `X-Overspill-Callback-Token` header, when sent, must match too). Taken
  once by (placement, seq) whichever path brings it first (broker.services.agent_reports); answers
  `{"taken": true|false}` (false: already taken). 403 for a bad signature or token, the same for a known and an
  unknown placement (both are checked before the database is asked: no existence oracle); 404 for an unknown
  placement only once the report's signature is verified; 422 naming the field of a report that does not follow
  the contract.
- `POST /v1/placements/{id}/exit`: the older start-up scripts' exit status.
- `POST /v1/placements/{id}/scheduled-events`: an Azure VM's relayed Scheduled Events."""

from __future__ import annotations

import hmac
import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request, Security, status
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session

from broker.api.auth import callback_token
from broker.api.deps import RuntimeDep
from broker.runtime import Runtime
from broker.services.agent_reports import (
    ReportRefused,
    check_report,
    check_signature,
    parse_report,
    take_report,
    wakes_loop,
)
from broker.services.errors import Unprocessable
from broker.services.jobs import add_event
from broker.store.tables import Job, Placement

router = APIRouter(prefix="/v1/placements", tags=["placements"])


CALLBACK_SCHEME = APIKeyHeader(
    name="X-Overspill-Callback-Token",
    scheme_name="CallbackToken",
    description="the per-placement token the instance's start-up script was given (no API key on these routes)",
    auto_error=False,
)
_TOKEN = re.compile(r"[0-9A-Za-z]{1,128}")


async def callback_token_of(request: Request, _: Annotated[Any, Security(CALLBACK_SCHEME)] = None) -> str:
    """The presented callback token: 401 when there is none, 403 when it cannot be one (the token is an
    HMAC-SHA256 in hex, broker.api.auth.callback_token), checked before the body is validated."""
    raw = request.headers.getlist("x-overspill-callback-token")
    if not raw or not raw[0]:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "X-Overspill-Callback-Token: missing: send the placement's callback token",
            headers={"WWW-Authenticate": 'ApiKey header="X-Overspill-Callback-Token"'},
        )
    if len(raw) > 1 or not _TOKEN.fullmatch(raw[0]):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "X-Overspill-Callback-Token: bad token for this placement")
    return raw[0]


CallbackToken = Annotated[str, Depends(callback_token_of)]


def _check_token(rt: Runtime, placement_id: str, token: str) -> None:
    """403 unless `token` is this placement's callback token (compared in constant time, as bytes)."""
    expected = callback_token(rt.settings, placement_id).encode()
    if not hmac.compare_digest(expected, token.encode("utf-8", "surrogateescape")):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "X-Overspill-Callback-Token: bad token for this placement")


async def optional_callback_token(request: Request, _: Annotated[Any, Security(CALLBACK_SCHEME)] = None) -> str | None:
    """The callback token when one is sent (403 when it cannot be one), else None: on the reports route the
    report's signature proves the sender, and a token, when sent, must be the placement's too."""
    raw = request.headers.getlist("x-overspill-callback-token")
    if not raw:
        return None
    if len(raw) > 1 or not _TOKEN.fullmatch(raw[0]):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "X-Overspill-Callback-Token: bad token for this placement")
    return raw[0]


OptionalCallbackToken = Annotated[str | None, Depends(optional_callback_token)]


class ReportTaken(BaseModel):
    """Whether this request took the report (false: the mailbox or an earlier request already had)."""

    taken: bool


REPORT_EXAMPLE = {
    "placement_id": "pl_0123",
    "seq": 1764270000000000,
    "kind": "progress",
    "at": "2026-11-27T19:40:00+00:00",
    "progress": {"done": 1200, "total": 5000, "checkpoint": 1000},
    "checkpointed": 0.2,
    "signature": "<hex HMAC-SHA256 of the other fields, as sorted compact JSON>",
}


@router.post("/{placement_id}/reports", operation_id="placements.take_report", response_model=ReportTaken)
def take_agent_report(
    request: Request,
    placement_id: str,
    rt: RuntimeDep,
    report: Annotated[dict[str, Any], Body(examples=[REPORT_EXAMPLE])],
    x_overspill_callback_token: OptionalCallbackToken,
) -> ReportTaken:
    """Take one signed agent report (see the module docstring)."""
    if x_overspill_callback_token is not None:
        _check_token(rt, placement_id, x_overspill_callback_token)
    try:
        parsed = parse_report(json.dumps(report))
        check_signature(rt.settings, parsed, placement_id)  # before the database: no existence oracle
        with Session(rt.engine, expire_on_commit=False) as session:
            p = session.get(Placement, placement_id, with_for_update=True)
            check_report(rt.settings, p, parsed, placement_id=placement_id)
            assert p is not None
            request.state.audit_tenant = p.tenant
            job = session.get(Job, p.job_id, with_for_update=True)
            if job is None:
                raise ReportRefused(404, f"no job for placement {placement_id!r}")
            taken = take_report(session, p, job, parsed, "callback", rt.clock())
            session.commit()
        if taken and wakes_loop(parsed):
            rt.wakeup.wake(job.id)  # the interval loop acts on it now, not at its next tick
    except ReportRefused as exc:
        if exc.status == 422:
            raise Unprocessable("report", str(exc)) from None
        raise HTTPException(exc.status, str(exc)) from None
    return ReportTaken(taken=taken)


class ExitReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exit_code: int = Field(ge=-1, le=255)


@router.post("/{placement_id}/exit", operation_id="placements.report_exit", status_code=status.HTTP_204_NO_CONTENT)
def report_exit(
    request: Request,
    placement_id: str,
    body: ExitReport,
    rt: RuntimeDep,
    x_overspill_callback_token: CallbackToken,
) -> None:
    """Record the exit status; the next tick turns it into the job's verdict. Repeats are harmless."""
    _check_token(rt, placement_id, x_overspill_callback_token)
    with Session(rt.engine) as session:
        p = session.get(Placement, placement_id, with_for_update=True)
        if p is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no placement {placement_id!r}")
        request.state.audit_tenant = p.tenant  # for the audit log (broker.api.audit)
        if p.exit_code is None:
            p.exit_code = body.exit_code
            session.add(p)
            job = session.get(Job, p.job_id)
            if job is not None:
                add_event(
                    session, job, rt.clock(), "exit_reported", f"the job exited {body.exit_code}", placement_id=p.id
                )
            session.commit()


@router.post(
    "/{placement_id}/scheduled-events",
    operation_id="placements.relay_scheduled_events",
    status_code=status.HTTP_202_ACCEPTED,
)
def relay_scheduled_events(
    request: Request,
    placement_id: str,
    document: dict[str, Any],
    rt: RuntimeDep,
    x_overspill_callback_token: CallbackToken,
) -> dict[str, bool]:
    """An Azure VM relays its Scheduled Events document (IMDS); a Preempt event becomes an interruption notice
    the next tick acts on. Other providers answer 409: they deliver notices their own way."""
    _check_token(rt, placement_id, x_overspill_callback_token)
    with Session(rt.engine) as session:
        p = session.get(Placement, placement_id)
    if p is None or p.instance_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launched placement {placement_id!r}")
    request.state.audit_tenant = p.tenant
    provider = rt.provider(p.provider)
    relay = getattr(provider, "relay_scheduled_event", None)
    if relay is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"provider {p.provider} does not take relayed events")
    return {"preempt": relay(p.instance_id, document) is not None}
