"""Turns every error into a problem-details answer (broker/api/problems.py) and names where the field at fault was sent.

- `locate(request, field, status)`: the real location of a field named by a service error or an `HTTPException`
  message ("field: what is wrong"): a path parameter, a query parameter (sent or declared by the route), a header,
  else the body; a 404 names the resource, which the path carries.
- `authentication_first(request)`: answers 401 (or 403 for a malformed callback token) for a request whose route
  needs a credential and that presents none or a bad one, so a request without credentials never learns how its
  body would have been validated (FastAPI parses a JSON body before it runs any dependency).
- `field_error(error, body)`: one of pydantic's validation errors as a `FieldError`, with its location. A body
  that is not JSON (FastAPI reports the character offset where a field name belongs) is the field `body` with
  "invalid JSON at line L, column C: <what the parser expected>", the line and column counted in `body`.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.api.problems import LOCATIONS, PROBLEM_MEDIA_TYPE, FieldError, Problem, problem, split_field

_HEADERS = frozenset({"authorization", "x-api-key", "idempotency-key", "x-overspill-callback-token", "x-request-id"})


def problem_response(body: Problem, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(
        body.model_dump(mode="json"), status_code=body.status, headers=headers, media_type=PROBLEM_MEDIA_TYPE
    )


def _route_params(request: Request, kind: str) -> set[str]:
    route = request.scope.get("route")
    dependant: Dependant | None = getattr(route, "dependant", None)
    names: set[str] = set()
    stack = [dependant] if dependant is not None else []
    while stack:
        dep = stack.pop()
        for param in getattr(dep, f"{kind}_params"):
            names.add(param.alias)
            names.add(param.name)
        stack.extend(dep.dependencies)
    return names


def locate(request: Request, field: str, status: int) -> Any:
    """Where the client sent `field` (see the module docstring)."""
    if field in request.path_params:
        return "path"
    if field in request.query_params or field in _route_params(request, "query"):
        return "query"
    if field.lower() in _HEADERS or field.lower() in request.headers:
        return "header"
    if status == 404:
        return "path"
    return "body"


def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
    """An `HTTPException` as a problem; a message "field: ..." names its field and location."""
    detail = str(exc.detail)
    field, message = split_field(detail)
    errors = []
    if field is not None:
        errors.append(
            FieldError(field=field, location=locate(request, field, exc.status_code), message=message, type="http")
        )
    return problem_response(problem(exc.status_code, detail, errors), headers=dict(exc.headers or {}))


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of character `pos` of `text` (as `json.JSONDecodeError` counts them)."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def field_error(error: Any, body: Any = None) -> FieldError:
    if error.get("type") == "json_invalid":
        loc = list(error.get("loc", ()))
        pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body if isinstance(body, str) else ""
        line, column = _line_column(text, pos)
        why = (error.get("ctx") or {}).get("error") or "not valid JSON"
        where = f"line {line}, column {column}" if text else f"character {pos + 1}"
        return FieldError(field="body", location="body", message=f"invalid JSON at {where}: {why}", type="json_invalid")
    loc = [str(p) for p in error["loc"]]
    location = loc[0] if loc and loc[0] in LOCATIONS else "body"
    rest = loc[1:] if loc and loc[0] in (*LOCATIONS, "cookie") else loc
    return FieldError(field=".".join(rest) or location, location=location, message=error["msg"], type=error["type"])


def _gate_of(route: Any) -> str | None:
    """ "key" when the route authenticates an API key, "callback" when it takes a callback token, else None (found
    once per route object, and kept on it)."""
    from broker.api.deps import get_principal
    from broker.api.routes.placements import callback_token_of

    if route is None:
        return None
    if not hasattr(route, "_overspill_gate"):
        found: str | None = None
        stack = [getattr(route, "dependant", None)]
        while stack and found is None:
            dep = stack.pop()
            if dep is None:
                continue
            if dep.call is get_principal or getattr(dep.call, "authenticates_key", False):
                found = "key"
            elif dep.call is callback_token_of:
                found = "callback"
            stack.extend(dep.dependencies)
        route._overspill_gate = found
    return route._overspill_gate  # type: ignore[no-any-return]


async def authentication_first(request: Request) -> Response | None:
    """The 401/403 a request without a valid credential gets on a route that needs one; None when it has one."""
    from broker.api.deps import principal_of
    from broker.api.routes.placements import callback_token_of

    gate = _gate_of(request.scope.get("route"))
    try:
        if gate == "key":
            await principal_of(request, request.app.state.runtime)
        elif gate == "callback":
            await callback_token_of(request)
    except HTTPException as exc:
        return http_problem(request, exc)
    return None
