"""Checkpoints in one Google Cloud Storage bucket (or gcp-storage-emulator), through an injected storage.Client.

Uploads are JSON-API resumable uploads. `Blob.create_resumable_upload_session` opens the session; its URL is the
token a crashed copy persists (treat it like a credential: for a week anyone holding it can write the object).
Parts are PUT to that URL with `Content-Range: bytes a-b/*`, and the session `recover()`s by asking the server
how many bytes it has persisted (`Content-Range: bytes */*` -> 308 + `Range`); a part is sent from that offset
on, so bytes the server already holds are never sent twice. The last part is held back and sent by `complete()`
with the object's total size and `X-Goog-Hash: md5=...`, so the object appears only at `complete()` and real
GCS refuses to finalise bytes whose MD5 differs (the emulator ignores the header). GCS only reports a byte count,
so resumed parts carry no MD5.

Checksums: GCS computes `md5Hash` and `crc32c` of every object it stores from the bytes (composites have only
crc32c), so `digests_match` compares `md5Hash` and needs no read-back. Reads are one ranged media download per
`chunk_size`, pinned to the generation seen first.

Confinement: the store is one bucket, or one name prefix in it (`prefix`, empty or ending in `/`). Every key it
is given is checked by `safe_key` and used as `prefix + key`; keys it returns are relative to the prefix.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

import requests
from google.api_core.exceptions import GoogleAPICallError, NotFound
from google.cloud.storage import Client

from providers.storage.base import (
    DEFAULT_CHUNK_SIZE,
    ChecksumMismatch,
    Digests,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    SourceChanged,
    StorageError,
    UploadGone,
    part_count,
    part_length,
)
from providers.storage.keys import join_key, safe_list_prefix, safe_store_prefix

HTTP_TIMEOUT = (10.0, 300.0)


def _hex(b64: str | None) -> str | None:
    return base64.b64decode(b64).hex() if b64 else None


class GCSStore:
    """One bucket, or the objects under `prefix` in it. `http` sends the session's PUTs (the session URL is its
    own authorisation)."""

    def __init__(self, client: Client, bucket: str, *, prefix: str = "", http: requests.Session | None = None) -> None:
        self.client = client
        self.bucket = client.bucket(bucket)
        self.prefix = safe_store_prefix(prefix)
        self.http = http or requests.Session()

    def uri(self, key: str) -> str:
        return f"gs://{self.bucket.name}/{quote(self.prefix + key, safe='/')}"

    def name(self, key: str) -> str:
        """The object name of `key`: checked by `safe_key`, beneath the store's prefix."""
        return join_key(self.prefix, key)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            blob = self.bucket.get_blob(self.name(key))
        except GoogleAPICallError as exc:
            raise StorageError(f"GCS get of {self.uri(key)} failed: {exc}", uri=self.uri(key)) from exc
        if blob is None:
            return None
        return ObjectInfo(
            key=key,
            size=int(blob.size or 0),
            etag=blob.etag,
            version=str(blob.generation),
            md5=_hex(blob.md5_hash),
            crc32c=_hex(blob.crc32c),
            metadata=dict(blob.metadata or {}),
        )

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]:
        uri = self.uri(key)
        info = self.stat(key)
        if info is None:
            raise ObjectNotFound(f"{uri} does not exist", uri=uri)
        if version is not None and info.version != version:
            raise SourceChanged(f"{uri} is generation {info.version}, not {version}", uri=uri)
        return self._chunks(key, int(info.version or 0), info.size, offset, chunk_size)

    def _chunks(self, key: str, generation: int, size: int, offset: int, chunk_size: int) -> Iterator[bytes]:
        blob = self.bucket.blob(self.name(key), generation=generation)
        while offset < size:
            end = min(offset + chunk_size, size) - 1
            try:
                data = blob.download_as_bytes(start=offset, end=end, raw_download=True, checksum=None)
            except NotFound as exc:
                raise SourceChanged(f"{self.uri(key)} generation {generation} is gone", uri=self.uri(key)) from exc
            except GoogleAPICallError as exc:
                raise StorageError(f"GCS read of {self.uri(key)} failed: {exc}", uri=self.uri(key)) from exc
            offset += len(data)
            if not data:
                raise StorageError(f"GCS returned no bytes at {offset} of {self.uri(key)}", uri=self.uri(key))
            yield data

    def begin_upload(self, key: str, *, size: int, part_size: int) -> GCSUpload:
        try:
            url = self.bucket.blob(self.name(key)).create_resumable_upload_session(
                content_type="application/octet-stream", size=size, checksum=None
            )
        except GoogleAPICallError as exc:
            raise StorageError(f"GCS could not open an upload to {self.uri(key)}: {exc}", uri=self.uri(key)) from exc
        return GCSUpload(self, key, url, size=size, part_size=part_size)

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> GCSUpload:
        upload = GCSUpload(self, key, token, size=size, part_size=part_size)
        upload.recover()
        return upload

    def delete(self, key: str) -> None:
        try:
            self.bucket.blob(self.name(key)).delete()
        except NotFound:
            return
        except GoogleAPICallError as exc:
            raise StorageError(f"GCS delete of {self.uri(key)} failed: {exc}", uri=self.uri(key)) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects under `prefix`, keys relative to the store's prefix (as GCS names them: callers that turn a
        listed key into a path or a new key check it with `safe_key`)."""
        full = self.prefix + safe_list_prefix(prefix)
        try:
            for blob in self.client.list_blobs(self.bucket, prefix=full or None):
                key = str(blob.name)[len(self.prefix) :]
                yield ObjectInfo(key=key, size=int(blob.size or 0), etag=blob.etag, version=str(blob.generation))
        except GoogleAPICallError as exc:
            raise StorageError(f"GCS list of {self.uri(prefix)} failed: {exc}", uri=self.uri(prefix)) from exc

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None:
        return None if info.md5 is None else info.md5 == digests.md5


class GCSUpload:
    """One resumable upload session; the token is its URL."""

    def __init__(self, store: GCSStore, key: str, url: str, *, size: int, part_size: int) -> None:
        self._store = store
        self._key = key
        self._name = store.name(key)
        self._url = url
        self._size = size
        self._part_size = part_size
        self._persisted = 0
        self._tail = b""
        self._done = False
        self._final: dict[str, Any] = {}  # the object resource GCS returns when the upload finishes

    @property
    def token(self) -> str:
        return self._url

    @property
    def _uri(self) -> str:
        return self._store.uri(self._key)

    def _put(self, data: bytes, content_range: str, extra: dict[str, str] | None = None) -> requests.Response:
        headers = {"Content-Range": content_range, **(extra or {})}
        try:
            resp = self._store.http.put(self._url, data=data, headers=headers, timeout=HTTP_TIMEOUT)
        except requests.RequestException as exc:
            raise StorageError(f"GCS upload to {self._uri} failed: {exc}", uri=self._uri) from exc
        if resp.status_code in (404, 410):
            raise UploadGone(f"the GCS upload session for {self._uri} is gone ({resp.status_code})", uri=self._uri)
        if resp.status_code == 308:
            rng = resp.headers.get("Range", "")
            self._persisted = int(rng.rsplit("-", 1)[1]) + 1 if rng else 0
        elif resp.status_code in (200, 201):
            self._persisted, self._done = self._size, True
            self._final = resp.json() if resp.content else {}
        elif resp.status_code == 400 and "hash" in resp.text.lower():
            raise ChecksumMismatch(f"GCS refused {self._uri}: {resp.text[:300]}", uri=self._uri)
        else:
            raise StorageError(f"GCS upload to {self._uri} got {resp.status_code}: {resp.text[:300]}", uri=self._uri)
        return resp

    def recover(self) -> int:
        """Ask the server how many bytes it holds (the resumable-upload status query)."""
        self._put(b"", "bytes */*")
        return self._persisted

    def _send(self, data: bytes, start: int, *, total: int | None = None, extra: dict[str, str] | None = None) -> None:
        """Send `data` (bytes `start..`) from whatever offset the server has reached; with `total`, as the final
        chunk. The server may persist less than it was sent (308 + shorter Range): send the rest again."""
        end = start + len(data)
        size = "*" if total is None else str(total)
        while self._persisted < end or (total is not None and not self._done):
            before = self._persisted
            if before < start:
                raise StorageError(f"GCS holds {before} bytes of {self._uri}, the next bytes start at {start}")
            body = data[before - start :] if before > start else data
            span = f"{before}-{end - 1}" if body else "*"
            self._put(body, f"bytes {span}/{size}", extra)
            if self._persisted == before and not self._done:
                raise StorageError(f"GCS accepted none of the bytes from {before} of {self._uri}", uri=self._uri)

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        start = (number - 1) * self._part_size
        if number == part_count(self._size, self._part_size):
            self._tail = data  # the final chunk carries the total size and the hash: sent by complete()
        else:
            self._send(data, start)
        return PartInfo(number=number, size=len(data), md5=md5)

    def completed_parts(self) -> list[PartInfo]:
        if not self._done:
            self.recover()
        count = part_count(self._size, self._part_size)
        full = count if self._done else min(self._persisted // self._part_size, max(count - 1, 0))
        return [PartInfo(number=n, size=part_length(n, self._size, self._part_size)) for n in range(1, full + 1)]

    def complete(self, parts: Sequence[PartInfo], digests: Digests) -> None:
        if not self._done:
            md5 = base64.b64encode(bytes.fromhex(digests.md5)).decode()
            self._send(self._tail, self._size - len(self._tail), total=self._size, extra={"X-Goog-Hash": f"md5={md5}"})
            self._tail = b""
            stored = _hex(self._final.get("md5Hash")) if self._final else None
            if stored is not None and stored != digests.md5:
                raise ChecksumMismatch(
                    f"GCS stored {self._uri} with MD5 {stored}, sent {digests.md5}",
                    uri=self._uri,
                    expected=digests.md5,
                    actual=stored,
                )
        blob = self._store.bucket.blob(self._name)
        blob.metadata = {"sha256": digests.sha256}
        try:
            blob.patch()
        except GoogleAPICallError as exc:
            raise StorageError(f"GCS could not record the SHA-256 of {self._uri}: {exc}", uri=self._uri) from exc

    def abort(self) -> None:
        try:
            self._store.http.delete(self._url, timeout=HTTP_TIMEOUT)  # 499 on GCS, 501 on the emulator: both fine
        except requests.RequestException as exc:
            raise StorageError(f"GCS could not cancel the upload to {self._uri}: {exc}", uri=self._uri) from exc
