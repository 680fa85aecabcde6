"""Checkpoint storage: one `ObjectStore` contract over S3, GCS, Azure Blob and local files, and a streaming,
resumable, verified copy between any two of them. Every store is confined to a root (a directory, or a bucket and
key prefix) and refuses keys that would escape it (`keys.safe_key`); stores are opened only beneath a prefix the
caller trusts (`uri.store_at`, `uri.resolve(..., within=...)`).

The SDK adapters (`s3`, `gcs`, `azure_blob`) import their cloud SDK, so they are imported on demand; what is
re-exported here needs none.
"""

from providers.storage.base import (
    DEFAULT_CHUNK_SIZE,
    ChecksumMismatch,
    Digests,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PartInfo,
    SourceChanged,
    StorageError,
    UploadGone,
    UploadSession,
)
from providers.storage.copy import CopyResult, copy_checkpoint
from providers.storage.keys import UnsafeKey, safe_key
from providers.storage.local import LocalStore, UnsafePath
from providers.storage.state import CopyState, CopyStateStore, JsonFileCopyStateStore, MemoryCopyStateStore
from providers.storage.uri import StoreClients, parse_prefix, parse_uri, relative_key, resolve, store_at
from providers.storage.verify import Verification, Verify, verify_object

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ChecksumMismatch",
    "CopyResult",
    "CopyState",
    "CopyStateStore",
    "Digests",
    "JsonFileCopyStateStore",
    "LocalStore",
    "MemoryCopyStateStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "PartInfo",
    "SourceChanged",
    "StorageError",
    "StoreClients",
    "UnsafeKey",
    "UnsafePath",
    "UploadGone",
    "UploadSession",
    "Verification",
    "Verify",
    "copy_checkpoint",
    "parse_prefix",
    "parse_uri",
    "relative_key",
    "resolve",
    "safe_key",
    "store_at",
    "verify_object",
]
