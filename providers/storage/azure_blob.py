"""Checkpoints in one Azure Blob container (or Azurite), through an injected azure-storage-blob ContainerClient.

Uploads stage blocks and commit a block list. Block ids are deterministic: `<part number:05d>-<part md5 hex>`,
so there is no session to remember (the token is only a label): a crashed copy resumes by listing the blob's
uncommitted blocks (`get_block_list("uncommitted")`, which works before the blob exists and survives an Azurite
restart) and keeps those whose number, size and MD5 match what the source holds. Azure drops uncommitted blocks
after 7 days, and committing discards any staged block not in the list.

Checksums: each block is sent with `validate_content=True`, so the service checks that block's MD5 in transit.
The whole blob's Content-MD5 is set at commit from the copy's digests (with the SHA-256 in metadata `sha256`),
but Azure stores a commit-time MD5 as given and checks nothing, so `digests_match` is None: read the blob back.
Reads are ranged `download_blob(offset, length)` windows of `chunk_size`, pinned to one ETag.

Confinement: the store is one container, or one name prefix in it (`prefix`, empty or ending in `/`). Every key
it is given is checked by `safe_key` and used as `prefix + key`; keys it returns are relative to the prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobBlock, BlobClient, ContainerClient, ContentSettings, StorageStreamDownloader

from providers.storage.base import (
    DEFAULT_CHUNK_SIZE,
    ChecksumMismatch,
    Digests,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    SourceChanged,
    StorageError,
)
from providers.storage.keys import join_key, safe_list_prefix, safe_store_prefix

UPLOAD_TOKEN = "azure-block-list"


def block_id(number: int, md5: str) -> str:
    """The deterministic id of part `number` with content MD5 `md5` (the SDK base64-encodes it on the wire)."""
    return f"{number:05d}-{md5}"


class AzureBlobStore:
    """One container. Build the service client with `max_single_get_size`/`max_chunk_get_size` <= the copy's
    chunk size to keep the SDK's read buffers within the copy's memory bound."""

    def __init__(self, container: ContainerClient, *, prefix: str = "") -> None:
        self.container = container
        self.name = container.container_name
        self.prefix = safe_store_prefix(prefix)

    def uri(self, key: str) -> str:
        return f"az://{self.name}/{quote(self.prefix + key, safe='/')}"

    def blob(self, key: str) -> BlobClient:
        """The client of `key`'s blob: its name checked by `safe_key`, beneath the store's prefix."""
        return self.container.get_blob_client(join_key(self.prefix, key))

    def _error(self, key: str, what: str, exc: AzureError) -> StorageError:
        uri = self.uri(key)
        if isinstance(exc, ResourceNotFoundError):
            return ObjectNotFound(f"{uri} does not exist ({getattr(exc, 'error_code', '')})", uri=uri)
        if isinstance(exc, ResourceModifiedError):
            return SourceChanged(f"{uri} changed while it was being read", uri=uri)
        code = str(getattr(exc, "error_code", "") or "")
        if code == "Md5Mismatch" or "contentMD5" in str(exc):
            return ChecksumMismatch(f"Azure rejected a block of {uri}: {code}", uri=uri)
        return StorageError(f"Azure {what} of {uri} failed: {exc}", uri=uri)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            props = self.blob(key).get_blob_properties()
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise self._error(key, "get_blob_properties", exc) from exc
        md5 = props.content_settings.content_md5
        return ObjectInfo(
            key=key,
            size=int(props.size),
            etag=props.etag,
            version=props.etag,
            md5=bytes(md5).hex() if md5 else None,
            metadata=dict(props.metadata or {}),
        )

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]:
        blob = self.blob(key)
        condition = MatchConditions.IfNotModified if version else None
        try:
            first = blob.download_blob(
                offset=offset, length=chunk_size, max_concurrency=1, etag=version, match_condition=condition
            )
        except HttpResponseError as exc:
            if getattr(exc, "status_code", None) == 416:  # offset at or past the end
                return iter(())
            raise self._error(key, "download", exc) from exc
        except AzureError as exc:
            raise self._error(key, "download", exc) from exc
        return self._windows(key, first, offset, chunk_size)

    def _windows(
        self, key: str, first: StorageStreamDownloader[bytes], offset: int, chunk_size: int
    ) -> Iterator[bytes]:
        """One ranged GET per window; no downloader outlives its window, so at most one window's buffer is held."""
        blob = self.blob(key)
        etag = first.properties.etag
        # properties.size is the size of this range; the blob's size ends the Content-Range the SDK fills in
        size = int(str(first.properties.content_range).rsplit("/", 1)[1])
        download: StorageStreamDownloader[bytes] | None = first
        del first
        try:
            while download is not None and offset < size:
                chunks, download = download.chunks(), None
                yield from chunks
                del chunks
                offset += chunk_size
                if offset < size:
                    download = blob.download_blob(
                        offset=offset,
                        length=chunk_size,
                        max_concurrency=1,
                        etag=etag,
                        match_condition=MatchConditions.IfNotModified,
                    )
        except AzureError as exc:
            raise self._error(key, "download", exc) from exc

    def begin_upload(self, key: str, *, size: int, part_size: int) -> AzureUpload:
        return AzureUpload(self, key)

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> AzureUpload:
        return AzureUpload(self, key)

    def delete(self, key: str) -> None:
        try:
            self.blob(key).delete_blob()
        except ResourceNotFoundError:
            return
        except AzureError as exc:
            raise self._error(key, "delete", exc) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Blobs under `prefix`, keys relative to the store's prefix (as Azure names them: callers that turn a
        listed key into a path or a new key check it with `safe_key`)."""
        full = self.prefix + safe_list_prefix(prefix)
        try:
            for props in self.container.list_blobs(name_starts_with=full or None):
                key = str(props.name)[len(self.prefix) :]
                yield ObjectInfo(key=key, size=int(props.size), etag=props.etag, version=props.etag)
        except AzureError as exc:
            raise self._error(prefix, "list", exc) from exc

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None:
        return None  # a block blob's Content-MD5 is the writer's claim, not the service's computation


class AzureUpload:
    """Blocks staged under deterministic ids; see `AzureBlobStore`."""

    def __init__(self, store: AzureBlobStore, key: str) -> None:
        self._store = store
        self._key = key
        self._blob = store.blob(key)

    @property
    def token(self) -> str:
        return UPLOAD_TOKEN

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        if md5 is None:
            md5 = hashlib.md5(data).hexdigest()
        bid = block_id(number, md5)
        try:
            self._blob.stage_block(bid, data, length=len(data), validate_content=True)
        except AzureError as exc:
            raise self._store._error(self._key, f"stage_block {number}", exc) from exc
        return PartInfo(number=number, size=len(data), etag=bid, md5=md5)

    def completed_parts(self) -> list[PartInfo]:
        try:
            _committed, uncommitted = self._blob.get_block_list("uncommitted")
        except ResourceNotFoundError:
            return []  # nothing staged and no blob yet
        except AzureError as exc:
            raise self._store._error(self._key, "get_block_list", exc) from exc
        parts: list[PartInfo] = []
        for block in uncommitted:
            number, _, md5 = str(block.id).partition("-")
            if number.isdigit() and len(md5) == 32:
                parts.append(PartInfo(number=int(number), size=int(block.size), etag=str(block.id), md5=md5))
        return sorted(parts, key=lambda p: p.number)

    def complete(self, parts: Sequence[PartInfo], digests: Digests) -> None:
        settings = ContentSettings(
            content_type="application/octet-stream", content_md5=bytearray(bytes.fromhex(digests.md5))
        )
        try:
            self._blob.commit_block_list(
                [BlobBlock(block_id=p.etag) for p in parts],
                content_settings=settings,
                metadata={"sha256": digests.sha256},
            )
        except AzureError as exc:
            raise self._store._error(self._key, "commit_block_list", exc) from exc

    def abort(self) -> None:
        # Uncommitted blocks cannot be deleted one by one; the service drops them after 7 days, or at the next
        # commit to this blob. Nothing to do that would not also touch a committed blob at this key.
        return None
