"""API keys and roles: creation (shown once), slow-hash storage, constant-time verification.

A key looks like `ovs_<id>_<secret>`. The id locates the row; the secret is checked against its scrypt hash with
`hmac.compare_digest`. Verified keys are cached in-process for `CACHE_SECONDS` under a SHA-256 of the whole key
(never the key itself), so the slow hash is paid once per key per process, not per request; revoking a key takes
effect within that time.

Roles: `admin` (everything in its tenant), `submitter` (jobs, quotes, pools), `finance` (reads costs and
reports only).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from broker.settings import Settings
from broker.tables import ApiKey
from broker.tenants import validate_tenant

CACHE_SECONDS = 60.0
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
    """The presented key is malformed, unknown, revoked or wrong."""


def _hash(secret: str, salt: str) -> str:
    return hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), **_SCRYPT).hex()


def parse_key(key: str) -> tuple[str, str]:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "ovs" or not parts[1] or len(parts[2]) < 16:
        raise InvalidKey("malformed API key")
    return parts[1], parts[2]


def create_key(engine: Engine, *, tenant: str, role: Role, name: str, now: datetime, key: str | None = None) -> str:
    """Store a new key and return it in clear (the only time it is ever shown).

    `key` lets the bootstrap path install a configured key; otherwise a random one is made. `tenant` must pass
    `broker.tenants.validate_tenant` (`InvalidTenant` otherwise).
    """
    validate_tenant(tenant)
    if key is None:
        key = f"ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"
    key_id, secret = parse_key(key)
    salt = secrets.token_hex(16)
    with Session(engine) as session:
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
    """Verifies presented keys against the database, caching successes briefly."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._cache: dict[bytes, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def cached(self, key: str) -> Principal | None:
        """The principal of a key verified recently in this process, without touching the database."""
        digest = hashlib.sha256(key.encode()).digest()
        with self._lock:
            hit = self._cache.get(digest)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def verify(self, key: str) -> Principal:
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
            raise InvalidKey("unknown or revoked API key")
        if not hmac.compare_digest(_hash(secret, row.salt), row.secret_hash):
            raise InvalidKey("wrong API key")
        principal = Principal(row.id, row.tenant, Role(row.role))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (principal, now + CACHE_SECONDS)
        return principal


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
