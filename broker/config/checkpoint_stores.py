"""Where checkpoints may live: the operator's stores per location, each tenant's share of them, and the only way
the broker turns a checkpoint URI into a store it reads or writes.

`OVERSPILL_CHECKPOINT_STORES` maps a location, `"provider/region"`, to a URI prefix in a store there, e.g.
`{"aws/us-east-1": "s3://acme-ckpt-use1/overspill/", "gcp/us-central1": "gs://acme-ckpt-usc1/overspill/",
"onprem/dc1": "file:///srv/checkpoints/"}`. In each, tenant T owns `<prefix>tenants/T/` (the layout is in
`broker.agent_side.checkpoint_layout`). `OVERSPILL_TENANT_CHECKPOINT_PREFIXES` gives a tenant further prefixes, each
with its
location: `{"acme": {"s3://acme-ml/ckpt/": "aws/us-east-1"}}`. A tenant's *allowed prefixes* are its area in every
store plus its own extra prefixes; nothing else.

Contract:
- `from_settings` validates both settings and raises ValueError naming the bad entry: a malformed location or URI,
  a prefix with an unsafe segment, stores nested in one another, an extra prefix overlapping a store or another
  tenant's, and a `file://` root that is `/` or is, contains or lies inside one of the broker's own directories
  (data dir, the SQLite database's directory, the reports dir, the Python installation and its site-packages, the
  project's packages), so the broker's files are never reachable as checkpoints.
- `match(uri, tenant)` returns which allowed prefix holds `uri`, the key beneath it and its location, or raises
  `CheckpointRefused` (a ValueError) whose message lists the allowed prefixes. A URI is beneath a prefix when,
  after percent-decoding, its scheme, bucket and key start with the prefix's and the rest passes `safe_key`; the
  prefix itself does not count, nor do the places `checkpoint_layout.reserved_reason` reserves.
- `resolve_for_tenant(uri, tenant)` is `match` and then the store confined beneath that prefix, with the key;
  `resolve(uri)` does the same against every configured store and extra prefix (the broker's own view).
  There is no other way from a URI to a store: `providers.storage` hands out stores only beneath a given prefix.
  Every store is opened at its configured root (resolved once) and narrowed to the prefix, so for local files
  the tenant's and the job's directories are walked without following symlinks, like the keys beneath them.
- `near`, `locate` and `job_checkpoint_uri` answer where a store is, where a checkpoint is, and where the broker
  puts a job's checkpoint. `for_launch(provider, region)` is the store an instance there uses (its job's
  checkpoint, its attempt's spec, logs and reports): the store at that location, else the *nearest* store of the
  same provider, i.e. the region whose name shares the longest prefix with the target's (`us-east-2` before
  `us-west-2` for `us-east-1`; ties by name), a cheap stand-in for distance that keeps a continent's regions
  together; None when the provider has no store at all (`providers_with_stores`).
- `broker_store(store_prefix, area)` is the only way to the broker's own keys beside `tenants/` (`_agent/`, where
  the agent's wheel is published): confined beneath `P <area>`, which no tenant's prefix can reach.

SDK clients are built on first use from the settings (`s3_endpoint_url`, `gcs_endpoint`,
`azure_storage_connection_string`), each SDK imported only when a store of its scheme is configured.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.agent_side import checkpoint_layout as layout
from broker.config.settings import Settings
from providers.storage import ObjectStore, UnsafeKey, parse_prefix, parse_uri, relative_key, safe_key, store_at
from providers.storage.keys import safe_segment
from providers.storage.uri import ObjectURI, StoreClients

Location = tuple[str, str]
STORES_VAR = "OVERSPILL_CHECKPOINT_STORES"
EXTRA_VAR = "OVERSPILL_TENANT_CHECKPOINT_PREFIXES"


class CheckpointRefused(ValueError):
    """A checkpoint URI that is not under one of the tenant's allowed prefixes (or does not parse)."""


@dataclass(frozen=True, slots=True)
class Allowed:
    """One prefix a tenant may use: its `location`, the configured `root` it lies in (a store prefix or the extra
    prefix itself), and whether it is the tenant's area of a store (whose reserved places users may not name)."""

    prefix: str
    location: Location
    root: str
    is_area: bool


@dataclass(frozen=True, slots=True)
class Match:
    """Where an allowed URI is: the allowed prefix holding it (`allowed`), the `key` beneath it."""

    allowed: Allowed
    key: str

    @property
    def location(self) -> Location:
        return self.allowed.location


def _location(var: str, entry: str, location: str) -> Location:
    provider, _, region = location.partition("/")
    if not provider or not region or "/" in region:
        raise ValueError(f"{var}{entry}: location {location!r} must be 'provider/region', e.g. 'aws/us-east-1'")
    return provider, region


def _overlap(a: ObjectURI, b: ObjectURI) -> bool:
    return (a.scheme, a.container) == (b.scheme, b.container) and (a.key.startswith(b.key) or b.key.startswith(a.key))


def broker_paths(settings: Settings) -> list[tuple[str, Path]]:
    """The broker's own directories, which no `file://` checkpoint root may be, contain or lie inside."""
    import broker
    import federation
    import pricing
    import providers

    paths: list[tuple[str, Path]] = [
        ("the data dir (OVERSPILL_DATA_DIR)", settings.data_dir),
        ("the reports dir (OVERSPILL_REPORTS_DIR)", settings.resolved_reports_dir),
    ]
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        database = make_url(url).database
        if database and database != ":memory:":
            paths.append(("the SQLite database's directory", Path(database).parent))
    for label, value in (
        ("sys.prefix", sys.prefix),
        ("sys.exec_prefix", sys.exec_prefix),
        ("sys.base_prefix", sys.base_prefix),
        ("sys.base_exec_prefix", sys.base_exec_prefix),
    ):
        paths.append((f"the Python installation ({label})", Path(value)))
    for name, value in sysconfig.get_paths().items():
        paths.append((f"the Python installation ({name})", Path(value)))
    for value in [*site.getsitepackages(), site.getusersitepackages()]:
        paths.append(("site-packages", Path(value)))
    for module in (broker, providers, pricing, federation):
        paths.append((f"the {module.__name__} package", Path(module.__file__ or ".").parent))
    resolved = [(label, path.resolve()) for label, path in paths]
    return [(label, path) for label, path in resolved if path != Path("/")]  # "/" itself is refused on its own


def _check_file_root(var: str, entry: str, parsed: ObjectURI, protected: list[tuple[str, Path]]) -> None:
    root = Path(parsed.key).resolve()
    if root == Path("/"):
        raise ValueError(f"{var}{entry}: a file:// checkpoint store cannot be the filesystem root '/'")
    for label, path in protected:
        if root == path or path in root.parents or root in path.parents:
            relation = "is" if root == path else "lies inside" if path in root.parents else "contains"
            raise ValueError(
                f"{var}{entry}: {root} {relation} {label} ({path}); checkpoints must live apart from the broker's "
                "own files"
            )


@dataclass
class CheckpointStores:
    """The configured stores by `(provider, region)`, tenants' extra prefixes, and lazily built clients."""

    settings: Settings
    by_location: dict[Location, str] = field(default_factory=dict)
    extra: dict[str, dict[str, Location]] = field(default_factory=dict)
    _clients: StoreClients | None = None
    _azure_client: Any = None

    @classmethod
    def from_settings(cls, settings: Settings) -> CheckpointStores:
        """Parse and check `checkpoint_stores` and `tenant_checkpoint_prefixes`; raises ValueError naming the bad
        entry (see the module docstring for what is refused)."""
        protected = broker_paths(settings)
        by_location: dict[Location, str] = {}
        parsed_stores: list[tuple[str, ObjectURI]] = []
        for location, raw in settings.checkpoint_stores.items():
            entry = f"[{location!r}]"
            where = _location(STORES_VAR, "", location)
            prefix = raw if raw.endswith("/") else raw + "/"
            parsed = cls._parse_entry(STORES_VAR, entry, prefix, protected)
            for other, seen in parsed_stores:
                if _overlap(parsed, seen) and parsed != seen:
                    raise ValueError(f"{STORES_VAR}{entry}: {prefix} and {other} are nested in one another")
            parsed_stores.append((prefix, parsed))
            by_location[where] = prefix
        extra: dict[str, dict[str, Location]] = {}
        taken: list[tuple[str, str, ObjectURI]] = []
        for tenant, prefixes in settings.tenant_checkpoint_prefixes.items():
            try:
                safe_segment(tenant)
            except UnsafeKey as exc:
                raise ValueError(f"{EXTRA_VAR}[{tenant!r}]: not a tenant name: {exc}") from None
            for raw, location in prefixes.items():
                entry = f"[{tenant!r}][{raw!r}]"
                where = _location(EXTRA_VAR, entry, location)
                prefix = raw if raw.endswith("/") else raw + "/"
                parsed = cls._parse_entry(EXTRA_VAR, entry, prefix, protected)
                for store_prefix, seen in parsed_stores:
                    if _overlap(parsed, seen):
                        raise ValueError(
                            f"{EXTRA_VAR}{entry}: overlaps the checkpoint store {store_prefix}, which holds every "
                            "tenant's area (each tenant already owns <store>tenants/<tenant>/ there)"
                        )
                for owner, other, seen in taken:
                    if _overlap(parsed, seen):
                        raise ValueError(f"{EXTRA_VAR}{entry}: overlaps {other}, assigned to tenant {owner!r}")
                taken.append((tenant, prefix, parsed))
                extra.setdefault(tenant, {})[prefix] = where
        return cls(settings, by_location, extra)

    @staticmethod
    def _parse_entry(var: str, entry: str, prefix: str, protected: list[tuple[str, Path]]) -> ObjectURI:
        try:
            parsed = parse_prefix(prefix)
        except (ValueError, UnsafeKey) as exc:
            raise ValueError(f"{var}{entry}: {exc}") from None
        if parsed.scheme == "file":
            _check_file_root(var, entry, parsed, protected)
        return parsed

    # -- where things are ----------------------------------------------------------------------------------------

    def near(self, provider: str, region: str) -> str | None:
        """The URI prefix of the store at `provider/region`, if one is configured."""
        return self.by_location.get((provider, region))

    def providers_with_stores(self) -> frozenset[str]:
        """The providers with at least one configured store."""
        return frozenset(provider for provider, _ in self.by_location)

    def for_launch(self, provider: str, region: str) -> tuple[Location, str] | None:
        """`(location, prefix)` of the store an instance at `provider/region` uses: the one there, else the nearest
        of the same provider (see the module docstring); None when the provider has none."""
        exact = self.by_location.get((provider, region))
        if exact is not None:
            return (provider, region), exact
        regions = sorted(r for p, r in self.by_location if p == provider)
        if not regions:
            return None

        def shared(other: str) -> int:
            n = 0
            for a, b in zip(region, other, strict=False):
                if a != b:
                    break
                n += 1
            return n

        best = min(regions, key=lambda r: (-shared(r), r))
        return (provider, best), self.by_location[(provider, best)]

    def broker_store(self, store_prefix: str, area: str) -> ObjectStore:
        """The store confined beneath `<store_prefix><area>`, one of the broker's own areas beside `tenants/`
        (`checkpoint_layout.BROKER_AREAS`), for a configured store prefix."""
        if area not in layout.BROKER_AREAS:
            raise CheckpointRefused(f"{area!r} is not one of the broker's areas {layout.BROKER_AREAS}")
        if store_prefix not in self.by_location.values():
            raise CheckpointRefused(f"{store_prefix!r} is not a configured checkpoint store")
        return store_at(store_prefix, self.clients(), prefix=area)

    def prefixes(self, tenant: str) -> list[Allowed]:
        """Every prefix `tenant` may use: its area in every store, then its extra prefixes."""
        try:
            areas = [Allowed(layout.tenant_area(p, tenant), loc, p, True) for loc, p in self.by_location.items()]
        except UnsafeKey:
            areas = []  # a tenant name that is not one safe segment owns no area anywhere
        return areas + [Allowed(p, loc, p, False) for p, loc in self.extra.get(tenant, {}).items()]

    def allowed_prefixes(self, tenant: str) -> list[str]:
        return [a.prefix for a in self.prefixes(tenant)]

    def match(self, uri: str, tenant: str) -> Match:
        """Which of `tenant`'s allowed prefixes holds `uri`; raises `CheckpointRefused` saying why none does."""
        allowed = self.prefixes(tenant)
        if not allowed:
            raise CheckpointRefused(
                f"no checkpoint location is configured for tenant {tenant!r}, so no checkpoint_uri is accepted: the "
                f"operator configures checkpoint stores ({STORES_VAR}; each tenant then owns <store>tenants/<tenant>/ "
                f"in every store) or assigns the tenant prefixes ({EXTRA_VAR})"
            )
        endpoint = self.azure_endpoint()
        reason = "it is not under any of them"
        try:
            parsed = parse_uri(uri, azure_endpoint=endpoint)
            safe_key((parsed.key[1:] if parsed.scheme == "file" else parsed.key).removesuffix("/"))
        except (ValueError, UnsafeKey) as exc:
            reason = str(exc)
        else:
            for candidate in allowed:
                try:
                    key = relative_key(uri, candidate.prefix, azure_endpoint=endpoint)
                except UnsafeKey:
                    continue
                reserved = layout.reserved_reason(key) if candidate.is_area else None
                if reserved is None:
                    return Match(candidate, key)
                reason = reserved
        raise CheckpointRefused(
            f"{uri!r} is not a checkpoint location of tenant {tenant!r}: {reason}. Allowed prefixes: "
            + ", ".join(a.prefix for a in allowed)
        )

    def locate(self, uri: str, tenant: str) -> Location | None:
        """The location of `uri` when it is one of `tenant`'s checkpoint locations, else None."""
        try:
            return self.match(uri, tenant).location
        except CheckpointRefused:
            return None

    def job_checkpoint_uri(self, location: Location, tenant: str, job_id: str) -> str | None:
        """Where the broker puts job `job_id`'s checkpoint at `location` (None when no store is there)."""
        prefix = self.near(*location)
        return layout.job_checkpoint_prefix(prefix, tenant, job_id) if prefix is not None else None

    # -- stores --------------------------------------------------------------------------------------------------

    def store(self, prefix: str) -> ObjectStore:
        """The store confined beneath `prefix`, a prefix built from a configured one (a store, a tenant's area, a
        job's checkpoint prefix): opened at the configured root and narrowed to the rest."""
        roots = [root for root in self._all_prefixes() if prefix.startswith(root)]
        if not roots:
            raise CheckpointRefused(f"{prefix!r} is under no configured checkpoint store or tenant prefix")
        root = max(roots, key=len)
        return store_at(root, self.clients(), prefix=prefix[len(root) :])

    def resolve_for_tenant(self, uri: str, tenant: str) -> tuple[ObjectStore, str]:
        """`(store confined beneath the tenant's prefix holding uri, key of uri in it)`; `CheckpointRefused` when
        `uri` is not one of the tenant's checkpoint locations."""
        found = self.match(uri, tenant)
        return self.store(found.allowed.prefix), found.key

    def resolve(self, uri: str) -> tuple[ObjectStore, str]:
        """`(store confined at the configured store or extra prefix holding uri, key of uri in it)`;
        `CheckpointRefused` for a URI under none of them."""
        endpoint = self.azure_endpoint()
        for prefix in self._all_prefixes():
            try:
                key = relative_key(uri, prefix, azure_endpoint=endpoint)
            except (UnsafeKey, ValueError):
                continue
            return self.store(prefix), key
        raise CheckpointRefused(f"{uri!r} is under no configured checkpoint store or tenant prefix")

    def clients(self) -> StoreClients:
        """SDK clients for the schemes in use (built once)."""
        if self._clients is None:
            schemes = {parse_prefix(p).scheme for p in self._all_prefixes()}
            self._clients = StoreClients(
                s3=self._s3() if "s3" in schemes else None,
                gcs=self._gcs() if "gs" in schemes else None,
                azure=self._azure() if "az" in schemes else None,
            )
        return self._clients

    def azure_endpoint(self) -> str | None:
        """The Azure client's endpoint (so URLs under an emulator's endpoint parse), when an az:// store is used."""
        if not self.settings.azure_storage_connection_string:
            return None
        if not any(parse_prefix(p).scheme == "az" for p in self._all_prefixes()):
            return None
        return str(self._azure().url)

    def _all_prefixes(self) -> list[str]:
        return [*self.by_location.values(), *(p for prefixes in self.extra.values() for p in prefixes)]

    def _s3(self) -> Any:
        import boto3
        from botocore.config import Config

        endpoint = self.settings.s3_endpoint_url or self.settings.aws_endpoint_url
        timeout = self.settings.cloud_timeout_seconds
        config = Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            signature_version="s3v4",  # presigned URLs (the agent's wheel) too: SigV2 is deprecated
            s3={"addressing_style": "path"} if endpoint else None,
        )
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
        if self._azure_client is None:
            self._azure_client = self._new_azure()
        return self._azure_client

    def _new_azure(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        if not self.settings.azure_storage_connection_string:
            raise ValueError(
                "OVERSPILL_AZURE_STORAGE_CONNECTION_STRING is needed for the az:// checkpoint stores configured"
            )
        return BlobServiceClient.from_connection_string(
            self.settings.azure_storage_connection_string, max_single_get_size=8 << 20, max_chunk_get_size=8 << 20
        )
