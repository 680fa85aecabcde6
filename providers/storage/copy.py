"""Copy one checkpoint object between any two `ObjectStore`s: streamed, bounded in memory, resumable, verified.

`copy_checkpoint` streams the source through a `PartReader` (at most ~2 parts in memory, reading part n+1 while
part n uploads), computes SHA-256 and MD5 on the way, uploads part by part, completes, then verifies the
destination (see `verify.py`). A corrupt destination is deleted, then `ChecksumMismatch` is raised.

Resume design. After `begin_upload` and after every part, a `CopyState` (source URI and version, size, part
size, destination token) is saved through the injected `CopyStateStore`. A running hash cannot be serialised,
and per-part hashes cannot be combined into a whole-object SHA-256, so a resumed copy re-reads the source from
byte 0: parts the destination already holds (asked of the store itself, which is authoritative: the saved state
can lag a part behind a crash) are hashed and compared, not sent again. Where the store knows a part's MD5
(S3 part ETag, Azure md5-bearing block id, local file) a part that differs is sent again; GCS only reports a byte
count, so its prefix is trusted and checked by the final md5Hash. The re-read prefix is source egress and is
counted in `CopyResult.egress_gb`; what resuming saves is the upload, not the download.

A state whose source version, size or part size no longer matches is dropped (its upload aborted) and the copy
starts over, as it does when the store has forgotten the upload (`UploadGone`). An exception from `progress`
or the network leaves the upload and its state in place for the next call; `SourceChanged` aborts both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from providers.storage.base import (
    DEFAULT_CHUNK_SIZE,
    ChecksumMismatch,
    Digests,
    MiB,
    ObjectNotFound,
    ObjectStore,
    PartInfo,
    SourceChanged,
    StorageError,
    UploadSession,
)
from providers.storage.parts import PartReader
from providers.storage.state import CopyState, CopyStateStore, copy_id_for
from providers.storage.verify import Verify, verify_object

log = logging.getLogger(__name__)

MAX_PARTS = 10_000  # S3's limit; Azure allows 50,000 blocks, GCS has no part limit
MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
PART_ALIGN = 256 * 1024  # GCS needs every non-final chunk to be a multiple of 256 KiB
BYTES_PER_GB = Decimal(2**30)  # AWS and GCP bill data transfer per GiB ("GB" in AWS price lists)

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CopyResult:
    """What one `copy_checkpoint` call did. `egress_gb` is bytes read from the source (resumed prefixes included)
    in GiB, to price at the source's egress rate; `verify_read_bytes` were read back from the destination.
    `digests` (with per-part MD5s) let `verify_object` re-check the destination later."""

    src_uri: str
    dst_uri: str
    bytes: int
    seconds: float
    sha256: str
    md5: str
    resumed_from_bytes: int
    egress_gb: Decimal
    verified_by: str
    verify_read_bytes: int
    digests: Digests

    @property
    def mib_per_s(self) -> float:
        return self.bytes / MiB / self.seconds if self.seconds > 0 else 0.0


def choose_part_size(size: int, chunk_size: int) -> int:
    """`chunk_size`, grown in whole MiB when the object would need more than `MAX_PARTS` parts."""
    if chunk_size < MIN_PART_SIZE or chunk_size % PART_ALIGN:
        raise ValueError(f"chunk_size must be >= {MIN_PART_SIZE} and a multiple of {PART_ALIGN}, not {chunk_size}")
    needed = -(-size // MAX_PARTS)
    return max(chunk_size, -(-needed // MiB) * MiB)


def copy_checkpoint(
    src: ObjectStore,
    src_key: str,
    dst: ObjectStore,
    dst_key: str,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    state: CopyStateStore | None = None,
    progress: Progress | None = None,
    copy_id: str | None = None,
    verify: Verify = Verify.AUTO,
    clock: Callable[[], float] = time.monotonic,
) -> CopyResult:
    """Copy `src_key` from `src` to `dst_key` in `dst`; see the module docstring for resume and verification.

    `progress(bytes_done, total)` is called after every part; an exception it raises stops the copy, leaving it
    resumable. Raises `ObjectNotFound` for a missing source and `ChecksumMismatch` for a corrupt result.
    """
    started = clock()
    src_uri, dst_uri = src.uri(src_key), dst.uri(dst_key)
    info = src.stat(src_key)
    if info is None:
        raise ObjectNotFound(
            f"checkpoint {src_uri} does not exist, so it cannot be copied to {dst_uri}; check the URI, and that the "
            "job has written a checkpoint there",
            uri=src_uri,
        )
    part_size = choose_part_size(info.size, chunk_size)
    cid = copy_id or copy_id_for(src_uri, dst_uri)
    fresh = CopyState(src_uri, dst_uri, info.size, info.version, part_size, token="")
    session, saved, resuming = _open_session(dst, dst_key, fresh, cid, state)
    held = {p.number: p for p in session.completed_parts()} if resuming else {}
    reader = PartReader(
        src.open_read(src_key, chunk_size=chunk_size, version=info.version),
        size=info.size,
        part_size=part_size,
        uri=src_uri,
    )
    parts: list[PartInfo] = []
    done = resumed = 0
    try:
        for part in reader:
            have = held.get(part.number)
            if have is not None and have.size == len(part.data) and have.md5 in (None, part.md5):
                parts.append(have)
                resumed += have.size
            else:
                parts.append(session.upload_part(part.number, part.data, md5=part.md5))
                if state is not None:
                    state.save(cid, saved.with_progress(done + len(part.data)))
            done += len(part.data)
            if progress is not None:
                progress(done, info.size)
    except SourceChanged:
        _drop(session, state, cid)
        raise
    finally:
        reader.close()
    digests = reader.digests()
    try:
        session.complete(parts, digests)
        check = verify_object(dst, dst_key, digests, mode=verify, chunk_size=chunk_size)
    except ChecksumMismatch:
        log.error("checkpoint copy %s -> %s is corrupt; deleting the destination", src_uri, dst_uri)
        dst.delete(dst_key)
        if state is not None:
            state.delete(cid)
        raise
    if state is not None:
        state.delete(cid)
    seconds = clock() - started
    log.info(
        "copied checkpoint %s -> %s: %d bytes in %.2fs, %d resumed, verified by %s",
        src_uri,
        dst_uri,
        info.size,
        seconds,
        resumed,
        check.method,
    )
    return CopyResult(
        src_uri=src_uri,
        dst_uri=dst_uri,
        bytes=info.size,
        seconds=seconds,
        sha256=digests.sha256,
        md5=digests.md5,
        resumed_from_bytes=resumed,
        egress_gb=Decimal(reader.bytes_read) / BYTES_PER_GB,
        verified_by=check.method,
        verify_read_bytes=check.bytes_read,
        digests=digests,
    )


def _open_session(
    dst: ObjectStore, key: str, fresh: CopyState, cid: str, state: CopyStateStore | None
) -> tuple[UploadSession, CopyState, bool]:
    """Reattach to the saved upload when it still fits the source (True), else begin and save a new one."""
    saved = state.load(cid) if state is not None else None
    if saved is not None:
        fits = (saved.src_uri, saved.dst_uri, saved.size, saved.src_version, saved.part_size) == (
            fresh.src_uri,
            fresh.dst_uri,
            fresh.size,
            fresh.src_version,
            fresh.part_size,
        )
        try:
            session = dst.resume_upload(key, saved.token, size=saved.size, part_size=saved.part_size)
        except StorageError as exc:
            log.warning("cannot resume the copy to %s (%s); starting over", fresh.dst_uri, exc)
        else:
            if fits:
                log.info("resuming the copy to %s (%d bytes done before)", fresh.dst_uri, saved.bytes_done)
                return session, saved, True
            log.warning("the source of %s changed since the interrupted copy; starting over", fresh.dst_uri)
            session.abort()
    session = dst.begin_upload(key, size=fresh.size, part_size=fresh.part_size)
    started = CopyState(
        fresh.src_uri, fresh.dst_uri, fresh.size, fresh.src_version, fresh.part_size, token=session.token
    )
    if state is not None:
        state.save(cid, started)
    return session, started, False


def _drop(session: UploadSession, state: CopyStateStore | None, cid: str) -> None:
    try:
        session.abort()
    finally:
        if state is not None:
            state.delete(cid)
