"""Checkpoint URIs: parse them, decide whether one lies beneath a prefix, and open the store confined to a prefix.

Accepted forms: `s3://bucket/key`, `gs://bucket/key`, `az://container/key`,
`https://<account>.blob.core.windows.net/<container>/<key>` (or any URL under the injected Azure client's own
endpoint, such as Azurite's `http://127.0.0.1:P/devstoreaccount1/...`) and `file:///absolute/path`. Keys are
percent-decoded here, so every later check sees the name the store will see (`%2e%2e` is `..`).

There is no way to get a store for "whatever this URI names": `store_at(root_uri, clients, prefix=...)` opens the
store at a root the caller trusts (a configured checkpoint store), optionally narrowed to a key prefix beneath it
(a tenant's area, a job's checkpoint directory), and `resolve(uri, clients, within=root_uri)` gives that store and
the key of `uri` relative to it, refusing (`UnsafeKey`) a URI that is not beneath the root or whose relative key
is not `safe_key`. Narrow a trusted root rather than opening a store at a deeper path: for local files the
directories of the prefix are then walked without following symlinks too. Deciding which prefixes a URI may be resolved
within is the caller's business (the broker's `CheckpointStores`). SDK clients come from `StoreClients`, built by
the caller; an adapter's SDK is imported only when its scheme is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from providers.storage.base import ObjectStore, StorageError
from providers.storage.keys import UnsafeKey, safe_key, safe_store_prefix
from providers.storage.local import LocalStore

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient
    from botocore.client import BaseClient
    from google.cloud.storage import Client as GCSClient

AZURE_HOST_SUFFIX = ".blob.core.windows.net"
FORMS = (
    "s3://bucket/key, gs://bucket/key, az://container/key, https://<account>.blob.core.windows.net/<container>/<key> "
    "or file:///path"
)


@dataclass(frozen=True, slots=True)
class StoreClients:
    """The SDK clients `store_at` may hand to adapters; leave out the clouds you do not use."""

    s3: BaseClient | None = None
    gcs: GCSClient | None = None
    azure: BlobServiceClient | None = None


@dataclass(frozen=True, slots=True)
class ObjectURI:
    """A parsed checkpoint URI: `scheme` is one of s3, gs, az, file; `container` is empty for file; `key` is
    percent-decoded (for file, the absolute path; for a prefix, it ends in `/` or is empty)."""

    scheme: str
    container: str
    key: str


def _split(uri: str, azure_endpoint: str | None) -> ObjectURI:
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("s3", "gs", "az", "file") and (parts.query or parts.fragment or "?" in uri or "#" in uri):
        raise ValueError(f"{uri!r} has a query or fragment; a checkpoint URI names an object: use {FORMS}")
    if scheme in ("s3", "gs", "az"):
        if not parts.netloc:
            raise ValueError(f"{uri!r} needs a bucket: {scheme}://<bucket>/<key>")
        return ObjectURI(scheme, parts.netloc, unquote(parts.path[1:] if parts.path.startswith("/") else parts.path))
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"{uri!r} must be an absolute local path: file:///<path>")
        return ObjectURI("file", "", unquote(parts.path))
    if scheme in ("http", "https"):
        path = ""
        if parts.netloc.lower().endswith(AZURE_HOST_SUFFIX):
            path = parts.path
        elif azure_endpoint and uri.startswith(azure_endpoint.rstrip("/") + "/"):
            path = urlsplit(uri[len(azure_endpoint.rstrip("/")) :]).path
        container, _, key = path.lstrip("/").partition("/")
        if container and (key or path.endswith("/")):
            return ObjectURI("az", container, unquote(key))
    raise ValueError(f"unsupported checkpoint URI {uri!r}: use {FORMS}")


def parse_uri(uri: str, *, azure_endpoint: str | None = None) -> ObjectURI:
    """Split `uri` naming an object (or, ending in `/`, every object beneath it); raises ValueError naming the
    accepted forms when it is none of them."""
    parsed = _split(uri, azure_endpoint)
    if parsed.scheme != "file" and not parsed.key:
        raise ValueError(f"{uri!r} needs a bucket and a key: {parsed.scheme}://<bucket>/<key>")
    return parsed


def parse_prefix(uri: str, *, azure_endpoint: str | None = None) -> ObjectURI:
    """Split `uri` naming a prefix (a store's root): it must end in `/`; its key may be empty (a whole bucket).
    Every segment of it must be safe: raises ValueError (or `UnsafeKey`) naming what is wrong."""
    if not uri.endswith("/"):
        raise ValueError(f"{uri!r} must end in '/': it names a directory or key prefix")
    parsed = _split(uri, azure_endpoint)
    if parsed.scheme == "file":
        if parsed.key != "/":
            safe_key(parsed.key[1:-1])
    else:
        safe_store_prefix(parsed.key)
    return parsed


def relative_key(uri: str, prefix_uri: str, *, azure_endpoint: str | None = None) -> str:
    """The key of `uri` beneath `prefix_uri`, ending in `/` when `uri` does. Raises `UnsafeKey` when `uri` is not
    strictly beneath the prefix (other scheme, bucket or path; the prefix itself) or when the relative key is not
    safe after percent-decoding; ValueError when `uri` does not parse."""
    prefix = parse_prefix(prefix_uri, azure_endpoint=azure_endpoint)
    parsed = _split(uri, azure_endpoint)
    beneath = (parsed.scheme, parsed.container) == (prefix.scheme, prefix.container) and parsed.key.startswith(
        prefix.key
    )
    rel = parsed.key[len(prefix.key) :]
    if not beneath or not rel:
        raise UnsafeKey(f"{uri!r} is not beneath {prefix_uri!r}", uri=uri)
    safe_key(rel[:-1] if rel.endswith("/") else rel)
    return rel


def store_at(root_uri: str, clients: StoreClients, *, prefix: str = "") -> ObjectStore:
    """The store at `root_uri` (ending in `/`), narrowed to the keys under `prefix` (empty or a safe key ending in
    `/`): a `LocalStore` rooted at that directory, or a bucket store whose key prefix is the root's key plus
    `prefix`. Raises ValueError for a malformed root, `UnsafeKey` for an unsafe prefix, and StorageError when the
    client its scheme needs was not given."""
    endpoint = clients.azure.url if clients.azure is not None else None
    parsed = parse_prefix(root_uri, azure_endpoint=endpoint)
    prefix = safe_store_prefix(prefix)
    prefix_uri = root_uri + prefix
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.key), prefix=prefix)
    if parsed.scheme == "s3":
        if clients.s3 is None:
            raise StorageError(f"no S3 client configured to reach {prefix_uri}", uri=prefix_uri)
        from providers.storage.s3 import S3Store

        return S3Store(clients.s3, parsed.container, prefix=parsed.key + prefix)
    if parsed.scheme == "gs":
        if clients.gcs is None:
            raise StorageError(f"no GCS client configured to reach {prefix_uri}", uri=prefix_uri)
        from providers.storage.gcs import GCSStore

        return GCSStore(clients.gcs, parsed.container, prefix=parsed.key + prefix)
    if clients.azure is None:
        raise StorageError(f"no Azure Blob client configured to reach {prefix_uri}", uri=prefix_uri)
    host = urlsplit(root_uri).netloc.lower()
    if host.endswith(AZURE_HOST_SUFFIX) and host.split(".", 1)[0] != str(clients.azure.account_name).lower():
        raise StorageError(f"the Azure client is for account {clients.azure.account_name}, not {host}", uri=prefix_uri)
    from providers.storage.azure_blob import AzureBlobStore

    return AzureBlobStore(clients.azure.get_container_client(parsed.container), prefix=parsed.key + prefix)


def resolve(uri: str, clients: StoreClients, *, within: str) -> tuple[ObjectStore, str]:
    """`(the store confined beneath within, the key of uri relative to it)`; raises `UnsafeKey` when `uri` is not
    beneath `within` (see `relative_key`). The key ends in `/` when `uri` names a prefix."""
    endpoint = clients.azure.url if clients.azure is not None else None
    key = relative_key(uri, within, azure_endpoint=endpoint)
    return store_at(within, clients), key
