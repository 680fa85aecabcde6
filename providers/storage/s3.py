"""Checkpoints in one S3 bucket (or an S3-compatible server such as moto), through an injected boto3 client.

Uploads are S3 multipart uploads: the session token is the UploadId, `completed_parts` is `list_parts`
(paginated), so a crashed copy resumes by asking S3 what it already holds; every part is sent with Content-MD5,
which AWS checks (moto does not). Reads are one streaming `get_object` with `Range` from the offset and `IfMatch`
on the ETag seen by `stat`.

Checksums: without SSE-KMS/SSE-C an S3 ETag is computed by S3 from the bytes: the MD5 of a single PUT, or
md5(concat(part MD5s))-N for a multipart upload, and a part's ETag is that part's MD5. `digests_match` compares
those (pass `etags_are_md5=False` for a bucket whose default encryption is SSE-KMS). Orphaned multipart uploads
cost storage until aborted: give real buckets an AbortIncompleteMultipartUpload lifecycle rule.

Confinement: the store is one bucket, or one key prefix in it (`prefix`, empty or ending in `/`). Every key it is
given is checked by `safe_key` and sent as `prefix + key`; keys it returns (`stat`, `list`) are relative to the
prefix, so nothing outside it can be named, read or written through the store.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError

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
)
from providers.storage.keys import join_key, safe_list_prefix, safe_store_prefix

_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART_ETAG = re.compile(r"^[0-9a-f]{32}-\d+$")
_NOT_FOUND = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _unquote(etag: str) -> str:
    return etag.strip('"')


class S3Store:
    """One bucket, or the keys under `prefix` in it. `client` is a boto3 S3 client (path-style addressing for
    moto/MinIO is the caller's choice)."""

    def __init__(self, client: BaseClient, bucket: str, *, prefix: str = "", etags_are_md5: bool = True) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = safe_store_prefix(prefix)
        self.etags_are_md5 = etags_are_md5

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{quote(self.prefix + key, safe='/')}"

    def name(self, key: str) -> str:
        """The bucket key of `key`: checked by `safe_key`, beneath the store's prefix."""
        return join_key(self.prefix, key)

    def _error(self, key: str, what: str, exc: ClientError | BotoCoreError) -> StorageError:
        code = _code(exc) if isinstance(exc, ClientError) else ""
        uri = self.uri(key)
        if code in _NOT_FOUND:
            return ObjectNotFound(f"{uri} does not exist ({code})", uri=uri)
        if code in ("NoSuchUpload",):
            return UploadGone(f"the multipart upload to {uri} is gone: {exc}", uri=uri)
        if code in ("PreconditionFailed", "412"):
            return SourceChanged(f"{uri} changed while it was being read", uri=uri)
        if code in ("BadDigest", "InvalidDigest"):
            return ChecksumMismatch(f"S3 rejected a part of {uri}: {exc}", uri=uri)
        return StorageError(f"S3 {what} of {uri} failed: {exc}", uri=uri)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.name(key))
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return None
            raise self._error(key, "head", exc) from exc
        except BotoCoreError as exc:
            raise self._error(key, "head", exc) from exc
        etag = _unquote(head["ETag"])
        trusted = (
            self.etags_are_md5
            and not str(head.get("ServerSideEncryption", "")).startswith("aws:kms")
            and "SSECustomerAlgorithm" not in head
        )
        return ObjectInfo(
            key=key,
            size=int(head["ContentLength"]),
            etag=etag,
            version=head["ETag"],
            md5=etag if trusted and _MD5_HEX.match(etag) else None,
            etag_is_md5=bool(trusted and (_MD5_HEX.match(etag) or _MULTIPART_ETAG.match(etag))),
            metadata=dict(head.get("Metadata", {})),
        )

    def open_read(
        self, key: str, offset: int = 0, *, chunk_size: int = DEFAULT_CHUNK_SIZE, version: str | None = None
    ) -> Iterator[bytes]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.name(key)}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
        if version:
            kwargs["IfMatch"] = version
        try:
            body = self.client.get_object(**kwargs)["Body"]
        except ClientError as exc:
            if _code(exc) == "InvalidRange":  # offset at or past the end
                return iter(())
            raise self._error(key, "get", exc) from exc
        except BotoCoreError as exc:
            raise self._error(key, "get", exc) from exc
        return self._chunks(key, body, chunk_size)

    def _chunks(self, key: str, body: Any, chunk_size: int) -> Iterator[bytes]:
        with contextlib.closing(body):
            try:
                yield from body.iter_chunks(chunk_size)
            except BotoCoreError as exc:
                raise self._error(key, "read", exc) from exc

    def begin_upload(self, key: str, *, size: int, part_size: int) -> S3Upload:
        try:
            made = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=self.name(key), ContentType="application/octet-stream"
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(key, "create_multipart_upload", exc) from exc
        return S3Upload(self, key, made["UploadId"])

    def resume_upload(self, key: str, token: str, *, size: int, part_size: int) -> S3Upload:
        upload = S3Upload(self, key, token)
        upload.completed_parts()  # raises UploadGone when S3 no longer knows the upload id
        return upload

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.name(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(key, "delete", exc) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects under `prefix`, keys relative to the store's prefix (as S3 names them: callers that turn a
        listed key into a path or a new key check it with `safe_key`)."""
        full = self.prefix + safe_list_prefix(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    etag = _unquote(obj["ETag"])
                    key = str(obj["Key"])[len(self.prefix) :]
                    yield ObjectInfo(key=key, size=int(obj["Size"]), etag=etag, version=obj["ETag"])
        except (ClientError, BotoCoreError) as exc:
            raise self._error(prefix, "list", exc) from exc

    def digests_match(self, info: ObjectInfo, digests: Digests) -> bool | None:
        if not info.etag_is_md5 or info.etag is None:
            return None
        if "-" in info.etag:
            return info.etag == digests.multipart_etag()
        return info.etag == digests.md5


class S3Upload:
    """One multipart upload; the token is its UploadId."""

    def __init__(self, store: S3Store, key: str, upload_id: str) -> None:
        self._store = store
        self._key = key
        self._name = store.name(key)
        self._upload_id = upload_id

    @property
    def token(self) -> str:
        return self._upload_id

    def _part_md5(self, etag: str) -> str | None:
        return etag if self._store.etags_are_md5 and _MD5_HEX.match(etag) else None

    def upload_part(self, number: int, data: bytes, *, md5: str | None = None) -> PartInfo:
        kwargs: dict[str, Any] = {}
        if md5:
            kwargs["ContentMD5"] = base64.b64encode(bytes.fromhex(md5)).decode()
        try:
            made = self._store.client.upload_part(
                Bucket=self._store.bucket,
                Key=self._name,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=data,
                **kwargs,
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._store._error(self._key, f"upload_part {number}", exc) from exc
        etag = _unquote(made["ETag"])
        return PartInfo(number=number, size=len(data), etag=etag, md5=self._part_md5(etag))

    def completed_parts(self) -> list[PartInfo]:
        parts: list[PartInfo] = []
        marker = 0
        while True:
            try:
                page = self._store.client.list_parts(
                    Bucket=self._store.bucket, Key=self._name, UploadId=self._upload_id, PartNumberMarker=marker
                )
            except (ClientError, BotoCoreError) as exc:
                raise self._store._error(self._key, "list_parts", exc) from exc
            for p in page.get("Parts", []):
                etag = _unquote(p["ETag"])
                parts.append(PartInfo(number=p["PartNumber"], size=int(p["Size"]), etag=etag, md5=self._part_md5(etag)))
            if not page.get("IsTruncated"):
                return sorted(parts, key=lambda p: p.number)
            marker = int(page["NextPartNumberMarker"])

    def complete(self, parts: Sequence[PartInfo], digests: Digests) -> None:
        client, bucket = self._store.client, self._store.bucket
        try:
            if not parts:  # S3 refuses to complete with no parts: an empty object is a plain PUT
                self.abort()
                client.put_object(Bucket=bucket, Key=self._name, Body=b"")
                return
            client.complete_multipart_upload(
                Bucket=bucket,
                Key=self._name,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": f'"{p.etag}"'} for p in parts]},
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._store._error(self._key, "complete_multipart_upload", exc) from exc

    def abort(self) -> None:
        try:
            self._store.client.abort_multipart_upload(
                Bucket=self._store.bucket, Key=self._name, UploadId=self._upload_id
            )
        except ClientError as exc:
            if _code(exc) not in ("NoSuchUpload", "404"):
                raise self._store._error(self._key, "abort_multipart_upload", exc) from exc
        except BotoCoreError as exc:
            raise self._store._error(self._key, "abort_multipart_upload", exc) from exc
