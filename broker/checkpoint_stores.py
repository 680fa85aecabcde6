"""Where checkpoints live: the operator's object store per location, and the SDK clients to reach them.

`OVERSPILL_CHECKPOINT_STORES` maps a location, `"provider/region"`, to a URI prefix in a store there, e.g.
`{"aws/us-east-1": "s3://acme-ckpt-use1/overspill/", "gcp/us-central1": "gs://acme-ckpt-usc1/overspill/",
"onprem/dc1": "file:///srv/checkpoints/"}`. Before a job is launched somewhere other than where its checkpoint
is, the broker copies the checkpoint into the store configured for the target's location (pre-staging), so the
job resumes from a local read. `locate(uri)` answers which configured location holds a URI (longest prefix).

SDK clients are built on first use from the settings (`s3_endpoint_url`, `gcs_endpoint`,
`azure_storage_connection_string`), each SDK imported only when a store of its scheme is configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.settings import Settings
from providers.storage.uri import StoreClients, parse_uri


@dataclass
class CheckpointStores:
    """The configured stores by `(provider, region)`, and lazily built clients for them."""

    settings: Settings
    by_location: dict[tuple[str, str], str] = field(default_factory=dict)
    _clients: StoreClients | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> CheckpointStores:
        """Parse `settings.checkpoint_stores`; raises ValueError naming the bad entry."""
        by_location: dict[tuple[str, str], str] = {}
        for location, prefix in settings.checkpoint_stores.items():
            provider, _, region = location.partition("/")
            if not provider or not region or "/" in region:
                raise ValueError(
                    f"OVERSPILL_CHECKPOINT_STORES: location {location!r} must be 'provider/region', "
                    "e.g. 'aws/us-east-1'"
                )
            try:
                parse_uri(prefix.rstrip("/") + "/x")
            except ValueError as exc:
                raise ValueError(f"OVERSPILL_CHECKPOINT_STORES[{location!r}]: {exc}") from None
            by_location[(provider, region)] = prefix if prefix.endswith("/") else prefix + "/"
        return cls(settings, by_location)

    def near(self, provider: str, region: str) -> str | None:
        """The URI prefix of the store at `provider/region`, if one is configured."""
        return self.by_location.get((provider, region))

    def locate(self, uri: str) -> tuple[str, str] | None:
        """The location whose store holds `uri` (the longest matching prefix), or None when none does."""
        best: tuple[int, tuple[str, str]] | None = None
        for location, prefix in self.by_location.items():
            if uri.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), location)
        return best[1] if best else None

    def clients(self) -> StoreClients:
        """SDK clients for the schemes in use (built once)."""
        if self._clients is None:
            schemes = {parse_uri(p + "x").scheme for p in self.by_location.values()}
            self._clients = StoreClients(
                s3=self._s3() if "s3" in schemes else None,
                gcs=self._gcs() if "gs" in schemes else None,
                azure=self._azure() if "az" in schemes else None,
            )
        return self._clients

    def _s3(self) -> Any:
        import boto3
        from botocore.config import Config

        endpoint = self.settings.s3_endpoint_url or self.settings.aws_endpoint_url
        config = Config(s3={"addressing_style": "path"}) if endpoint else None
        return boto3.client("s3", endpoint_url=endpoint, config=config)

    def _gcs(self) -> Any:
        from google.cloud import storage

        if not self.settings.gcs_endpoint:
            return storage.Client(project=self.settings.gcp_project or None)
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=self.settings.gcp_project or "overspill",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.settings.gcs_endpoint},
        )

    def _azure(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        if not self.settings.azure_storage_connection_string:
            raise ValueError(
                "OVERSPILL_AZURE_STORAGE_CONNECTION_STRING is needed for the az:// checkpoint stores configured"
            )
        return BlobServiceClient.from_connection_string(
            self.settings.azure_storage_connection_string, max_single_get_size=8 << 20, max_chunk_get_size=8 << 20
        )
