"""/v1/report-schedules (CRUD) and /v1/report-runs (list, run a period now, read, download)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from broker.api.deps import RuntimeDep
from broker.api.routes.costs import Finance
from broker.finance import manage
from broker.finance.reports.period import PeriodError, parse_period
from broker.finance.reports.runs import run_report
from broker.finance.schemas import (
    RunCreate,
    RunPage,
    RunPublic,
    ScheduleCreate,
    SchedulePage,
    SchedulePublic,
    ScheduleUpdate,
)
from broker.services.errors import Unprocessable

# the real type of each format, after `application/octet-stream`: the same bytes for a client that takes any format
# as a file (generators such as openapi-python-client pick the first type they know, and read text/* as text)
REPORT_MEDIA_TYPES = ("application/octet-stream", "text/csv", "text/html", "application/pdf")
MAX_REPORT_PERIOD = timedelta(days=366)  # its charts are per day: bounded work per run (found by fuzzing)

schedules = APIRouter(prefix="/v1/report-schedules", tags=["reports"])
runs = APIRouter(prefix="/v1/report-runs", tags=["reports"])


@schedules.post(
    "", operation_id="report_schedules.create", status_code=status.HTTP_201_CREATED, response_model=SchedulePublic
)
def create_schedule(body: ScheduleCreate, rt: RuntimeDep, principal: Finance) -> SchedulePublic:
    return manage.create_schedule(rt, principal.tenant, body)


@schedules.get("", operation_id="report_schedules.list", response_model=SchedulePage)
def list_schedules(rt: RuntimeDep, principal: Finance) -> SchedulePage:
    return SchedulePage(items=manage.list_schedules(rt, principal.tenant))


@schedules.get("/{schedule_id}", operation_id="report_schedules.get", response_model=SchedulePublic)
def read_schedule(schedule_id: str, rt: RuntimeDep, principal: Finance) -> SchedulePublic:
    return manage.get_schedule(rt, principal.tenant, schedule_id)


@schedules.patch("/{schedule_id}", operation_id="report_schedules.update", response_model=SchedulePublic)
def update_schedule(schedule_id: str, body: ScheduleUpdate, rt: RuntimeDep, principal: Finance) -> SchedulePublic:
    return manage.update_schedule(rt, principal.tenant, schedule_id, body)


@schedules.delete("/{schedule_id}", operation_id="report_schedules.delete", status_code=status.HTTP_204_NO_CONTENT)
def delete_schedule(schedule_id: str, rt: RuntimeDep, principal: Finance) -> Response:
    manage.delete_schedule(rt, principal.tenant, schedule_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@runs.get("", operation_id="report_runs.list", response_model=RunPage)
def list_runs(rt: RuntimeDep, principal: Finance, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> RunPage:
    """The latest `limit` runs, newest first."""
    return RunPage(items=manage.list_runs(rt, principal.tenant, limit))


@runs.post(
    "",
    operation_id="report_runs.create",
    status_code=status.HTTP_201_CREATED,
    response_model=RunPublic,
    responses={202: {"model": RunPublic, "description": "produced; its delivery is queued (`delivery_state` pending)"}},
)
def run_now(body: RunCreate, rt: RuntimeDep, principal: Finance, response: Response) -> RunPublic:
    """Produce a report of a period now: 201 with the run. With a destination, 202: the control loop delivers it
    (within a tick); read the run again for `delivery_state` (`delivered` or `failed`, with `error`)."""
    if body.period:
        try:
            start, end = parse_period(body.period)
        except PeriodError as exc:
            raise Unprocessable("period", str(exc)) from exc
    elif body.from_ and body.to:
        start, end = body.from_, body.to
        if end <= start:
            raise Unprocessable("to", "must be after from")
        if end - start > MAX_REPORT_PERIOD:
            raise Unprocessable("to", f"a report covers at most {MAX_REPORT_PERIOD.days} days; split longer periods")
    else:
        raise Unprocessable("period", "give a period (2026-10) or both from and to")
    destination = manage.allowed_destination(rt, principal.tenant, body.destination)
    run = run_report(rt, principal.tenant, body.format, start, end, rt.clock(), destination=destination)
    if run.delivery_state == "pending":
        response.status_code = status.HTTP_202_ACCEPTED
    return manage.run_public(run)


@runs.get("/{run_id}", operation_id="report_runs.get", response_model=RunPublic)
def read_run(run_id: str, rt: RuntimeDep, principal: Finance) -> RunPublic:
    return manage.run_public(manage.get_run(rt, principal.tenant, run_id))


@runs.get(
    "/{run_id}/download",
    operation_id="report_runs.download",
    response_class=Response,
    responses={
        200: {
            "description": "the report file, as an attachment, with its real media type: `csv` and `focus` (FOCUS "
            "1.2) are text/csv, `html` text/html, `pdf` application/pdf; `ETag` is its SHA-256",
            "content": {media: {"schema": {"type": "string", "format": "binary"}} for media in REPORT_MEDIA_TYPES},
        }
    },
)
def download(run_id: str, rt: RuntimeDep, principal: Finance) -> Response:
    run = manage.get_run(rt, principal.tenant, run_id)
    if run.content is None:
        raise Unprocessable("run", f"report run {run_id} has no content ({run.state}: {run.error or 'not finished'})")
    return Response(
        content=run.content,
        media_type=run.content_type,
        headers={"Content-Disposition": f'attachment; filename="{run.filename}"', "ETag": f'"{run.sha256}"'},
    )
