"""Check that an object a store holds is the one that was sent: size first, then a checksum.

`Verify.AUTO` uses a checksum the destination computed itself from the bytes it holds when it has one (S3's ETag
without SSE-KMS, GCS's md5Hash) and reads the object back otherwise (Azure block blobs, local files).
`Verify.READ_BACK` always reads it back and compares SHA-256; reading back a cloud object from outside that cloud
is billed as its egress, which `Verification.bytes_read` reports.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from providers.storage.base import DEFAULT_CHUNK_SIZE, ChecksumMismatch, Digests, ObjectStore


class Verify(StrEnum):
    AUTO = "auto"
    READ_BACK = "read_back"


@dataclass(frozen=True, slots=True)
class Verification:
    """How an object was found intact: `method` is `store-checksum` or `read-back`."""

    method: str
    bytes_read: int


def verify_object(
    store: ObjectStore,
    key: str,
    digests: Digests,
    *,
    mode: Verify = Verify.AUTO,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Verification:
    """Raise `ChecksumMismatch` unless `store` holds at `key` exactly the bytes `digests` describe.

    `digests` must come from the upload that wrote the object (an S3 multipart ETag depends on the part size).
    """
    uri = store.uri(key)
    info = store.stat(key)
    if info is None:
        raise ChecksumMismatch(f"{uri} is missing although its upload completed", uri=uri)
    if info.size != digests.size:
        raise ChecksumMismatch(
            f"{uri} holds {info.size} bytes, {digests.size} were sent",
            uri=uri,
            expected=str(digests.size),
            actual=str(info.size),
        )
    if mode is Verify.AUTO:
        match = store.digests_match(info, digests)
        if match is True:
            return Verification(method="store-checksum", bytes_read=0)
        if match is False:
            raise ChecksumMismatch(
                f"{uri}: the store's checksum ({info.etag if info.etag_is_md5 else info.md5}) does not match the "
                f"bytes sent (md5 {digests.md5}); the object is corrupt",
                uri=uri,
                expected=digests.md5,
                actual=str(info.md5 or info.etag),
            )
    sha = hashlib.sha256()
    read = 0
    for chunk in store.open_read(key, chunk_size=chunk_size, version=info.version):
        sha.update(chunk)
        read += len(chunk)
    if read != digests.size or sha.hexdigest() != digests.sha256:
        raise ChecksumMismatch(
            f"{uri} read back as {read} bytes with SHA-256 {sha.hexdigest()}, sent {digests.size} bytes with "
            f"SHA-256 {digests.sha256}; the object is corrupt",
            uri=uri,
            expected=digests.sha256,
            actual=sha.hexdigest(),
        )
    return Verification(method="read-back", bytes_read=read)
