"""/v1/budgets: budgets per team or project (monthly or custom period, soft or hard, alert thresholds)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from broker.api.deps import RuntimeDep
from broker.api.routes.costs import Finance
from broker.finance import manage
from broker.finance.schemas import BudgetCreate, BudgetPage, BudgetPublic, BudgetUpdate

router = APIRouter(prefix="/v1/budgets", tags=["budgets"])


@router.post("", operation_id="budgets.create", status_code=status.HTTP_201_CREATED, response_model=BudgetPublic)
def create(body: BudgetCreate, rt: RuntimeDep, principal: Finance) -> BudgetPublic:
    return manage.create_budget(rt, principal.tenant, body)


@router.get("", operation_id="budgets.list", response_model=BudgetPage)
def list_all(rt: RuntimeDep, principal: Finance) -> BudgetPage:
    return BudgetPage(items=manage.list_budgets(rt, principal.tenant))


@router.get("/{budget_id}", operation_id="budgets.get", response_model=BudgetPublic)
def read(budget_id: str, rt: RuntimeDep, principal: Finance) -> BudgetPublic:
    return manage.get_budget(rt, principal.tenant, budget_id)


@router.patch("/{budget_id}", operation_id="budgets.update", response_model=BudgetPublic)
def update(budget_id: str, body: BudgetUpdate, rt: RuntimeDep, principal: Finance) -> BudgetPublic:
    return manage.update_budget(rt, principal.tenant, budget_id, body)


@router.delete("/{budget_id}", operation_id="budgets.delete", status_code=status.HTTP_204_NO_CONTENT)
def delete(budget_id: str, rt: RuntimeDep, principal: Finance) -> Response:
    manage.delete_budget(rt, principal.tenant, budget_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
