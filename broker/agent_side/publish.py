"""The instance agent's wheel: built once per process, published to each checkpoint store, read by instances
through a URL that needs no credentials of theirs.

- `agent_wheel()` builds the wheel (`agent.wheel.build_wheel`, reproducible: the same sources give the same bytes)
  into a temporary directory the first time it is asked, keeps its bytes, name and SHA-256, and returns that same
  `AgentWheel` for the rest of the process.
- `AgentPublisher.publish(store_prefix)` puts it at `P _agent/<sha256>/<wheel name>` in the configured store `P`
  (`checkpoint_layout.agent_wheel_key`), through the store confined beneath `P _agent/`
  (`CheckpointStores.broker_store`): `_agent/` sits beside `tenants/`, so no tenant's prefix holds it. Idempotent:
  the object is stat'ed first and uploaded only when it is missing or of another size (the name carries the
  SHA-256, so an object of the right size there is this wheel); a store checked once is not asked again by this
  process. Raises `StorageError` (the launch is then retried next tick, like a staging failure).
- `AgentPublisher.wheel_url(store_prefix)` publishes (if needed) and returns a URL the start-up script fetches with
  plain HTTPS and no credentials tooling: an S3 presigned GET, a GCS V4 signed URL, an Azure read-only SAS, or
  `file://` for a file store (`providers.storage.urls.read_url`), valid for `agent_url_expiry_seconds` (12 h by
  default). The script checks the download against the SHA-256, so a URL can only ever deliver this wheel.

GCS signing needs signing-capable credentials: `OVERSPILL_GCS_SIGNING_KEY_FILE` (a service-account key JSON), or
the GCS client's own credentials when they are a service-account key, or the IAM `signBlob` API for the service
account they belong to (Compute Engine / GKE Workload Identity: grant that account
`roles/iam.serviceAccountTokenCreator` on itself). Azure signs with the connection string's account key; with
Entra ID credentials it signs with a user delegation key. S3 URLs signed with temporary credentials (an instance
profile, an assumed role) stop working when those expire, whatever the expiry says.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from broker.agent_side import checkpoint_layout as layout
from broker.config.checkpoint_stores import CheckpointStores
from broker.config.settings import Settings
from providers.storage.small import put_object
from providers.storage.urls import read_url

_lock = threading.Lock()
_built: AgentWheel | None = None


@dataclass(frozen=True, slots=True)
class AgentWheel:
    """The built wheel: its file name, bytes and SHA-256 (hex)."""

    name: str
    data: bytes = field(repr=False)
    sha256: str

    @property
    def key(self) -> str:
        """Its key beneath a store prefix: `_agent/<sha256>/<name>`."""
        return layout.agent_wheel_key(self.sha256, self.name)


def agent_wheel() -> AgentWheel:
    """The agent's wheel, built on the first call and cached for the process."""
    global _built
    with _lock:
        if _built is None:
            from agent.wheel import build_wheel

            with tempfile.TemporaryDirectory(prefix="overspill-agent-wheel-") as tmp:
                path, digest = build_wheel(Path(tmp))
                _built = AgentWheel(path.name, path.read_bytes(), digest)
        return _built


class AgentPublisher:
    """Publishes the wheel to the configured stores and signs URLs to it (see the module docstring)."""

    def __init__(self, stores: CheckpointStores, settings: Settings) -> None:
        self.stores = stores
        self.settings = settings
        self._published: set[tuple[str, str]] = set()
        self._signing: Any = None

    def publish(self, store_prefix: str) -> AgentWheel:
        """Make sure the wheel is at `store_prefix _agent/<sha256>/<name>`; raises `StorageError`."""
        wheel = agent_wheel()
        if (store_prefix, wheel.sha256) in self._published:
            return wheel
        store = self.stores.broker_store(store_prefix, layout.AGENT)
        key = wheel.key[len(layout.AGENT) :]
        info = store.stat(key)
        if info is None or info.size != len(wheel.data):
            put_object(store, key, wheel.data)
        self._published.add((store_prefix, wheel.sha256))
        return wheel

    def wheel_url(self, store_prefix: str) -> tuple[str, AgentWheel]:
        """(a URL instances can GET the wheel from, the wheel); publishes it first if needed."""
        wheel = self.publish(store_prefix)
        store = self.stores.broker_store(store_prefix, layout.AGENT)
        expires = timedelta(seconds=self.settings.agent_url_expiry_seconds)
        url = read_url(store, wheel.key[len(layout.AGENT) :], expires, signing_credentials=self._gcs_signing())
        return url, wheel

    def _gcs_signing(self) -> Any:
        path = self.settings.gcs_signing_key_file
        if path is None:
            return None
        if self._signing is None:
            from google.oauth2 import service_account

            self._signing = service_account.Credentials.from_service_account_file(str(path))
        return self._signing
