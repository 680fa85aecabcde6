"""API keys and roles: creation (shown once), slow-hash storage, constant-time verification, revocation.

A key looks like `ovs_<id>_<secret>`. The id locates the row; the secret is checked against its scrypt hash with
`hmac.compare_digest`. A request presents it in `Authorization: Bearer <key>` or `X-API-Key: <key>`, read by
`presented_key` (the one reader: the rate limiter, authentication and the audit log all use it); a credential
header sent twice, or both headers with different keys, raises `AmbiguousCredentials` naming the header.

`KeyVerifier` caches verified keys in-process for `CACHE_SECONDS` under a SHA-256 of the whole key (never the key
itself), so the slow hash is paid once per key per process, not per request. Revocation (`revoke_key`, or
`revoked_at` set in the database by hand) takes effect:
- at once in the process that revoked it (`forget`);
- at once for state-changing requests in every process: the caller `confirm`s a cached principal against its row
  (one primary-key read) before any POST, PUT, PATCH or DELETE (`POST /v1/jobs` reads the row inside the job's
  own transaction instead, and inserts nothing when the key is revoked: `broker.services.jobs.submit_job`);
- within `recheck_seconds` (1 s) for reads in every process: `recheck` (due once per interval per process, see
  `recheck_due`) reads the rows of every cached key id in one query and drops those revoked or deleted.
Every refusal says the same thing ("invalid API key"): malformed, unknown, revoked and wrong keys are not told
apart, and an unknown id costs the same hash as a wrong secret.

Roles: `admin` (everything in its tenant), `submitter` (jobs, quotes, pools), `finance` (reads costs and
reports only).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, col, select

from broker.config.settings import Settings
from broker.config.tenants import validate_tenant
from broker.store.tables import ApiKey

log = logging.getLogger(__name__)

CACHE_SECONDS = 60.0
RECHECK_SECONDS = 1.0
INVALID = "invalid API key"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


class Role(StrEnum):
    ADMIN = "admin"
    SUBMITTER = "submitter"
    FINANCE = "finance"


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    tenant: str
    role: Role


class InvalidKey(Exception):
    """The presented key is malformed, unknown, revoked or wrong (one message for all: `INVALID`)."""

    def __init__(self, message: str = INVALID) -> None:
        super().__init__(message)


class AmbiguousCredentials(Exception):
    """A request carries more than one credential: `header` names the one at fault."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(f"{header}: {message}")
        self.header = header


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The API key a request presents, from its raw (ASGI) headers: `Authorization: Bearer <key>` or
    `X-API-Key: <key>`; None when there is none. `Authorization` with another scheme carries no key.

    Raises `AmbiguousCredentials` for `Authorization` or `X-API-Key` sent more than once, and for both sent with
    different keys: every reader of the key (rate limiter, authentication, audit) must see the same one."""
    authorization: list[bytes] = []
    api_key: list[bytes] = []
    for name, value in headers:
        if name == b"authorization":
            authorization.append(value)
        elif name == b"x-api-key":
            api_key.append(value)
    if len(authorization) > 1:
        raise AmbiguousCredentials("Authorization", "sent more than once")
    if len(api_key) > 1:
        raise AmbiguousCredentials("X-API-Key", "sent more than once")
    bearer = None
    if authorization:
        scheme, _, rest = authorization[0].decode("latin-1").partition(" ")
        if scheme.lower() == "bearer":
            bearer = rest.strip() or None
    other = api_key[0].decode("latin-1").strip() or None if api_key else None
    if bearer is not None and other is not None and not hmac.compare_digest(bearer.encode(), other.encode()):
        raise AmbiguousCredentials("X-API-Key", "differs from the key in Authorization: send one key")
    return bearer or other


def _hash(secret: str, salt: str) -> str:
    return hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), **_SCRYPT).hex()


def parse_key(key: str) -> tuple[str, str]:
    """(id, secret) of a well-formed key; `InvalidKey` otherwise."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "ovs" or not parts[1] or len(parts[1]) > 32 or len(parts[2]) < 16:
        raise InvalidKey()
    return parts[1], parts[2]


class TooManyKeys(Exception):
    """The tenant already holds as many active keys as it may (`create_key(max_active=...)`)."""


def create_key(
    engine: Engine,
    *,
    tenant: str,
    role: Role,
    name: str,
    now: datetime,
    key: str | None = None,
    max_active: int | None = None,
) -> str:
    """Store a new key and return it in clear (the only time it is ever shown).

    `key` lets the bootstrap path install a configured key; otherwise a random one is made. `tenant` must pass
    `broker.config.tenants.validate_tenant` (`InvalidTenant` otherwise). With `max_active`, `TooManyKeys` when the
    tenant already holds that many unrevoked keys (counted in the transaction that adds the key).
    """
    validate_tenant(tenant)
    if key is None:
        key = f"ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"
    key_id, secret = parse_key(key)
    salt = secrets.token_hex(16)
    with Session(engine) as session:
        if max_active is not None:
            active = session.exec(
                select(func.count())
                .select_from(ApiKey)
                .where(ApiKey.tenant == tenant, col(ApiKey.revoked_at).is_(None))
            ).one()
            if active >= max_active:
                raise TooManyKeys(
                    f"tenant {tenant!r} already holds {active} active API keys, the most it may "
                    f"(OVERSPILL_MAX_KEYS_PER_TENANT={max_active}); revoke one (DELETE /v1/keys/{{id}}) first"
                )
        session.add(
            ApiKey(
                id=key_id,
                tenant=tenant,
                role=role.value,
                name=name,
                salt=salt,
                secret_hash=_hash(secret, salt),
                created_at=now,
            )
        )
        session.commit()
    return key


class KeyVerifier:
    """Verifies presented keys against the database, caching successes and re-checking them for revocation (see
    the module docstring). Thread-safe; one per process."""

    def __init__(self, engine: Engine, *, recheck_seconds: float = RECHECK_SECONDS) -> None:
        self._engine = engine
        self._cache: dict[bytes, tuple[Principal, float]] = {}
        self._lock = threading.Lock()
        self.recheck_seconds = recheck_seconds
        self._next_recheck = 0.0
        self._rechecking = False

    def cached(self, key: str) -> Principal | None:
        """The principal of a key verified recently in this process, without touching the database."""
        digest = hashlib.sha256(key.encode()).digest()
        with self._lock:
            hit = self._cache.get(digest)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def verify(self, key: str) -> Principal:
        """The key's principal, from the cache or the database (the slow hash); `InvalidKey` otherwise."""
        hit = self.cached(key)
        if hit is not None:
            return hit
        digest = hashlib.sha256(key.encode()).digest()
        now = time.monotonic()
        key_id, secret = parse_key(key)
        with Session(self._engine) as session:
            row = session.get(ApiKey, key_id)
        if row is None or row.revoked_at is not None:
            _hash(secret, "00" * 16)  # same work either way: no timing hint that the id exists
            raise InvalidKey()
        if not hmac.compare_digest(_hash(secret, row.salt), row.secret_hash):
            raise InvalidKey()
        principal = Principal(row.id, row.tenant, Role(row.role))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (principal, now + CACHE_SECONDS)
        return principal

    def confirm(self, principal: Principal) -> bool:
        """Whether a cached principal's key still exists unrevoked (one primary-key read); forgets it if not."""
        table = ApiKey.__table__  # type: ignore[attr-defined]
        with self._engine.connect() as conn:  # a Core read: this runs on every state-changing request
            row = conn.execute(select(table.c.revoked_at).where(table.c.id == principal.key_id)).first()
        if row is None or row.revoked_at is not None:
            self.forget(principal.key_id)
            return False
        return True

    def forget(self, key_id: str) -> int:
        """Drop every cached entry of this key id (it was revoked); how many there were."""
        with self._lock:
            gone = [d for d, (p, _) in self._cache.items() if p.key_id == key_id]
            for digest in gone:
                del self._cache[digest]
        return len(gone)

    def recheck_due(self) -> bool:
        """True for exactly one caller once `recheck_seconds` have passed since the last recheck: that caller
        runs `recheck` (the others go on with the cache meanwhile)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_recheck or self._rechecking:
                return False
            self._rechecking = True
            return True

    def recheck(self) -> int:
        """Drop cached keys revoked or deleted in the database (one query for every cached id); how many.

        A database failure is logged and leaves the cache as it was (the request needing the database fails on
        its own); the next recheck is due `recheck_seconds` later either way."""
        try:
            with self._lock:
                ids = sorted({p.key_id for p, _ in self._cache.values()})
            gone: set[str] = set()
            if ids:
                with Session(self._engine) as session:
                    for start in range(0, len(ids), 500):
                        chunk = ids[start : start + 500]
                        rows = session.exec(select(ApiKey.id, ApiKey.revoked_at).where(col(ApiKey.id).in_(chunk))).all()
                        live = {row_id for row_id, revoked_at in rows if revoked_at is None}
                        gone |= set(chunk) - live
            for key_id in gone:
                self.forget(key_id)
            return len(gone)
        except SQLAlchemyError as exc:
            log.warning("auth: re-checking cached API keys for revocation failed: %s", exc)
            return 0
        finally:
            with self._lock:
                self._rechecking = False
                self._next_recheck = time.monotonic() + self.recheck_seconds


def list_keys(engine: Engine, tenant: str) -> list[ApiKey]:
    """A tenant's keys (revoked ones included), oldest first."""
    with Session(engine) as session:
        query = select(ApiKey).where(ApiKey.tenant == tenant).order_by(col(ApiKey.created_at), col(ApiKey.id))
        return list(session.exec(query).all())


def revoke_key(engine: Engine, tenant: str, key_id: str, now: datetime) -> ApiKey | None:
    """Revoke one of the tenant's keys (idempotent: a revoked key keeps its first `revoked_at`). None when the
    tenant has no such key (another tenant's key included)."""
    with Session(engine) as session:
        row = session.get(ApiKey, key_id, with_for_update=True)
        if row is None or row.tenant != tenant:
            return None
        if row.revoked_at is None:
            row.revoked_at = now
            session.add(row)
            session.commit()
            session.refresh(row)
        return row


def ensure_bootstrap_key(engine: Engine, *, tenant: str, key: str, now: datetime) -> bool:
    """Install the configured admin key if its id is not stored yet. Returns True when it was created."""
    key_id, _ = parse_key(key)
    with Session(engine) as session:
        if session.get(ApiKey, key_id) is not None:
            return False
    try:
        create_key(engine, tenant=tenant, role=Role.ADMIN, name="bootstrap admin", now=now, key=key)
    except IntegrityError:  # another replica created it at the same moment
        return False
    return True


def callback_token(settings: Settings, placement_id: str) -> str:
    """The token an instance presents when it reports its exit status (an HMAC of the placement id)."""
    return hmac.new(settings.callback_key(), placement_id.encode(), hashlib.sha256).hexdigest()
