"""A job's output: the log chunks the instance agent writes to the attempt's log prefix in the job's store.

The agent writes the workload's stdout and stderr, merged in arrival order, as chunks under
`<attempt prefix>logs/` named by the byte offset they start at (`agent.protocol.log_chunk_name`). Readers here:
- `attempt_of(engine, tenant, job_id, attempt)`: the placement whose log is read: the one named (a placement of
  this job; 404 otherwise), else the job's latest attempt that runs the agent (None while it has none: an empty
  log). 404 for a job of another tenant.
- `read_log(stores, attempt_uri, offset, limit)`: the bytes from `offset`, at most `limit`, from the chunks in
  order, stopping at a gap (a chunk the agent has not stored yet: the next read gets it), and the offset to read
  from next. Readable while the attempt runs and after its instance is gone: the chunks stay in the store.
- `log_size(stores, attempt_uri)`: how much of the log is stored from the start (for reading its tail).
- `follow_log(...)`: an async iterator of the log as it grows, until the attempt has ended and everything is read,
  the client has gone, or `max_seconds` have passed. It holds no thread between polls (each poll's blocking reads
  run on the caller's own small thread pool), and an idle log is polled less and less often, so thousands of idle
  followers cost the process little.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from agent import protocol as proto
from broker.config.checkpoint_stores import CheckpointStores
from broker.services.agent_reports import LIVE
from broker.services.errors import NotFoundError
from broker.store.tables import Job, Placement

READ_LIMIT = 1024 * 1024  # bytes per answer (or per streamed piece)


def attempt_of(engine: Engine, tenant: str, job_id: str, attempt: str | None) -> tuple[Placement | None, bool]:
    """(the placement whose log is read, whether it has ended); see the module docstring. (None, False) for a job
    that has no attempt with a log yet, when none is named."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        if job is None or job.tenant != tenant:
            raise NotFoundError("job", job_id)
        query = select(Placement).where(Placement.job_id == job_id, col(Placement.attempt_uri).is_not(None))
        if attempt is not None:
            p = session.exec(query.where(Placement.id == attempt)).first()
        else:
            p = session.exec(query.order_by(col(Placement.created_at).desc(), col(Placement.id).desc())).first()
    if p is None:
        if attempt is not None:
            raise NotFoundError("attempt", attempt)
        return None, False
    return p, p.state not in LIVE


def log_size(stores: CheckpointStores, attempt_uri: str) -> int:
    """How many bytes of the log are stored without a gap from the start. Raises StorageError."""
    size = 0
    for start, _, length in _chunks(stores, attempt_uri):
        if start > size:
            break
        size = max(size, start + length)
    return size


def _chunks(stores: CheckpointStores, attempt_uri: str) -> list[tuple[int, str, int]]:
    store = stores.store(attempt_uri + proto.LOGS_DIR)
    return sorted(
        (start, info.key, info.size)
        for info in store.list("")
        if (start := proto.parse_log_chunk_name(info.key)) is not None
    )


def read_log(stores: CheckpointStores, attempt_uri: str, offset: int, limit: int = READ_LIMIT) -> tuple[bytes, int]:
    """(up to `limit` bytes of the log from `offset`, the offset after them). Raises StorageError."""
    store = stores.store(attempt_uri + proto.LOGS_DIR)
    chunks = _chunks(stores, attempt_uri)
    out = bytearray()
    position = offset
    for start, key, size in chunks:
        end = start + size
        if end <= position:
            continue
        if start > position:
            break  # a gap: that chunk is not stored yet
        for piece in store.open_read(key, position - start):
            out += piece
            if len(out) >= limit:  # never more than one answer's worth in memory, however big a chunk is
                break
        position = end
        if len(out) >= limit:
            del out[limit:]
            break
    return bytes(out), offset + len(out)


async def follow_log(
    poll: Callable[[int], Awaitable[tuple[bytes, int, bool]]],
    offset: int,
    *,
    disconnected: Callable[[], Awaitable[bool]],
    poll_seconds: float = 1.0,
    max_poll_seconds: float = 5.0,
    max_seconds: float = 24 * 3600,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
) -> AsyncIterator[bytes]:
    """Yield the log from `offset` as it grows.

    `poll(offset)` returns (the bytes from `offset`, the offset after them, whether the attempt had ended before
    they were read). The stream stops once a poll that began after the attempt ended finds nothing new (everything
    is read), once `disconnected()` says the client has gone, or after `max_seconds`. Between polls that find
    nothing it sleeps (holding no thread): `poll_seconds` at first, doubling up to `max_poll_seconds` while the log
    stays idle, back to `poll_seconds` once it grows."""
    deadline = clock() + max_seconds
    wait = poll_seconds
    while True:
        data, offset, done = await poll(offset)
        if data:
            yield data
            wait = poll_seconds
            continue
        if done or clock() > deadline:
            return
        await sleep(wait)
        if await disconnected():  # no poll for a client that has gone
            return
        wait = min(max_poll_seconds, wait * 2)
