"""/v1/costs: ledger sums grouped by team, project, job, provider, region, capacity type, kind, day or month;
corrections; provider bill import and reconciliation. Finance and admin roles, within their own tenant."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from starlette.concurrency import run_in_threadpool

from broker.api.auth import Principal, Role
from broker.api.deps import RuntimeDep, require
from broker.api.schemas import aware_utc
from broker.finance import manage
from broker.finance.bill_files import BillTooLarge
from broker.finance.billing import BillError, import_bill, reconcile
from broker.finance.budgets import month_window
from broker.finance.costs import GROUP_KEYS
from broker.finance.schemas import BillImportPublic, CorrectionCreate, CorrectionPublic, CostSummary, Reconciliation
from broker.services.errors import NotFoundError, PayloadTooLarge, Unprocessable

router = APIRouter(prefix="/v1/costs", tags=["costs"])

Finance = Annotated[Principal, Depends(require(Role.ADMIN, Role.FINANCE))]


def parse_time(value: str | None, field: str) -> datetime | None:
    """ISO 8601; a date means midnight UTC, a time without a zone is UTC."""
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise Unprocessable(field, f"{value!r} is not an ISO 8601 date or time") from exc
    try:
        return aware_utc(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC))
    except ValueError as exc:  # e.g. 9999-12-31T23:59:59-14:00, past the end of the calendar in UTC
        raise Unprocessable(field, str(exc)) from None


@router.get("", operation_id="costs.summary", response_model=CostSummary, response_model_exclude_unset=True)
def costs(
    rt: RuntimeDep,
    principal: Finance,
    group_by: Annotated[str, Query(max_length=200, description=f"comma list of {', '.join(GROUP_KEYS)}")] = "team",
    from_: Annotated[str | None, Query(alias="from", max_length=40)] = None,
    to: Annotated[str | None, Query(max_length=40)] = None,
) -> dict[str, Any]:
    """Cost, on-demand counterfactual and savings per group (money as decimal strings). Default window: this
    month (UTC) so far."""
    keys = [k.strip() for k in group_by.split(",") if k.strip()]
    bad = [k for k in keys if k not in GROUP_KEYS]
    if bad or len(set(keys)) != len(keys):
        raise Unprocessable("group_by", f"use distinct keys from {', '.join(GROUP_KEYS)} (got {group_by!r})")
    now = rt.clock()
    start = parse_time(from_, "from") or month_window(now)[0]
    end = parse_time(to, "to") or now
    if end <= start:
        raise Unprocessable("to", "must be after from")
    return manage.cost_summary(rt, principal.tenant, keys, start, end)


@router.post(
    "/corrections",
    operation_id="costs.corrections.create",
    status_code=status.HTTP_201_CREATED,
    response_model=CorrectionPublic,
)
def correct(body: CorrectionCreate, request: Request, rt: RuntimeDep, principal: Finance) -> dict[str, Any]:
    """Append a correction (positive or negative USD) to a ledger entry; the entry itself never changes. With its
    earlier corrections the entry must stay between 0 and twice its amount (422 otherwise); a credit never gives
    a job more room under its ceiling (`broker.finance.ledger.record_correction`). The audit log records the
    entry, amount, job and note, refused attempts included."""
    request.state.audit_detail = f"correction of cost entry {body.entry_id}: {body.usd} USD, note {body.note[:200]!r}"
    made = manage.correct_entry(rt, principal.tenant, body.entry_id, body.usd, body.note)
    request.state.audit_detail = (
        f"correction {made['id']} of cost entry {body.entry_id} (job {made['job_id']}): {made['usd']} USD, "
        f"note {body.note[:200]!r}"
    )
    return made


@router.post(
    "/bills",
    operation_id="costs.bills.upload",
    status_code=status.HTTP_201_CREATED,
    response_model=BillImportPublic,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "the bill file's bytes, in the format `filename` names",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_bill(
    request: Request,
    rt: RuntimeDep,
    principal: Finance,
    filename: Annotated[str, Query(max_length=200, pattern=r"^[\w.-]+\.(csv|csv\.gz|parquet)$")],
    provider: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """Import a FOCUS billing export sent as the raw body (`filename` says its format: .csv, .csv.gz or
    .parquet). 413 naming the limit when it passes one once decompressed (size, rows, columns: the
    `OVERSPILL_BILL_MAX_*` settings); 422 naming the row and column of a bad value. Large files: use
    `overspill costs import-bill FILE` on the broker host."""
    body = await request.body()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / filename
        path.write_bytes(body)
        try:
            summary = await run_in_threadpool(import_bill, rt, principal.tenant, path, rt.clock(), provider=provider)
        except BillTooLarge as exc:
            raise PayloadTooLarge("body", str(exc)) from exc
        except BillError as exc:
            raise Unprocessable("body", str(exc)) from exc
    return {
        "id": summary.id,
        "provider": summary.provider,
        "rows": summary.rows,
        "resources": summary.resources,
        "skipped_without_resource": summary.skipped_without_resource,
        "billed_usd": str(summary.billed_usd),
        "reconciliation_url": f"/v1/costs/bills/{summary.id}/reconciliation",
    }


@router.get(
    "/bills/{import_id}/reconciliation", operation_id="costs.bills.reconciliation", response_model=Reconciliation
)
def reconciliation(import_id: str, rt: RuntimeDep, principal: Finance) -> dict[str, Any]:
    """Ledger vs bill per resource id: ledger_usd, billed_usd, difference_usd (billed - ledger), status."""
    result = reconcile(rt, principal.tenant, import_id)
    if result is None:
        raise NotFoundError("bill import", import_id)
    return result
