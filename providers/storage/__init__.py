"""Checkpoint storage: one `ObjectStore` contract over S3, GCS, Azure Blob and local files, and a streaming,
resumable, verified copy between any two of them.

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
from providers.storage.local import LocalStore
from providers.storage.state import CopyState, CopyStateStore, JsonFileCopyStateStore, MemoryCopyStateStore
from providers.storage.uri import StoreClients, parse_uri, resolve
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
    "UploadGone",
    "UploadSession",
    "Verification",
    "Verify",
    "copy_checkpoint",
    "parse_uri",
    "resolve",
    "verify_object",
]
