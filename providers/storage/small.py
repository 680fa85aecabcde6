"""Small objects in any `ObjectStore`: write one in a single part, read one whole with a size bound.

For the broker's own small files (the instance agent's wheel, an attempt's spec), where the streaming, resumable
`copy_checkpoint` machinery is more than needed. Both go through the store's confinement like every other call:
`key` passes `safe_key` beneath the store's root.

- `put_object(store, key, data)` uploads `data` as a one-part upload and completes it with the data's digests, so
  stores that check a part's MD5 (S3 Content-MD5, Azure block MD5) or the whole object's (GCS X-Goog-Hash) do.
  Nothing is visible at `key` until it completes; on a failure the upload is aborted and the error re-raised.
- `read_object(store, key, limit)` returns the object's bytes, or None when it is missing; an object larger than
  `limit` raises `StorageError` without being read.
"""

from __future__ import annotations

import hashlib

from providers.storage.base import Digests, ObjectStore, StorageError


def put_object(store: ObjectStore, key: str, data: bytes) -> None:
    """Write `data` at `key` (replacing what is there). Raises `StorageError` (or `UnsafeKey`)."""
    md5 = hashlib.md5(data).hexdigest()
    part_size = max(1, len(data))
    digests = Digests(len(data), hashlib.sha256(data).hexdigest(), md5, part_size, (md5,) if data else ())
    upload = store.begin_upload(key, size=len(data), part_size=part_size)
    try:
        parts = [upload.upload_part(1, data, md5=md5)] if data else []
        upload.complete(parts, digests)
    except StorageError:
        upload.abort()
        raise


def read_object(store: ObjectStore, key: str, limit: int) -> bytes | None:
    """The bytes at `key`, None when there is no such object; `StorageError` when it is over `limit` bytes."""
    info = store.stat(key)
    if info is None:
        return None
    if info.size > limit:
        raise StorageError(f"{store.uri(key)} is {info.size} bytes, over the {limit} byte limit", uri=store.uri(key))
    return b"".join(store.open_read(key, version=info.version))
