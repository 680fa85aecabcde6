"""FastAPI dependencies: the process's Runtime and the authenticated, authorised caller.

They are `async` so FastAPI does not hand each one to a worker thread. A key verified in this process is answered
from the verifier's cache with no thread hand-off and no database; a state-changing request (POST, PUT, PATCH,
DELETE) also confirms the key is not revoked (one primary-key read; `POST /v1/jobs` does that read inside the job's
own transaction instead, see `get_principal_unconfirmed`), and once a second one request re-checks every
cached key (broker/api/auth.py). Only a key not yet verified goes to the slow hash, through the process's `HashGate`:
at most `key_hash_concurrency` hashes at once on its own threads, run at a lower CPU priority (so unverified keys
never take the worker threads legitimate requests run on, nor their cores), at most `MAX_WAITING_PER_SLOT` per slot
waiting, and beyond that a 429; concurrent requests with the same key share one hash.

Errors: no key 401; a credential header sent twice, or two different keys, 400 naming the header; any invalid key
401 "invalid API key" (malformed, unknown, revoked and wrong alike); a wrong role 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.concurrency import run_in_threadpool

from broker.api.auth import INVALID, AmbiguousCredentials, InvalidKey, Principal, Role, presented_key
from broker.runtime import Runtime

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_WAITING_PER_SLOT = 32
HASH_NICE = 10
T = TypeVar("T")


class GateFull(Exception):
    """Too many unverified keys are waiting for the slow hash in this process."""


def _lower_priority() -> None:
    """Run this thread at a lower CPU priority (nice +10, Linux: per thread), so that hashing guessed keys yields
    the cores to legitimate requests."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: the slots still cap its CPU
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_NICE)


class HashGate:
    """Runs slow key hashes on its own `slots` threads (at a lower CPU priority), never on the worker threads
    legitimate requests run on; refuses (`GateFull`) when `max_waiting` more callers already wait. One per app
    (process).

    Concurrent requests presenting the same key share one hash (single flight): a client that opens many
    connections at once with a key this process has not verified yet (a fresh worker, a burst of submissions)
    costs one slot, not one per request, and is never refused for its own parallelism."""

    def __init__(self, slots: int, max_waiting: int | None = None) -> None:
        self.slots = slots
        self.max_waiting = max_waiting if max_waiting is not None else slots * MAX_WAITING_PER_SLOT
        self.pending = 0  # running + waiting hashes (one per distinct key in flight)
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="key-hash", initializer=_lower_priority)

    async def run(self, key: str, fn: Callable[[str], T]) -> T:
        """`fn(key)` on the gate's threads, or the result of the same call already in flight for `key`."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        shared = self._inflight.get(digest)
        if shared is not None:
            return await asyncio.shield(shared)  # type: ignore[no-any-return]
        if self.pending >= self.slots + self.max_waiting:
            raise GateFull
        self.pending += 1
        flight = asyncio.get_running_loop().run_in_executor(self._pool, fn, key)
        self._inflight[digest] = flight
        try:
            return await asyncio.shield(flight)
        finally:
            self.pending -= 1
            if self._inflight.get(digest) is flight:
                del self._inflight[digest]


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def _unauthorised(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


def request_key(request: Request) -> str | None:
    """The key the request presents (`broker.api.auth.presented_key`); 400 naming the header if ambiguous."""
    try:
        return presented_key(request.scope["headers"])
    except AmbiguousCredentials as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc


async def authenticate(request: Request, rt: Runtime, key: str, *, confirm: bool = True) -> Principal:
    """The principal of `key` (see the module docstring); HTTPException 401 or 429 otherwise. `confirm=False`
    skips the revocation re-read of a cached key on a state-changing request (see `get_principal_unconfirmed`)."""
    verifier = rt.verifier
    principal = verifier.cached(key)  # the common case: no thread hand-off, no database
    if principal is not None and verifier.recheck_due():
        await run_in_threadpool(verifier.recheck)
        principal = verifier.cached(key)
    if (
        principal is not None
        and confirm
        and request.method in STATE_CHANGING
        and not await run_in_threadpool(verifier.confirm, principal)
    ):
        raise _unauthorised(INVALID)
    if principal is None:
        gate: HashGate | None = getattr(request.app.state, "hash_gate", None)
        try:
            if gate is None:
                principal = await run_in_threadpool(verifier.verify, key)
            else:
                principal = await gate.run(key, verifier.verify)  # slow hash + lookup, on the gate's threads
        except InvalidKey as exc:
            raise _unauthorised(INVALID) from exc
        except GateFull as exc:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                "Authorization: too many unverified API keys are being checked at once; retry after 1 s",
                headers={"Retry-After": "1"},
            ) from exc
    return principal


# The OpenAPI security schemes (Swagger's Authorize button, generated clients' auth): a bearer token or the
# X-API-Key header, either one. They only document; `get_principal` reads the key from the raw headers, where a
# header sent twice is visible (FastAPI would give the first), by the same function as the rate limiter's.
BEARER = HTTPBearer(scheme_name="BearerAuth", description="`Authorization: Bearer <API key>`", auto_error=False)
API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", scheme_name="ApiKeyAuth", description="the API key, instead of `Authorization`", auto_error=False
)


async def get_principal(
    request: Request,
    rt: RuntimeDep,
    _bearer: Annotated[Any, Security(BEARER)] = None,
    _api_key: Annotated[Any, Security(API_KEY_HEADER)] = None,
) -> Principal:
    principal = await principal_of(request, rt)
    request.state.principal = principal  # for the audit log (broker.api.audit)
    return principal


async def get_principal_unconfirmed(request: Request) -> Principal:
    """`get_principal` without the revocation re-read of a key cached in this process, for a route whose write
    re-reads the key's row in its own transaction (`POST /v1/jobs`: `broker.services.jobs.submit_job(key_id=...)`),
    one round trip instead of two. Such a route must call `confirm_or_refuse` on every path that does not run that
    transaction (a refusal, a replay), and `refuse_revoked` when the transaction finds the key revoked.

    Not a dependency itself: `require(..., confirmed=False)` calls it from one dependency (FastAPI solves each
    sub-dependency per request, which shows in a busy worker's profile)."""
    principal = await principal_of(request, request.app.state.runtime, confirm=False)
    request.state.principal = principal
    return principal


def refuse_revoked(request: Request, rt: Runtime, principal: Principal) -> HTTPException:
    """The 401 for a key found revoked after it was authenticated: forgotten in this process, and the request is
    audited as refused (no principal), as if authentication had refused it."""
    rt.verifier.forget(principal.key_id)
    request.state.principal = None
    return _unauthorised(INVALID)


async def confirm_or_refuse(request: Request, rt: Runtime, principal: Principal) -> None:
    """Re-read the key's row (`KeyVerifier.confirm`); `refuse_revoked`'s 401 if it is revoked or gone."""
    if not await run_in_threadpool(rt.verifier.confirm, principal):
        raise refuse_revoked(request, rt, principal)


async def principal_of(request: Request, rt: Runtime, *, confirm: bool = True) -> Principal:
    """The request's authenticated principal: 401 without a key or with an invalid one, 400 for an ambiguous one,
    429 when too many unverified keys are being hashed."""
    key = request_key(request)
    if not key:
        raise _unauthorised("Authorization: missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
    return await authenticate(request, rt, key, confirm=confirm)


def _admit(principal: Principal, roles: tuple[Role, ...]) -> Principal:
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"role {principal.role.value!r} may not do this (needs {allowed})"
        )
    return principal


def require(*roles: Role, confirmed: bool = True) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits only the given roles (403 otherwise). `confirmed=False`: the key is authenticated
    as by `get_principal_unconfirmed` (the route re-reads it itself), in one dependency whose only sub-dependencies
    are the two security schemes it documents (the OpenAPI document is the same as for `get_principal`)."""
    if confirmed:

        async def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
            return _admit(principal, roles)

        return check

    async def check_unconfirmed(
        request: Request,
        _bearer: Annotated[Any, Security(BEARER)] = None,
        _api_key: Annotated[Any, Security(API_KEY_HEADER)] = None,
    ) -> Principal:
        return _admit(await get_principal_unconfirmed(request), roles)

    check_unconfirmed.authenticates_key = True  # type: ignore[attr-defined]  # for broker.api.http_errors
    return check_unconfirmed


Submitter = Annotated[Principal, Depends(require(Role.ADMIN, Role.SUBMITTER))]
# POST /v1/jobs: the key's revocation is re-read in the job's own transaction (see get_principal_unconfirmed)
SubmitterCheckedInWrite = Annotated[Principal, Depends(require(Role.ADMIN, Role.SUBMITTER, confirmed=False))]
Reader = Annotated[Principal, Depends(require(Role.ADMIN, Role.SUBMITTER, Role.FINANCE))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
