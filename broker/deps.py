"""FastAPI dependencies: the process's Runtime and the authenticated, authorised caller.

They are `async` so FastAPI does not hand each one to a worker thread; only a key not yet verified in this
process goes to a thread for the slow hash."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from broker.auth import InvalidKey, Principal, Role
from broker.runtime import Runtime


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_principal(
    request: Request,
    rt: RuntimeDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    key = x_api_key
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            key = value.strip()
    if not key:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = rt.verifier.cached(key)  # the common case: no thread hand-off, no database
    if principal is None:
        try:
            principal = await run_in_threadpool(rt.verifier.verify, key)  # slow hash + lookup, off the event loop
        except InvalidKey as exc:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, f"invalid API key ({exc})", headers={"WWW-Authenticate": "Bearer"}
            ) from exc
    request.state.principal = principal  # for the audit log (broker.audit)
    return principal


def require(*roles: Role) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that admits only the given roles (403 otherwise)."""

    async def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            allowed = ", ".join(r.value for r in roles)
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"role {principal.role.value!r} may not do this (needs {allowed})"
            )
        return principal

    return check


Submitter = Annotated[Principal, Depends(require(Role.ADMIN, Role.SUBMITTER))]
Reader = Annotated[Principal, Depends(require(Role.ADMIN, Role.SUBMITTER, Role.FINANCE))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
