"""A URL that reads one object with plain HTTPS and no credentials of the reader's own, for a while.

`read_url(store, key, expires)` signs a GET of `key` (checked by `safe_key`, beneath the store's root) with the
credentials of the store's own client:
- S3: a SigV4 presigned GET (`generate_presigned_url`). AWS caps it at 7 days, and a URL signed with temporary
  credentials (an instance profile, an assumed role, SSO) stops working when they expire, whatever `expires` says.
- GCS: a V4 signed URL. Signing needs a private key or the IAM Credentials `signBlob` API: `signing_credentials`
  (e.g. a service-account key) when given, else the client's credentials when they can sign (a service-account
  key file), else `signBlob` for the service account the client's credentials belong to (Compute Engine, GKE
  Workload Identity, impersonated credentials: that account needs `roles/iam.serviceAccountTokenCreator` on
  itself). The URL's host is the client's API endpoint (the emulator's in tests).
- Azure Blob: a read-only blob SAS, signed with the account key when the client has one (a connection string with
  `AccountKey=`), else with a user delegation key (Entra ID credentials holding
  `Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey`, e.g. Storage Blob Delegator or Data
  Reader); user delegation SAS last at most 7 days.
- Local files: `file://` with the object's path (for instances sharing the filesystem: Slurm nodes, tests).
Raises `StorageError` when the store cannot sign (e.g. an anonymous GCS client with no signing credentials).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from providers.storage.base import ObjectStore, StorageError
from providers.storage.keys import join_key


def read_url(store: ObjectStore, key: str, expires: timedelta, *, signing_credentials: Any = None) -> str:
    """A GET URL for `key` in `store`, valid for `expires` (see the module docstring)."""
    from providers.storage.local import LocalStore

    if isinstance(store, LocalStore):
        return store.path(key).as_uri()
    kind = type(store).__name__
    if kind == "S3Store":
        return _s3(store, key, expires)
    if kind == "GCSStore":
        return _gcs(store, key, expires, signing_credentials)
    if kind == "AzureBlobStore":
        return _azure(store, key, expires)
    raise StorageError(f"cannot make a read URL for a {kind}", uri=store.uri(key))


def _s3(store: Any, key: str, expires: timedelta) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(
            store.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": store.bucket, "Key": join_key(store.prefix, key)},
                ExpiresIn=int(expires.total_seconds()),
            )
        )
    except (BotoCoreError, ClientError) as exc:
        raise StorageError(f"S3 could not presign {store.uri(key)}: {exc}", uri=store.uri(key)) from exc


def _gcs(store: Any, key: str, expires: timedelta, signing: Any) -> str:
    from google.auth.exceptions import GoogleAuthError
    from google.auth.transport.requests import Request

    client = store.client
    blob = store.bucket.blob(join_key(store.prefix, key))
    credentials = signing if signing is not None else client._credentials
    kwargs: dict[str, Any] = {}
    if not hasattr(credentials, "sign_bytes") or not hasattr(credentials, "signer_email"):
        email = getattr(credentials, "service_account_email", None)
        if not email:
            raise StorageError(
                f"cannot sign a GCS URL for {store.uri(key)}: the client's credentials hold no private key and name no "
                "service account (set OVERSPILL_GCS_SIGNING_KEY_FILE, or run as a service account allowed to signBlob)",
                uri=store.uri(key),
            )
        try:
            if not credentials.valid:
                credentials.refresh(Request())
        except GoogleAuthError as exc:
            raise StorageError(f"refreshing the GCS credentials failed: {exc}", uri=store.uri(key)) from exc
        kwargs = {"service_account_email": email, "access_token": credentials.token}
    try:
        return str(
            blob.generate_signed_url(
                version="v4",
                expiration=expires,
                method="GET",
                credentials=credentials if not kwargs else None,
                api_access_endpoint=client.api_endpoint,
                **kwargs,
            )
        )
    except (GoogleAuthError, ValueError, AttributeError) as exc:
        raise StorageError(f"GCS could not sign a URL for {store.uri(key)}: {exc}", uri=store.uri(key)) from exc


def _azure(store: Any, key: str, expires: timedelta) -> str:
    from azure.core.exceptions import AzureError
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    blob = store.blob(key)
    now = datetime.now(UTC)
    start, expiry = now - timedelta(minutes=5), now + expires  # a little earlier: the storage clock may lag ours
    credential = blob.credential
    account_key = getattr(credential, "account_key", None)
    try:
        if account_key:
            sas = generate_blob_sas(
                blob.account_name,
                blob.container_name,
                blob.blob_name,
                account_key=account_key,
                permission=BlobSasPermissions(read=True),
                start=start,
                expiry=expiry,
            )
        else:
            from azure.storage.blob import BlobServiceClient

            service = BlobServiceClient(blob.primary_endpoint.split(f"/{blob.container_name}/")[0], credential)
            delegation = service.get_user_delegation_key(start, expiry)
            sas = generate_blob_sas(
                blob.account_name,
                blob.container_name,
                blob.blob_name,
                user_delegation_key=delegation,
                permission=BlobSasPermissions(read=True),
                start=start,
                expiry=expiry,
            )
    except (AzureError, ValueError, TypeError) as exc:
        raise StorageError(f"Azure could not sign a SAS for {store.uri(key)}: {exc}", uri=store.uri(key)) from exc
    return f"{blob.url}?{sas}"
