"""The one error shape of the API: RFC 9457 problem details, served as `application/problem+json`.

Every 4xx and 5xx answer, whether raised by validation, an `HTTPException`, a service-layer `BrokerError`, the body
size limit or the rate limiter, is a `Problem`:

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "detail": "max_total_usd: Input should be greater than 0",
     "errors": [{"field": "max_total_usd", "location": "body", "message": "Input should be greater than 0",
                 "type": "greater_than"}],
     "message": "max_total_usd: Input should be greater than 0"}

`detail` is one human-readable sentence naming the field(s) at fault; `errors` lists each field with where the
client sent it (`body`, `query`, `path` or `header`), empty when no field is at fault (a 404 route, a 429).
`message` repeats `detail` for clients written before problem details (the CLI, older scripts).

This module builds the bodies; it knows nothing of FastAPI, so the pure ASGI middlewares use it too.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Literal

from pydantic import BaseModel, Field

PROBLEM_MEDIA_TYPE = "application/problem+json"
Location = Literal["body", "query", "path", "header"]
LOCATIONS: tuple[Location, ...] = ("body", "query", "path", "header")
# "<field>: <what is wrong>", the convention of every message the broker raises
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\-\[\]]{0,120}): (.+)$", re.DOTALL)


class FieldError(BaseModel):
    """One field at fault."""

    field: str = Field(description="the field, dotted within its location (`accelerators.0`, `from`, `Authorization`)")
    location: Location = Field(description="where the client sent it")
    message: str
    type: str = Field(description="a stable code for the kind of error (`missing`, `greater_than`, `Conflict`...)")


class Problem(BaseModel):
    """An error answer (RFC 9457 problem details with the list of fields at fault)."""

    type: str = Field(default="about:blank", description="`about:blank`: the status code says it all")
    title: str = Field(description="the HTTP status phrase")
    status: int
    detail: str = Field(description="what went wrong, naming the field(s) at fault")
    errors: list[FieldError] = Field(default_factory=list)
    message: str = Field(description="the same text as `detail` (kept for clients written before problem details)")


def title_of(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem(status: int, detail: str, errors: list[FieldError] | None = None) -> Problem:
    return Problem(title=title_of(status), status=status, detail=detail, errors=errors or [], message=detail)


def problem_bytes(status: int, detail: str) -> bytes:
    """The serialized body of a problem with no field list (for the ASGI middlewares)."""
    return json.dumps(problem(status, detail).model_dump(mode="json")).encode()


def split_field(text: str) -> tuple[str | None, str]:
    """("field", "what is wrong") of a message written "field: what is wrong"; (None, text) otherwise."""
    m = _FIELD_PREFIX.match(text)
    if m is None or " " in m.group(1):
        return None, text
    return m.group(1), m.group(2)
