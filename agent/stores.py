"""The job's object store as the agent sees it: put, get, list and delete objects by key, over plain HTTP.

Four backends behind one small interface (`Store`), chosen by the URI scheme (`open_uri`):
- `s3://bucket/key`: S3 REST with SigV4 (`agent.sigv4`), credentials from the environment or the instance role.
  The endpoint is `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (path-style; moto, MinIO) or AWS's regional one.
  A bucket in another region is followed once (`x-amz-bucket-region`). S3 checks every body against its signed
  SHA-256. Files over `multipart_threshold` go up as a multipart upload.
- `gs://bucket/key`: the GCS JSON API with the VM's service-account token; `STORAGE_EMULATOR_HOST` overrides the
  endpoint (as google-cloud-storage does). Every upload is checked against the MD5 GCS reports back.
- Azure Blob: `https://<account>.blob.core.windows.net/<container>/<key>`, or `az://<container>/<key>` under the
  account endpoint `OVERSPILL_AZURE_BLOB_ENDPOINT` (also how tests point at Azurite), with the managed identity's
  token for https://storage.azure.com/. Uploads are checked against the MD5 Azure reports back; files over
  `multipart_threshold` go up as blocks.
- `file:///abs/path`: a local or shared directory (Slurm nodes, tests); writes are temp file + rename.

Contract: `get`/`download` return None/False for a missing object, `delete` of a missing object succeeds, `list`
returns every key under a prefix in lexicographic order. Transient failures (no answer, 429, 5xx) are retried a few
times with backoff inside each call; what still fails raises `StoreError`, whose message names the object URI and
the HTTP status but never a credential.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

from agent import compat, net
from agent.identity import AzureIdentity, Identities, IdentityError
from agent.sigv4 import EMPTY_SHA256, AwsCredentials, sign, uri_encode

AZURE_ENDPOINT_ENV = "OVERSPILL_AZURE_BLOB_ENDPOINT"
AZURE_HOST = re.compile(
    r"^(?P<account>[a-z0-9]{3,24})\.blob\.core\.(windows\.net|chinacloudapi\.cn|usgovcloudapi\.net)$"
)
MiB = 1024 * 1024
T = TypeVar("T")
_ATTEMPTS = 4


class StoreError(Exception):
    """A store call that failed after its retries; the message is safe to log."""


class _Reader:
    """Reads at most `limit` bytes of `fp`, hashing what it hands out (MD5 and SHA-256)."""

    def __init__(self, fp: IO[bytes], limit: int) -> None:
        self.fp, self.left = fp, limit
        self.md5, self.sha256 = compat.md5(), hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fp.read(n) if n else b""
        self.left -= len(data)
        self.md5.update(data)
        self.sha256.update(data)
        return data


def file_digests(path: Path, offset: int = 0, length: int | None = None) -> tuple[str, str]:
    """(sha256 hex, md5 base64) of `length` bytes of `path` from `offset` (the rest of the file by default)."""
    with path.open("rb") as fp:
        fp.seek(offset)
        reader = _Reader(fp, length if length is not None else path.stat().st_size - offset)
        while reader.read(MiB):
            pass
    return reader.sha256.hexdigest(), base64.b64encode(reader.md5.digest()).decode()


class Store:
    """One bucket/container/directory. Keys are the object names inside it."""

    def uri(self, key: str) -> str:
        raise NotImplementedError

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        raise NotImplementedError

    def put_file(self, key: str, path: Path) -> None:
        raise NotImplementedError

    def get(self, key: str, *, max_bytes: int = 64 * MiB) -> bytes | None:
        raise NotImplementedError

    def download(self, key: str, path: Path) -> bool:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        raise NotImplementedError


def _retry(what: str, call: Callable[[], T]) -> T:
    try:
        return net.retry(call, attempts=_ATTEMPTS, base=0.3, cap=5.0)
    except net.NetError as exc:
        raise StoreError(f"{what}: {exc}") from None
    except IdentityError as exc:
        raise StoreError(f"{what}: no credentials: {exc}") from None


def _check(resp: net.Response, what: str, url: str, ok: tuple[int, ...] = (200, 201, 204)) -> net.Response:
    if resp.status not in ok:
        raise net.status_error(what, resp, url)
    return resp


def _stream_to(fp_in: IO[bytes], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := fp_in.read(MiB):
                out.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------------------- file


class FileStore(Store):
    """Keys are paths under `root` (the URI's absolute path for file://)."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key.lstrip("/")

    def uri(self, key: str) -> str:
        return "file://" + quote(str(self._path(key)))

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"writing {self.uri(key)}: {exc.strerror}") from None

    def put_file(self, key: str, path: Path) -> None:
        try:
            with path.open("rb") as fp:
                _stream_to(fp, self._path(key))
        except OSError as exc:
            raise StoreError(f"writing {self.uri(key)}: {exc.strerror}") from None

    def get(self, key: str, *, max_bytes: int = 64 * MiB) -> bytes | None:
        try:
            with self._path(key).open("rb") as fp:
                return fp.read(max_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"reading {self.uri(key)}: {exc.strerror}") from None

    def download(self, key: str, path: Path) -> bool:
        try:
            with self._path(key).open("rb") as fp:
                _stream_to(fp, path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"reading {self.uri(key)}: {exc.strerror}") from None

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"deleting {self.uri(key)}: {exc.strerror}") from None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        top = base if prefix.endswith("/") or base.is_dir() else base.parent
        keys = []
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                if name.startswith(".part-"):
                    continue
                key = os.path.relpath(os.path.join(dirpath, name), self.root)
                if key.startswith(prefix.lstrip("/")):
                    keys.append(key)
        return sorted(keys)


# ------------------------------------------------------------------------------------------------------------ S3


class S3Store(Store):
    def __init__(
        self,
        bucket: str,
        *,
        credentials: Callable[[], AwsCredentials],
        region: str,
        endpoint: str | None = None,
        multipart_threshold: int = 1024 * MiB,
        part_size: int = 64 * MiB,
    ) -> None:
        self.bucket = bucket
        self.credentials = credentials
        self.region = region
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _url(self, key: str, query: dict[str, str] | None) -> str:
        path = quote(key, safe="/~")
        if self.endpoint:
            base = f"{self.endpoint}/{self.bucket}"
        elif "." in self.bucket:  # a dotted bucket name breaks the virtual host's TLS certificate
            base = f"https://s3.{self.region}.amazonaws.com/{self.bucket}"
        else:
            base = f"https://{self.bucket}.s3.{self.region}.amazonaws.com"
        url = f"{base}/{path}" if key else f"{base}/"
        if query:
            url += "?" + "&".join(f"{uri_encode(k)}={uri_encode(v)}" for k, v in sorted(query.items()))
        return url

    def _call(
        self,
        method: str,
        key: str,
        *,
        query: dict[str, str] | None = None,
        body: bytes | IO[bytes] | None = None,
        payload_sha256: str = EMPTY_SHA256,
        headers: dict[str, str] | None = None,
        stream: Callable[[int, dict[str, str], IO[bytes]], Any] | None = None,
    ) -> Any:
        for _ in range(2):
            url = self._url(key, query)
            hdrs = dict(headers or {})
            if body is not None and "Content-Type" not in hdrs:  # urllib would say form data
                hdrs["Content-Type"] = "application/octet-stream"
            hdrs.update(
                sign(
                    method, url, hdrs, payload_sha256=payload_sha256, credentials=self.credentials(),
                    region=self.region, service="s3",
                )
            )  # fmt: skip
            if stream is not None:
                with net.open_request(method, url, headers=hdrs, body=body) as (status, rh, fp):
                    if status == 200:
                        return stream(status, rh, fp)
                    resp = net.Response(status, rh, fp.read(64 * 1024))
            else:
                resp = net.request(method, url, headers=hdrs, body=body)
            moved = resp.header("x-amz-bucket-region")
            if resp.status in (301, 307, 400) and moved and moved != self.region:
                self.region = moved
                if hasattr(body, "seek"):
                    body.seek(0)  # type: ignore[union-attr]
                continue
            return resp
        return resp

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        sha = hashlib.sha256(data).hexdigest()
        url = self._url(key, None)

        def once() -> None:
            _check(self._call("PUT", key, body=data, payload_sha256=sha, headers={"Content-Type": content_type}),
                   "S3 PUT", url)  # fmt: skip

        _retry(f"writing {self.uri(key)}", once)

    def put_file(self, key: str, path: Path) -> None:
        size = path.stat().st_size
        if size > self.multipart_threshold:
            self._multipart(key, path, size)
            return
        sha, _ = file_digests(path)

        def once() -> None:
            with path.open("rb") as fp:
                hdrs = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
                resp = self._call("PUT", key, body=fp, payload_sha256=sha, headers=hdrs)
                _check(resp, "S3 PUT", self._url(key, None))

        _retry(f"writing {self.uri(key)}", once)

    def _multipart(self, key: str, path: Path, size: int) -> None:
        url = self._url(key, None)
        what = f"multipart upload of {self.uri(key)}"
        resp = _retry(
            what, lambda: _check(self._call("POST", key, query={"uploads": ""}), "S3 CreateMultipartUpload", url)
        )
        upload_id = _xml_text(resp.body, "UploadId")
        if not upload_id:
            raise StoreError(f"{what}: no UploadId in S3's answer")
        etags = []
        try:
            for number, offset in enumerate(range(0, size, self.part_size), start=1):
                length = min(self.part_size, size - offset)
                sha, _ = file_digests(path, offset, length)

                def part(offset: int = offset, length: int = length, sha: str = sha, number: int = number) -> str:
                    with path.open("rb") as fp:
                        fp.seek(offset)
                        resp = self._call(
                            "PUT", key, query={"partNumber": str(number), "uploadId": upload_id},
                            body=_Reader(fp, length), payload_sha256=sha, headers={"Content-Length": str(length)},
                        )  # fmt: skip
                    return _check(resp, "S3 UploadPart", url).header("etag")

                etags.append(_retry(f"{what}, part {number}", part))
            doc = "".join(f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1))
            body = f"<CompleteMultipartUpload>{doc}</CompleteMultipartUpload>".encode()
            sha = hashlib.sha256(body).hexdigest()

            def complete() -> None:
                resp = _check(
                    self._call("POST", key, query={"uploadId": upload_id}, body=body, payload_sha256=sha,
                               headers={"Content-Type": "application/xml"}),
                    "S3 CompleteMultipartUpload", url,
                )  # fmt: skip
                if b"<Error>" in resp.body:  # S3 can answer 200 and an error body
                    raise net.TransientHTTP(f"S3 CompleteMultipartUpload of {url}: {resp.text()[:200]}", status=500)

            _retry(what, complete)
        except StoreError:
            with contextlib.suppress(net.NetError, IdentityError):
                self._call("DELETE", key, query={"uploadId": upload_id})
            raise

    def get(self, key: str, *, max_bytes: int = 64 * MiB) -> bytes | None:
        url = self._url(key, None)

        def once() -> bytes | None:
            resp = self._call("GET", key)
            return None if resp.status == 404 else _check(resp, "S3 GET", url, (200,)).body[:max_bytes]

        return _retry(f"reading {self.uri(key)}", once)

    def download(self, key: str, path: Path) -> bool:
        url = self._url(key, None)

        def once() -> bool:
            resp = self._call("GET", key, stream=lambda _s, _h, fp: _stream_to(fp, path) or True)
            if resp is True:
                return True
            return False if resp.status == 404 else bool(_check(resp, "S3 GET", url, (200,)))

        return _retry(f"reading {self.uri(key)}", once)

    def delete(self, key: str) -> None:
        url = self._url(key, None)
        _retry(
            f"deleting {self.uri(key)}", lambda: _check(self._call("DELETE", key), "S3 DELETE", url, (200, 204, 404))
        )

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            url = self._url("", query)
            resp = _retry(
                f"listing {self.uri(prefix)}",
                lambda query=query, url=url: _check(
                    self._call("GET", "", query=query), "S3 ListObjectsV2", url, (200,)
                ),
            )
            root = _xml(resp.body)
            keys += [el.text or "" for el in root.iter() if _local(el.tag) == "Key"]
            token = _xml_text(resp.body, "NextContinuationToken") or ""
            if not token:
                return sorted(keys)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _xml(body: bytes) -> ET.Element:
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise StoreError(f"unreadable XML from the store: {exc}") from None


def _xml_text(body: bytes, tag: str) -> str | None:
    for el in _xml(body).iter():
        if _local(el.tag) == tag:
            return el.text
    return None


# ----------------------------------------------------------------------------------------------------------- GCS


class GCSStore(Store):
    def __init__(self, bucket: str, *, token: Callable[[], str], endpoint: str = "https://storage.googleapis.com"):
        self.bucket = bucket
        self.token = token
        self.endpoint = endpoint.rstrip("/")

    def uri(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}", **(extra or {})}

    def _object_url(self, key: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(key, safe='')}"

    def _upload(self, key: str, open_body: Callable[[], tuple[IO[bytes], int]]) -> None:
        url = (
            f"{self.endpoint}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o"
            f"?uploadType=media&name={quote(key, safe='')}"
        )

        def once() -> None:
            fp, size = open_body()
            with contextlib.closing(fp):
                reader = _Reader(fp, size)
                hdrs = self._headers({"Content-Type": "application/octet-stream", "Content-Length": str(size)})
                resp = _check(net.request("POST", url, headers=hdrs, body=reader), "GCS upload", url, (200,))
            sent = base64.b64encode(reader.md5.digest()).decode()
            stored = _json(resp).get("md5Hash")
            if stored is not None and stored != sent:
                raise net.TransientHTTP(f"GCS upload of {self.uri(key)}: stored MD5 {stored} is not {sent}", status=500)

        _retry(f"writing {self.uri(key)}", once)

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        import io

        self._upload(key, lambda: (io.BytesIO(data), len(data)))

    def put_file(self, key: str, path: Path) -> None:
        self._upload(key, lambda: (path.open("rb"), path.stat().st_size))

    def get(self, key: str, *, max_bytes: int = 64 * MiB) -> bytes | None:
        url = self._object_url(key) + "?alt=media"

        def once() -> bytes | None:
            resp = net.request("GET", url, headers=self._headers(), max_bytes=max_bytes)
            return None if resp.status == 404 else _check(resp, "GCS GET", url, (200,)).body

        return _retry(f"reading {self.uri(key)}", once)

    def download(self, key: str, path: Path) -> bool:
        url = self._object_url(key) + "?alt=media"

        def once() -> bool:
            with net.open_request("GET", url, headers=self._headers()) as (status, rh, fp):
                if status == 200:
                    _stream_to(fp, path)
                    return True
                resp = net.Response(status, rh, fp.read(64 * 1024))
            return False if resp.status == 404 else bool(_check(resp, "GCS GET", url, (200,)))

        return _retry(f"reading {self.uri(key)}", once)

    def delete(self, key: str) -> None:
        url = self._object_url(key)
        _retry(
            f"deleting {self.uri(key)}",
            lambda: _check(net.request("DELETE", url, headers=self._headers()), "GCS DELETE", url, (200, 204, 404)),
        )

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{quote(self.bucket, safe='')}/o?prefix={quote(prefix, safe='')}"
            if token:
                url += f"&pageToken={quote(token, safe='')}"
            resp = _retry(
                f"listing {self.uri(prefix)}",
                lambda url=url: _check(net.request("GET", url, headers=self._headers()), "GCS list", url, (200,)),
            )
            raw = _json(resp)
            keys += [str(item["name"]) for item in raw.get("items", []) if isinstance(item, dict) and "name" in item]
            token = str(raw.get("nextPageToken") or "")
            if not token:
                return sorted(keys)


def _json(resp: net.Response) -> dict[str, Any]:
    import json

    try:
        raw = json.loads(resp.body or b"{}")
    except ValueError:
        raise StoreError(f"unreadable JSON from the store (HTTP {resp.status})") from None
    return raw if isinstance(raw, dict) else {}


# --------------------------------------------------------------------------------------------------------- Azure


class AzureBlobStore(Store):
    VERSION = "2021-08-06"

    def __init__(
        self,
        account_endpoint: str,
        container: str,
        *,
        token: Callable[[], str],
        multipart_threshold: int = 1024 * MiB,
        part_size: int = 64 * MiB,
    ) -> None:
        self.endpoint = account_endpoint.rstrip("/")
        self.container = container
        self.token = token
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size

    def uri(self, key: str) -> str:
        return f"{self.endpoint}/{self.container}/{key}"

    def _url(self, key: str, query: str = "") -> str:
        url = f"{self.endpoint}/{quote(self.container, safe='')}/{quote(key, safe='/~')}"
        return f"{url}?{query}" if query else url

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}", "x-ms-version": self.VERSION, **(extra or {})}

    def _put(self, url: str, what: str, open_body: Callable[[], tuple[IO[bytes], int]], extra: dict[str, str]) -> None:
        def once() -> None:
            fp, size = open_body()
            with contextlib.closing(fp):
                reader = _Reader(fp, size)
                hdrs = self._headers({"Content-Length": str(size), **extra})
                resp = _check(net.request("PUT", url, headers=hdrs, body=reader), what, url, (201,))
            sent = base64.b64encode(reader.md5.digest()).decode()
            stored = resp.header("content-md5") or None
            if stored is not None and stored != sent:
                raise net.TransientHTTP(f"{what} {net.safe_url(url)}: stored MD5 {stored} is not {sent}", status=500)

        _retry(what, once)

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        import io

        extra = {"x-ms-blob-type": "BlockBlob", "Content-Type": content_type}
        self._put(self._url(key), f"writing {self.uri(key)}", lambda: (io.BytesIO(data), len(data)), extra)

    def put_file(self, key: str, path: Path) -> None:
        size = path.stat().st_size
        extra = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
        if size <= self.multipart_threshold:
            self._put(self._url(key), f"writing {self.uri(key)}", lambda: (path.open("rb"), size), extra)
            return
        ids = []
        for number, offset in enumerate(range(0, size, self.part_size)):
            block_id = base64.b64encode(f"{number:08d}".encode()).decode()
            length = min(self.part_size, size - offset)

            def opener(offset: int = offset, length: int = length) -> tuple[IO[bytes], int]:
                fp = path.open("rb")
                fp.seek(offset)
                return fp, length

            query = f"comp=block&blockid={quote(block_id, safe='')}"
            self._put(self._url(key, query), f"writing a block of {self.uri(key)}", opener, {})
            ids.append(block_id)
        doc = "".join(f"<Latest>{i}</Latest>" for i in ids)
        body = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{doc}</BlockList>'.encode()
        url = self._url(key, "comp=blocklist")
        hdrs = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
        _retry(
            f"committing {self.uri(key)}",
            lambda: _check(
                net.request("PUT", url, headers=self._headers(hdrs), body=body), "Put Block List", url, (201,)
            ),
        )

    def get(self, key: str, *, max_bytes: int = 64 * MiB) -> bytes | None:
        url = self._url(key)

        def once() -> bytes | None:
            resp = net.request("GET", url, headers=self._headers(), max_bytes=max_bytes)
            return None if resp.status == 404 else _check(resp, "Azure GET", url, (200,)).body

        return _retry(f"reading {self.uri(key)}", once)

    def download(self, key: str, path: Path) -> bool:
        url = self._url(key)

        def once() -> bool:
            with net.open_request("GET", url, headers=self._headers()) as (status, rh, fp):
                if status == 200:
                    _stream_to(fp, path)
                    return True
                resp = net.Response(status, rh, fp.read(64 * 1024))
            return False if resp.status == 404 else bool(_check(resp, "Azure GET", url, (200,)))

        return _retry(f"reading {self.uri(key)}", once)

    def delete(self, key: str) -> None:
        url = self._url(key)
        _retry(
            f"deleting {self.uri(key)}",
            lambda: _check(net.request("DELETE", url, headers=self._headers()), "Azure DELETE", url, (200, 202, 404)),
        )

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        marker = ""
        while True:
            query = f"restype=container&comp=list&prefix={quote(prefix, safe='')}"
            if marker:
                query += f"&marker={quote(marker, safe='')}"
            url = f"{self.endpoint}/{quote(self.container, safe='')}?{query}"
            resp = _retry(
                f"listing {self.uri(prefix)}",
                lambda url=url: _check(net.request("GET", url, headers=self._headers()), "Azure list", url, (200,)),
            )
            root = _xml(resp.body)
            keys += [el.findtext("Name") or "" for el in root.iter("Blob")]
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return sorted(keys)


# --------------------------------------------------------------------------------------------------------- URIs


def open_uri(uri: str, identities: Identities, env: Mapping[str, str] | None = None) -> tuple[Store, str]:
    """The store holding `uri` and the key (or prefix) inside it. Raises ValueError naming the accepted forms."""
    env = os.environ if env is None else env
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    key = unquote(parts.path.lstrip("/"))
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"{uri!r} must be an absolute path: file:///<path>")
        return FileStore(), key
    if scheme == "s3" and parts.netloc:
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        aws = identities.aws
        try:
            region = aws.region()
        except IdentityError:
            region = "us-east-1"
        return S3Store(parts.netloc, credentials=aws.credentials, region=region, endpoint=endpoint), key
    if scheme == "gs" and parts.netloc:
        endpoint = env.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
        return GCSStore(parts.netloc, token=identities.gcp.access_token, endpoint=endpoint), key
    azure_endpoint = (env.get(AZURE_ENDPOINT_ENV) or "").rstrip("/")
    if scheme == "az" and parts.netloc:
        if not azure_endpoint:
            raise ValueError(f"{uri!r}: set {AZURE_ENDPOINT_ENV} to the account's blob endpoint for az:// URIs")
        return _azure(azure_endpoint, parts.netloc, key, identities), key
    if scheme in ("http", "https"):
        if azure_endpoint and uri.startswith(azure_endpoint + "/"):
            container, _, blob = uri[len(azure_endpoint) + 1 :].partition("/")
            return _azure(azure_endpoint, unquote(container), unquote(blob), identities), unquote(blob)
        if scheme == "https" and AZURE_HOST.match(parts.hostname or ""):
            container, _, blob = parts.path.lstrip("/").partition("/")
            if container:
                endpoint = f"https://{parts.hostname}"
                return _azure(endpoint, unquote(container), unquote(blob), identities), unquote(blob)
    raise ValueError(
        f"unsupported store URI {uri!r}: use s3://bucket/key, gs://bucket/key, "
        "https://<account>.blob.core.windows.net/<container>/<key>, az://<container>/<key> or file:///path"
    )


def _azure(endpoint: str, container: str, key: str, identities: Identities) -> AzureBlobStore:
    del key
    azure = identities.azure
    return AzureBlobStore(endpoint, container, token=lambda: azure.access_token(AzureIdentity.STORAGE))
