"""What the broker tells the instance agent about one attempt: the `AttemptSpec` (agent/protocol.py) and the
start-up script's inputs. Pure functions of the job, the placement and the settings; the launch step
(`broker.loop.attempt`) writes the spec and renders the script.

Which instances run the agent: those of providers whose adapter says so (`boots_agent = True`: AWS, GCP, Azure and
libcloud clouds). The simulated clouds and Slurm run no agent. Their `notice_source` (`aws`, `gcp`, `azure`; none
for others) is the interruption notice the agent watches.

The spec (`build_spec`):
- `command`, `image` (validated again: `providers.images.validate_image`), `gpu_count`, `shm_size_gb` (None: the
  container shares the host's IPC namespace), `env` and the `secrets` *references* from the job; the references
  are checked again against the tenant's `tenant_secret_prefixes` (`secret_ref_refusal`): a reference the operator
  no longer allows is never handed to an instance;
- `runtime` from `agent_runtime[provider]` (default the provider's `default_runtime`, else `docker`: `process`
  only when configured, or on the local pool, whose default it is);
- `checkpoint`: the job's checkpoint URI after staging (a prefix ending in `/`), `resume` when there is an earlier
  checkpoint to restore, the checkpoint interval;
- `logs_uri` = `<attempt prefix>logs/`, `mailbox_uri` = the tenant's mailbox in the same store, `report_key` =
  `callback_token(settings, placement id)` (hex HMAC: the same token the callback route checks),
  `callback_url` = `<public_url>/v1/placements/<id>/reports` when `public_url` is set;
- `registry`: `registry_secret` when the job names one, else derived from the image's registry host
  (`*.dkr.ecr.<region>.amazonaws.com` -> ecr, `*-docker.pkg.dev` / `gcr.io` -> gcp, `*.azurecr.io` -> acr, anything
  else none: a public image);
- `notice`: by provider; `heartbeat_seconds` from settings;
- `gpu_count`: the job's, or 0 on a provider whose pools are CPU slots (`agent_gpu_count`).

`agent_root` and `agent_systemd` shape the start-up script for providers that run several attempts on one host
(the local pool: a directory per attempt, never a systemd unit).

`bootstrap_env` is what the start-up script exports for the agent: endpoint overrides the broker itself uses
(`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL_SECRETS_MANAGER`, `AWS_ENDPOINT_URL_ECR`, `STORAGE_EMULATOR_HOST`) and,
with an `az://` store, the account endpoint `OVERSPILL_AZURE_BLOB_ENDPOINT`. Nothing secret ever goes there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agent import protocol as p
from agent.registry import ACR_HOST, ECR_HOST, GCP_HOST
from broker.api.auth import callback_token
from broker.config.checkpoint_stores import CheckpointStores
from broker.config.settings import Settings
from providers.images import validate_image
from providers.model import JobSpec, SecretReference

REGISTRY_SECRET_ENV = "REGISTRY_SECRET"  # the agent names the registry secret by this in its messages


def boots_agent(provider: object) -> bool:
    """Whether instances of this provider run the agent (its adapter says so)."""
    return bool(getattr(provider, "boots_agent", False))


def notice_source(provider: object) -> p.NoticeSource:
    """The interruption notice the agent watches on this provider's instances."""
    try:
        return p.NoticeSource(str(getattr(provider, "notice_source", "none")))
    except ValueError:
        return p.NoticeSource.NONE


def agent_root(provider: object, region: str, placement_id: str, default: str) -> str:
    """Where the agent keeps its files on the instance: the provider's own place for the attempt when it runs
    several on one host (the local pool: `agent_root(region, placement_id)`), else the configured `agent_root`."""
    own = getattr(provider, "agent_root", None)
    return str(own(region, placement_id)) if callable(own) else default


def agent_systemd(provider: object) -> bool:
    """Whether the start-up script may start the agent as a systemd unit (not on a shared host: the local pool)."""
    return bool(getattr(provider, "agent_systemd", True))


def agent_gpu_count(provider: object, gpu_count: int) -> int:
    """The GPUs the agent gives the workload: none on a provider whose pools are CPU slots (`provides_gpus`
    False: the local pool on a machine without GPUs), else the job's `gpu_count`."""
    return gpu_count if getattr(provider, "provides_gpus", True) else 0


def secret_ref_refusal(prefixes_by_tenant: Mapping[str, list[str]], tenant: str, ref: str) -> str | None:
    """Why `tenant` may not reference the secret `ref`, or None when it lies strictly beneath one of its prefixes
    (`tenant_secret_prefixes`) with no `..` segment."""
    prefixes = prefixes_by_tenant.get(tenant) or []
    if not prefixes:
        return (
            f"tenant {tenant!r} may reference no secrets: the operator lists the secret prefixes each tenant may use "
            'in OVERSPILL_TENANT_SECRET_PREFIXES, e.g. {"acme": ["arn:aws:secretsmanager:us-east-1:123456789012:secret:'
            'overspill/jobs/acme/", "projects/p/secrets/acme-", "https://acme-kv.vault.azure.net/secrets/"]}'
        )
    beneath = any(ref.startswith(prefix) and len(ref) > len(prefix) for prefix in prefixes)
    if beneath and ".." not in ref.split("/"):
        return None
    return f"{ref!r} is not under one of tenant {tenant!r}'s secret prefixes: " + ", ".join(prefixes)


def secret_refusals(settings: Settings, tenant: str, spec: JobSpec) -> list[tuple[str, str]]:
    """(field, reason) for every secret reference of the job its tenant may not use."""
    out: list[tuple[str, str]] = []
    for i, secret in enumerate(spec.secrets):
        reason = secret_ref_refusal(settings.tenant_secret_prefixes, tenant, secret.ref)
        if reason:
            out.append((f"secrets[{i}].ref", reason))
    if spec.registry_secret is not None:
        reason = secret_ref_refusal(settings.tenant_secret_prefixes, tenant, spec.registry_secret.ref)
        if reason:
            out.append(("registry_secret.ref", reason))
    return out


def image_registry(image: str) -> str:
    """The registry host of an image reference (`docker.io` when it names none)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def registry_auth(image: str, registry_secret: SecretReference | None) -> p.RegistryAuth:
    """How the agent logs in to the image's registry (see the module docstring)."""
    server = image_registry(image)
    if registry_secret is not None:
        return p.RegistryAuth(p.RegistryAuthKind.SECRET, server, _ref(REGISTRY_SECRET_ENV, registry_secret))
    host = server.lower()
    if ECR_HOST.match(host):
        return p.RegistryAuth(p.RegistryAuthKind.ECR, server)
    if GCP_HOST.match(host):
        return p.RegistryAuth(p.RegistryAuthKind.GCP, server)
    if ACR_HOST.match(host):
        return p.RegistryAuth(p.RegistryAuthKind.ACR, server)
    return p.RegistryAuth()


def _ref(env: str, secret: SecretReference) -> p.SecretRef:
    return p.SecretRef(env, p.SecretSource(secret.source), secret.ref, secret.field)


def build_spec(
    settings: Settings,
    spec: JobSpec,
    *,
    job_id: str,
    placement_id: str,
    provider_name: str,
    provider: object,
    checkpoint_uri: str,
    resume: bool,
    attempt_prefix: str,
    mailbox_uri: str,
) -> p.AttemptSpec:
    """The attempt's spec. Raises ValueError naming the field when the job's image is no image reference or one of
    its secret references is not its tenant's to use."""
    runtime = p.Runtime(
        settings.agent_runtime.get(provider_name, str(getattr(provider, "default_runtime", p.Runtime.DOCKER.value)))
    )
    if spec.image or runtime is not p.Runtime.PROCESS:  # the process runtime runs the command on the host: no image
        try:
            validate_image(spec.image)
        except ValueError as exc:
            raise ValueError(f"image: {exc} (the {runtime.value} runtime of {provider_name} needs one)") from None
    refused = secret_refusals(settings, spec.tenant, spec)
    if refused:
        raise ValueError("; ".join(f"{name}: {reason}" for name, reason in refused))
    public = settings.public_url.rstrip("/")
    return p.AttemptSpec(
        job_id=job_id,
        placement_id=placement_id,
        tenant=spec.tenant,
        command=tuple(spec.command),
        runtime=runtime,
        checkpoint=p.CheckpointSpec(
            uri=checkpoint_uri if checkpoint_uri.endswith("/") else checkpoint_uri + "/",
            resume=resume,
            interval_seconds=max(60, int(settings.checkpoint_interval_hours * 3600)),
        ),
        logs_uri=attempt_prefix + p.LOGS_DIR,
        mailbox_uri=mailbox_uri,
        report_key=callback_token(settings, placement_id),
        image=spec.image,
        env=dict(spec.env),
        secrets=tuple(_ref(s.env, s) for s in spec.secrets),
        gpu_count=agent_gpu_count(provider, spec.gpu_count),
        shm_size_gb=str(spec.shm_size_gb) if spec.shm_size_gb is not None else None,
        registry=registry_auth(spec.image, spec.registry_secret),
        notice=p.NoticeSpec(source=notice_source(provider)),
        callback_url=f"{public}/v1/placements/{placement_id}/reports" if public else None,
        heartbeat_seconds=settings.agent_heartbeat_seconds,
    )


def bootstrap_env(settings: Settings, stores: CheckpointStores) -> dict[str, str]:
    """The endpoint variables the start-up script exports for the agent (nothing secret; see the module doc)."""
    env: dict[str, str] = {}
    s3 = settings.s3_endpoint_url or settings.aws_endpoint_url
    if s3:
        env["AWS_ENDPOINT_URL_S3"] = s3
    secrets = settings.secrets_endpoint_url or settings.aws_endpoint_url
    if secrets:
        env["AWS_ENDPOINT_URL_SECRETS_MANAGER"] = secrets
    if settings.aws_endpoint_url:
        env["AWS_ENDPOINT_URL_ECR"] = settings.aws_endpoint_url
    if settings.gcs_endpoint:
        env["STORAGE_EMULATOR_HOST"] = settings.gcs_endpoint
    azure = stores.azure_endpoint()
    if azure:
        env["OVERSPILL_AZURE_BLOB_ENDPOINT"] = _without_query(azure)
    return env


def _without_query(url: str) -> str:
    """An account endpoint without any SAS query (a connection string may carry one)."""
    return re.sub(r"[?#].*$", "", url).rstrip("/")
