"""The object-store contract checkpoint copies are written against, its value types and its typed errors.

Contract every adapter (S3, GCS, Azure Blob, local files) keeps:
- Keys are `/`-separated relative names inside one root (a directory, or a bucket/container and an optional key
  prefix); `uri(key)` gives the canonical URI (`s3://bucket/prefix/key`, `gs://...`, `az://...`, `file:///path`),
  percent-encoded, so `uri.parse_uri` gives the same key back.
  Every key given to a store passes `keys.safe_key` or is refused with `UnsafeKey`: no store reads or writes
  outside its root. Keys a store lists are relative to its root, as the store holds them (check them before
  using one as another store's key).
- `stat(key)` returns `None` for a missing object; reads of a missing object raise `ObjectNotFound`.
- `open_read(key, offset, chunk_size=..., version=...)` yields chunks of at most `chunk_size` bytes from `offset`
  to the end. Given the `version` from `stat`, a read of an object that changed since raises `SourceChanged`.
  The first request is made by the call itself, so a missing object fails before any chunk is consumed.
- Uploads are multipart and resumable: `begin_upload(key, size=, part_size=)` opens an `UploadSession` whose
  `token` (S3 upload id, GCS session URL, ...) is what a crashed copy persists; `resume_upload` reattaches to it,
  or raises `UploadGone` when the store has dropped it (then start again). Parts are numbered from 1, part `n`
  covers bytes `[(n-1)*part_size, n*part_size)`; every part but the last is exactly `part_size` long.
  Nothing is visible at `key` until `complete()` returns; `abort()` discards the staged data and converges.
- `delete(key)` converges: deleting a missing object is success.
- `digests_match(info, digests)` answers from a checksum the *store computed itself* from the bytes it holds:
  True/False when it has one, None when it has none it can vouch for (the caller must read the object back).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MiB = 1024 * 1024
DEFAULT_CHUNK_SIZE = 8 * MiB


class StorageError(Exception):
    """Base of every storage failure; `uri` names the object concerned when there is one."""

    retryable: bool = False

    def __init__(self, message: str, *, uri: str = "") -> None:
        super().__init__(message)
        self.uri = uri


class ObjectNotFound(StorageError):
    """The object (or its bucket/container) does not exist."""


class ChecksumMismatch(StorageError):
    """The bytes stored differ from the bytes sent: size or checksum disagree. The object must not be trusted."""

    def __init__(self, message: str, *, uri: str = "", expected: str = "", actual: str = "") -> None:
        super().__init__(message, uri=uri)
        self.expected = expected
        self.actual = actual


class SourceChanged(StorageError):
    """The object was replaced while it was being read; start the copy again from a fresh `stat`."""

    retryable = True


class UploadGone(StorageError):
    """The store no longer knows the upload session (completed, aborted or expired); begin a new one."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store says about one object.

    `version` changes whenever the content changes (S3 ETag, GCS generation, Azure ETag, local mtime+size) and
    pins reads. `md5`/`crc32c` are lowercase hex as the store reports them; whether the store computed them itself
    is the adapter's `digests_match` business (an Azure block blob's Content-MD5, for one, is whatever the writer
    claimed). `etag_is_md5` is True when the store derived `etag` from the content's MD5s (S3 without SSE-KMS or
    SSE-C: the MD5, or md5-of-part-md5s-N for a multipart object).
    """

    key: str
    size: int
    etag: str | None = None
    version: str | None = None
    md5: str | None = None
    crc32c: str | None = None
    etag_is_md5: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One part a store holds for an open upload. `etag` is the store's handle needed to complete (S3 ETag,
    Azure block id); `md5` is hex when the store knows the part's MD5 (S3 part ETag, Azure md5-bearing block id,
    local file), else None (GCS only reports a byte count).
    """

    number: int
    size: int
    etag: str = ""
    md5: str | None = None


@dataclass(frozen=True, slots=True)
class Digests:
    """Checksums of a whole object computed while it streamed through: SHA-256, MD5 and the MD5 of every part."""

    size: int
    sha256: str
    md5: str
    part_size: int
    part_md5s: tuple[str, ...]

    def multipart_etag(self) -> str:
        """The S3 multipart ETag of these bytes uploaded in these parts: md5(concat(part md5s))-N."""
        joined = b"".join(bytes.fromhex(m) for m in self.part_md5s)
        return f"{hashlib.md5(joined).hexdigest()}-{len(self.part_md5s)}"


class UploadSession(Protocol):
    """An open multipart upload of one object; see the module docstring for the numbering rules."""

    @property
    def token(self) -> str:
        """The serialisable handle `ObjectStore.resume_upload` accepts."""
        ...

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        """Store part `number`, replacing any earlier copy of it. `md5` (hex) lets stores that check a
        transfer checksum (S3 Content-MD5) do so without hashing again."""
        ...

    def completed_parts(self) -> list[PartInfo]:
        """The parts the store already holds, in order: what a resumed copy need not send again."""
        ...

    def complete(self, parts: Sequence[PartInfo], digests: Digests) -> None:
        """Make the object visible from `parts` (in order). `digests` describe the whole object; stores that
        can check or record them at commit do (GCS X-Goog-Hash, Azure Content-MD5 + sha256 metadata)."""
        ...

    def abort(self) -> None:
        """Discard everything staged. Idempotent."""
        ...


@runtime_checkable
class ObjectStore(Protocol):
    """One bucket, container or directory holding checkpoints. See the module docstring for the contract."""

    def uri(self, key: str) -> str: ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]: ...

    def begin_upload(self, key: str, *, size: int, part_size: int) -> UploadSession: ...

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> UploadSession: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None: ...


def part_count(size: int, part_size: int) -> int:
    """How many parts an object of `size` bytes has (an empty object still has none)."""
    return -(-size // part_size)


def part_length(number: int, size: int, part_size: int) -> int:
    """The length of part `number` (1-based) of an object of `size` bytes."""
    start = (number - 1) * part_size
    return max(0, min(part_size, size - start))
