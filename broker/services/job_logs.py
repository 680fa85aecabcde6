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
- `LogWatch`: what a followed log looks like now (ended? how long?), one look per attempt per interval shared
  by all its followers, so N followers of one idle log cost one database read and one listing per interval.
- `follow_log(...)`: an async iterator of the log as it grows, until the attempt has ended and everything is read,
  the client has gone, or `max_seconds` have passed. It holds no thread between polls (each poll's blocking reads
  run on the caller's own small thread pool), and an idle log is polled less and less often, so thousands of idle
  followers cost the process little.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.to_thread
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
    jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
) -> AsyncIterator[bytes]:
    """Yield the log from `offset` as it grows.

    `poll(offset)` returns (the bytes from `offset`, the offset after them, whether the attempt had ended before
    they were read). The stream stops once a poll that began after the attempt ended finds nothing new (everything
    is read), once `disconnected()` says the client has gone, or after `max_seconds`. Between polls that find
    nothing it sleeps (holding no thread): `poll_seconds` at first, doubling up to `max_poll_seconds` while the log
    stays idle, back to `poll_seconds` once it grows; each sleep scaled by `jitter()`, so followers that started
    together do not all wake together."""
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
        await sleep(wait * jitter())
        if await disconnected():  # no poll for a client that has gone
            return
        wait = min(max_poll_seconds, wait * 2)


class LogWatch:
    """The followed logs' shared view of their attempts (one per API process).

    `await poll(placement_id, attempt_uri, offset)` returns what `follow_log`'s `poll` does: (the log's bytes from
    `offset`, the offset after them, whether the attempt had ended before they were read). The attempt's state and
    the log's stored length are looked at once per `fresh_seconds` per attempt, whatever the number of its
    followers (concurrent callers share one look); bytes are read only when the log is longer than `offset`. Every
    blocking call runs in a worker thread under `limiter` (the followers' own pool). Raises StorageError as
    `read_log` does."""

    def __init__(
        self,
        engine: Engine,
        stores: CheckpointStores,
        limiter: anyio.CapacityLimiter,
        *,
        fresh_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.stores = stores
        self.limiter = limiter
        self.fresh_seconds = fresh_seconds
        self.clock = clock
        self.looks = 0  # looks taken (database read + listing), for tests and the benchmark
        self._seen: dict[str, tuple[float, bool, int]] = {}  # placement id -> (when, ended, log size)
        self._looking: dict[str, anyio.Event] = {}

    async def poll(self, placement_id: str, attempt_uri: str, offset: int) -> tuple[bytes, int, bool]:
        ended, size = await self._look(placement_id, attempt_uri)
        if size <= offset:
            return b"", offset, ended
        data, next_offset = await anyio.to_thread.run_sync(
            read_log, self.stores, attempt_uri, offset, limiter=self.limiter
        )
        return data, next_offset, ended

    async def _look(self, placement_id: str, attempt_uri: str) -> tuple[bool, int]:
        while True:
            seen = self._seen.get(placement_id)
            if seen is not None and self.clock() - seen[0] < self.fresh_seconds:
                return seen[1], seen[2]
            looking = self._looking.get(placement_id)
            if looking is None:
                break
            await looking.wait()  # another follower of this attempt is looking: share its answer
        done = self._looking[placement_id] = anyio.Event()
        try:
            at = self.clock()
            ended, size = await anyio.to_thread.run_sync(
                self._look_now, placement_id, attempt_uri, limiter=self.limiter
            )
            self.looks += 1
            self._seen[placement_id] = (at, ended, size)
            if len(self._seen) > 10_000:
                self._forget_stale()
            return ended, size
        finally:
            del self._looking[placement_id]
            done.set()

    def _look_now(self, placement_id: str, attempt_uri: str) -> tuple[bool, int]:
        """(the attempt has ended, the log's stored length), the state read before the listing."""
        with Session(self.engine) as session:
            row = session.get(Placement, placement_id)
        ended = row is None or row.state not in LIVE
        return ended, log_size(self.stores, attempt_uri)

    def _forget_stale(self) -> None:
        now = self.clock()
        for pid in [pid for pid, (at, _, _) in self._seen.items() if now - at >= self.fresh_seconds]:
            del self._seen[pid]
