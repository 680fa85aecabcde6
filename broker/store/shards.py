"""Shard leases: live placements are partitioned among the tick replicas, so N replicas share the per-placement
work of a tick (sync, accrual, return-on-prem, mailboxes) instead of each doing all of it.

A placement belongs to one of `SHARDS` fixed shards by a stable hash of its id (`shard_of`: the id's last two hex
digits, which `broker.services.jobs.new_id` draws at random, modulo `SHARDS`; an id without them is in shard 0).
The same hash is a SQL expression (`ShardScope.clause`: the id's two-character suffix in a list), so a step reads
only its replica's placements, on SQLite and PostgreSQL alike.

Each shard has a lease row (`tick_shard`: owner, expiry) and each replica a heartbeat row (`tick_replica`).
`claim_shards(engine, replica, now, lease)`, called at the start of every tick, writes the heartbeat, counts the
live replicas (heartbeats within one lease), renews the replica's own leases, then gives back the shards it holds
beyond its fair share (`ceil(SHARDS / live)`), or takes free ones (no owner, or a lease that ran out: a replica
that stopped) up to that share. Every claim is one conditional UPDATE (PostgreSQL: its candidates picked with
`FOR UPDATE SKIP LOCKED`, and the condition re-checked on the row it updates), so two replicas racing for a shard
cannot both win. A replica that joins gets its share within two ticks of the others (they give back their excess,
it takes it); a replica that dies has its shards taken over once their leases run out.

Leases partition work; they never decide correctness. Every step still locks the rows it changes and re-checks
their state under the lock, so a placement handled by two replicas for a moment (a tick outlasting its lease, a
paused replica waking up) is handled once, exactly as before sharding. Steps run outside `tick` (tests, the
Lambda handlers) have no scope and see every placement (`broker.loop.common.in_scope`).
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, func, or_, select, true, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from broker.store.tables import TickReplica, TickShard

SHARDS = 64
_HEX = "0123456789abcdef"
_SUFFIXES = tuple(a + b for a in _HEX for b in _HEX)  # every two-hex-digit suffix, value = index
_S = TickShard.__table__  # type: ignore[attr-defined]
_R = TickReplica.__table__  # type: ignore[attr-defined]
_STALE_REPLICA = 10  # heartbeats older than this many leases are deleted


def shard_of(key: str) -> int:
    """The shard of a placement id: its last two hex digits modulo SHARDS; 0 when it does not end in two."""
    suffix = key[-2:]
    if len(suffix) == 2 and suffix[0] in _HEX and suffix[1] in _HEX:
        return int(suffix, 16) % SHARDS
    return 0


def new_replica_id() -> str:
    """A tick replica's identity for leases: host, process and a random tail (a restarted process is new)."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{os.urandom(4).hex()}"


@dataclass(frozen=True)
class ShardScope:
    """The shards one replica works on during one tick."""

    shards: frozenset[int]

    @property
    def everything(self) -> bool:
        return len(self.shards) == SHARDS

    def holds(self, key: str) -> bool:
        return shard_of(key) in self.shards

    def clause(self, column: Any) -> ColumnElement[bool]:
        """SQL true exactly for the ids (`column`) in these shards (`shard_of` as an expression)."""
        if self.everything:
            return true()
        suffix = func.substr(column, func.length(column) - 1)
        mine = suffix.in_([s for i, s in enumerate(_SUFFIXES) if i % SHARDS in self.shards])
        if 0 in self.shards:  # ids that do not end in two hex digits are shard 0's
            return or_(mine, suffix.not_in(_SUFFIXES))
        return mine


EVERYTHING = ShardScope(frozenset(range(SHARDS)))


def claim_shards(engine: Engine, replica_id: str, now: datetime, lease: timedelta) -> ShardScope:
    """Heartbeat, renew, rebalance: the shards `replica_id` holds until `now + lease` (see the module doc)."""
    until = now + lease
    with engine.begin() as conn:
        _heartbeat(conn, replica_id, now)
        conn.execute(delete(_R).where(_R.c.seen_at < now - _STALE_REPLICA * lease))
        if conn.execute(select(func.count()).select_from(_S)).scalar_one() < SHARDS:
            _create_shards(conn)
    with engine.begin() as conn:
        live = conn.execute(select(func.count()).select_from(_R).where(_R.c.seen_at > now - lease)).scalar_one()
        share = math.ceil(SHARDS / max(1, live))
        held = set(
            conn.execute(
                update(_S).where(_S.c.owner == replica_id).values(until_at=until).returning(_S.c.shard)
            ).scalars()
        )
        if len(held) > share:
            excess = sorted(held)[share:]
            conn.execute(
                update(_S).where(_S.c.owner == replica_id, _S.c.shard.in_(excess)).values(owner=None, until_at=None)
            )
            held -= set(excess)
    if len(held) < share:
        with engine.begin() as conn:
            held |= _take_free(conn, replica_id, now, until, share - len(held))
    return ShardScope(frozenset(held))


def release_shards(engine: Engine, replica_id: str) -> None:
    """Give back every lease `replica_id` holds and drop its heartbeat (a replica stopping cleanly), so the
    others take its shards at their next tick instead of after the leases run out."""
    with engine.begin() as conn:
        conn.execute(update(_S).where(_S.c.owner == replica_id).values(owner=None, until_at=None))
        conn.execute(delete(_R).where(_R.c.replica_id == replica_id))


def _free(now: datetime) -> ColumnElement[bool]:
    return or_(_S.c.owner.is_(None), _S.c.until_at.is_(None), _S.c.until_at <= now)


def _take_free(conn: Connection, replica_id: str, now: datetime, until: datetime, wanted: int) -> set[int]:
    """One conditional UPDATE: up to `wanted` free shards (lowest numbers first) become `replica_id`'s."""
    candidates = select(_S.c.shard).where(_free(now)).order_by(_S.c.shard).limit(wanted)
    if conn.dialect.name == "postgresql":
        candidates = candidates.with_for_update(skip_locked=True)
    taken = conn.execute(
        update(_S)
        .where(_S.c.shard.in_(candidates), _free(now))
        .values(owner=replica_id, until_at=until)
        .returning(_S.c.shard)
    ).scalars()
    return set(taken)


def _heartbeat(conn: Connection, replica_id: str, now: datetime) -> None:
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(_R).values(
        replica_id=replica_id, seen_at=now
    )
    conn.execute(stmt.on_conflict_do_update(index_elements=["replica_id"], set_={"seen_at": now}))


def _create_shards(conn: Connection) -> None:
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(_S)
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["shard"]), [{"shard": i} for i in range(SHARDS)])
