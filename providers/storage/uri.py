"""Turn a checkpoint URI into the `ObjectStore` that holds it and the key inside it.

Accepted forms: `s3://bucket/key`, `gs://bucket/key`, `az://container/key`,
`https://<account>.blob.core.windows.net/<container>/<key>` (or any URL under the injected Azure client's own
endpoint, such as Azurite's `http://127.0.0.1:P/devstoreaccount1/...`) and `file:///absolute/path`. SDK clients
come from `StoreClients`, built by the caller; an adapter's SDK is imported only when its scheme is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from providers.storage.base import ObjectStore, StorageError
from providers.storage.local import LocalStore

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient
    from botocore.client import BaseClient
    from google.cloud.storage import Client as GCSClient

AZURE_HOST_SUFFIX = ".blob.core.windows.net"


@dataclass(frozen=True, slots=True)
class StoreClients:
    """The SDK clients `resolve` may hand to adapters; leave out the clouds you do not use."""

    s3: BaseClient | None = None
    gcs: GCSClient | None = None
    azure: BlobServiceClient | None = None


@dataclass(frozen=True, slots=True)
class ObjectURI:
    """A parsed checkpoint URI: `scheme` is one of s3, gs, az, file; `container` is empty for file."""

    scheme: str
    container: str
    key: str


def parse_uri(uri: str, *, azure_endpoint: str | None = None) -> ObjectURI:
    """Split `uri`; raises ValueError naming the accepted forms when it is none of them."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("s3", "gs", "az"):
        key = parts.path.lstrip("/")
        if not parts.netloc or not key:
            raise ValueError(f"{uri!r} needs a bucket and a key: {scheme}://<bucket>/<key>")
        return ObjectURI(scheme, parts.netloc, unquote(key))
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"{uri!r} must be an absolute local path: file:///<path>")
        return ObjectURI("file", "", unquote(parts.path))
    if scheme in ("http", "https"):
        path = ""
        if parts.netloc.lower().endswith(AZURE_HOST_SUFFIX):
            path = parts.path
        elif azure_endpoint and uri.startswith(azure_endpoint.rstrip("/") + "/"):
            path = uri[len(azure_endpoint.rstrip("/")) :]
        container, _, key = path.lstrip("/").partition("/")
        if container and key:
            return ObjectURI("az", container, unquote(key.split("?", 1)[0]))
    raise ValueError(
        f"unsupported checkpoint URI {uri!r}: use s3://bucket/key, gs://bucket/key, az://container/key, "
        "https://<account>.blob.core.windows.net/<container>/<key> or file:///path"
    )


def resolve(uri: str, clients: StoreClients) -> tuple[ObjectStore, str]:
    """The store holding `uri` and the key inside it. Raises ValueError for a malformed URI and StorageError
    when the client its scheme needs was not given."""
    endpoint = clients.azure.url if clients.azure is not None else None
    parsed = parse_uri(uri, azure_endpoint=endpoint)
    if parsed.scheme == "file":
        return LocalStore(Path("/")), parsed.key.lstrip("/")
    if parsed.scheme == "s3":
        if clients.s3 is None:
            raise StorageError(f"no S3 client configured to reach {uri}", uri=uri)
        from providers.storage.s3 import S3Store

        return S3Store(clients.s3, parsed.container), parsed.key
    if parsed.scheme == "gs":
        if clients.gcs is None:
            raise StorageError(f"no GCS client configured to reach {uri}", uri=uri)
        from providers.storage.gcs import GCSStore

        return GCSStore(clients.gcs, parsed.container), parsed.key
    if clients.azure is None:
        raise StorageError(f"no Azure Blob client configured to reach {uri}", uri=uri)
    host = urlsplit(uri).netloc.lower()
    if host.endswith(AZURE_HOST_SUFFIX) and host.split(".", 1)[0] != str(clients.azure.account_name).lower():
        raise StorageError(f"the Azure client is for account {clients.azure.account_name}, not {host}", uri=uri)
    from providers.storage.azure_blob import AzureBlobStore

    return AzureBlobStore(clients.azure.get_container_client(parsed.container)), parsed.key
