"""Building the compute providers the settings enable, with real SDK clients (imported only when enabled).

- `OVERSPILL_AWS_LAUNCH=true` with `OVERSPILL_AWS_REGIONS` and an image for each (`OVERSPILL_AWS_IMAGE_IDS` per
  region, AMI ids or `resolve:ssm:` parameters read from SSM at launch, else `OVERSPILL_AWS_IMAGE_ID`): launch on
  EC2 (spot and on-demand) with the instance profile, security groups, IMDSv2, extra tags and root volume of
  `OVERSPILL_AWS_*` (see `broker.config.launch`); `OVERSPILL_AWS_INTERRUPTION_QUEUE_URL` to receive EventBridge
  spot warnings through SQS.
- `OVERSPILL_GCP_LAUNCH=true` with `OVERSPILL_GCP_PROJECT`, `OVERSPILL_GCP_REGIONS` and an image for each
  (`OVERSPILL_GCP_IMAGES` or `OVERSPILL_GCP_IMAGE`): launch on Compute Engine (Spot and standard VMs) in the zones of
  those regions, as `OVERSPILL_GCP_SERVICE_ACCOUNT`, with `OVERSPILL_GCP_EXTRA_LABELS` and the boot disk of
  `OVERSPILL_GCP_DISK_GB`/`_TYPE`; Application Default Credentials (google.auth.default) and the REST transport;
  `OVERSPILL_GCP_ENDPOINT` points the clients elsewhere (the same override the GCP price feed uses).
- `OVERSPILL_AZURE_LAUNCH=true` with `OVERSPILL_AZURE_SUBSCRIPTION_ID`, `_RESOURCE_GROUP`, `_LOCATION`,
  `_SUBNET_ID`, an image (`_IMAGE_REFERENCES[location]` or `_IMAGE_REFERENCE`) and `_SSH_PUBLIC_KEY`: launch Azure
  VMs (Spot and regular) in that one location, as `_MANAGED_IDENTITY_ID`, with `_EXTRA_TAGS` and the OS disk of
  `_OS_DISK_GB`/`_TYPE`, with DefaultAzureCredential; `OVERSPILL_AZURE_ENDPOINT` points the ARM client elsewhere.
  One provider serves one location, so `OVERSPILL_AZURE_REGIONS` (the prices the broker places on) may name no
  other.
- `OVERSPILL_LIBCLOUD_PROVIDER=openstack` (+ key, secret, image id, driver options): a private cloud via libcloud,
  offering the sizes `OVERSPILL_LIBCLOUD_PRICES` prices (GPUs from `OVERSPILL_LIBCLOUD_GPUS` or the flavor's extra
  specs) in `OVERSPILL_LIBCLOUD_ZONES` of `OVERSPILL_LIBCLOUD_REGION`.
- `OVERSPILL_SLURM_PARTITIONS={...}`: the on-prem Slurm cluster (its pools, pressure and queue), priced at each
  partition's internal $/GPU-hour; jobs are submitted as each tenant's `OVERSPILL_SLURM_SUBMIT_AS` user through
  `OVERSPILL_SLURM_SUBMIT_WRAPPER` (a tenant without one is not placed there).
The built-in simulated providers are wired in `broker.runtime`.

Every cloud adapter retries transient failures itself (`OVERSPILL_CLOUD_RETRY_ATTEMPTS` calls at most, jittered
backoff, never a capacity or quota answer: providers/retry.py), so each SDK's own retries are off (botocore
`total_max_attempts=1`, google-api-core `retry=None` on every call, azure-core `retry_total=0`, libcloud's by default)
and every call has `OVERSPILL_CLOUD_TIMEOUT_SECONDS` to connect and to answer.

Test credentials: `OVERSPILL_GCP_ANONYMOUS_CREDENTIALS=true` (no Google credentials at all) and
`OVERSPILL_AZURE_STATIC_TEST_TOKEN=true` (a fixed bearer token, sent over plain http too) exist for tests against
local stand-ins; each is refused unless its endpoint override is set, and in production.
A setting missing for an enabled provider raises `ValueError` naming the variable.

`gcp_credentials(settings)` and `azure_compute_client(settings)` are the credential and ARM client wiring on their
own, for other code that talks to the same clouds (the price feeds) to share.
"""

from __future__ import annotations

from typing import Any

from broker.config.settings import Settings
from providers.base import ComputeProvider

GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ARM_SCOPE = "https://management.azure.com/.default"


def build_providers(settings: Settings) -> list[ComputeProvider]:
    out: list[ComputeProvider] = []
    if settings.aws_launch:
        out.append(_aws(settings))
    if settings.gcp_launch:
        out.append(_gcp(settings))
    if settings.azure_launch:
        out.append(_azure(settings))
    if settings.libcloud_provider:
        out.append(_libcloud(settings))
    if settings.slurm_partitions:
        out.append(_slurm(settings))
    return out


def _slurm(settings: Settings) -> ComputeProvider:
    from decimal import Decimal

    from federation.pressure import QueueModel
    from providers.slurm.container import container_command
    from providers.slurm.provider import PartitionInfo, SlurmProvider, subprocess_runner

    partitions = {}
    for name, spec in settings.slurm_partitions.items():
        try:
            partitions[name] = PartitionInfo(
                accelerator=spec["accelerator"],
                rate_usd_per_gpu_hour=Decimal(spec["rate_usd_per_gpu_hour"]),
                gpus_per_node=int(spec.get("gpus_per_node", "8")),
                gres_type=spec.get("gres_type"),
            )
        except (KeyError, ArithmeticError, ValueError) as exc:
            raise ValueError(f"OVERSPILL_SLURM_PARTITIONS[{name!r}]: {exc!r} (needs accelerator and rate)") from exc
    conf = settings.slurm_conf or None
    run = subprocess_runner(conf)
    try:
        return SlurmProvider(
            broker_id=settings.broker_id,
            partitions=partitions,
            queue_model=QueueModel,
            run=run,
            slurm_conf=conf,
            transport=slurm_transport(settings, run),
            submit_as=settings.slurm_submit_as,
            submit_wrapper=settings.slurm_submit_wrapper,
            hold_key=slurm_hold_key(settings),
            command=container_command(
                settings.slurm_container_runtime, settings.slurm_container_launcher, settings.slurm_container_args
            ),
            output=settings.slurm_job_output,
            workdir=settings.slurm_job_workdir or None,
        )
    except ValueError as exc:
        raise ValueError(f"OVERSPILL_SLURM_SUBMIT_AS / OVERSPILL_SLURM_SUBMIT_WRAPPER: {exc}") from exc


def slurm_transport(settings: Settings, run: Any) -> Any:
    """The Slurm transport `OVERSPILL_SLURM_TRANSPORT` names: None for the tools (the provider's default), or
    slurmrestd (`providers.slurm.rest`) with the tools as its fallback for what v0.0.38 cannot do."""
    if settings.slurm_transport == "cli":
        return None
    from providers.slurm.rest import RestTransport
    from providers.slurm.transport import CliTransport

    if not settings.slurmrestd_url:
        raise ValueError("OVERSPILL_SLURM_TRANSPORT=rest needs OVERSPILL_SLURMRESTD_URL")
    if not settings.slurmrestd_user:
        raise ValueError("OVERSPILL_SLURM_TRANSPORT=rest needs OVERSPILL_SLURMRESTD_USER (the token's operator)")
    if not settings.slurm_jwt_file and not settings.slurm_jwt:
        raise ValueError("OVERSPILL_SLURM_TRANSPORT=rest needs OVERSPILL_SLURM_JWT_FILE (or OVERSPILL_SLURM_JWT)")
    try:
        return RestTransport(
            settings.slurmrestd_url,
            settings.slurmrestd_user,
            fallback=CliTransport(run),
            token=settings.slurm_jwt,
            token_file=settings.slurm_jwt_file,
            timeout=settings.slurmrestd_timeout_seconds,
        )
    except ValueError as exc:
        raise ValueError(f"OVERSPILL_SLURMRESTD_URL: {exc}") from exc


def slurm_hold_key(settings: Settings) -> bytes:
    """The key that signs the broker's hold marks in Slurm job comments (derived from the callback key)."""
    import hashlib

    return hashlib.sha256(b"overspill-slurm-hold:" + settings.callback_key()).digest()


def _aws(settings: Settings) -> ComputeProvider:
    from datetime import timedelta

    import boto3
    from botocore.config import Config

    from broker.config.launch import aws_images, aws_options
    from providers.aws import SSM_PREFIX, AmiResolver, AwsProvider
    from providers.retry import RetryPolicy

    if not settings.aws_regions:
        raise ValueError("OVERSPILL_AWS_LAUNCH needs OVERSPILL_AWS_REGIONS")
    images = aws_images(settings)
    options = aws_options(settings)
    session = boto3.session.Session()
    # botocore's own retries are off: the adapter retries transient failures itself (bounded, jittered) and
    # never retries a capacity answer (see providers/aws.py); timeouts bound a hung endpoint
    config = Config(
        retries={"total_max_attempts": 1},
        connect_timeout=settings.cloud_timeout_seconds,
        read_timeout=settings.cloud_timeout_seconds,
    )
    ec2 = {
        r: session.client("ec2", region_name=r, endpoint_url=settings.aws_endpoint_url, config=config)
        for r in settings.aws_regions
    }
    queue = settings.aws_interruption_queue_url or None
    sqs = session.client("sqs", region_name=settings.aws_regions[0], endpoint_url=settings.aws_endpoint_url)
    subnets = settings.aws_subnet_ids
    ssm = (
        {r: session.client("ssm", region_name=r, endpoint_url=settings.aws_endpoint_url, config=config) for r in images}
        if any(v.startswith(SSM_PREFIX) for v in images.values())
        else None
    )
    retry = RetryPolicy(attempts=settings.cloud_retry_attempts)
    return AwsProvider(
        ec2,
        broker_id=settings.broker_id,
        sqs_client=sqs if queue else None,
        queue_url=queue,
        image_id_for=AmiResolver(images, ssm_clients=ssm, retry=retry),
        subnet_for=(lambda off: subnets.get(off.zone)) if subnets else None,
        options=options,
        retry=retry,
        redeliver_after=timedelta(seconds=settings.aws_interruption_redeliver_seconds),
    )


def _test_only(settings: Settings, flag: str, endpoint: str | None, endpoint_var: str) -> None:
    """A test-credentials flag is honoured only against an endpoint override, and never in production."""
    if not endpoint:
        raise ValueError(f"{flag} is for tests against a local endpoint: it needs {endpoint_var}")
    if settings.env == "production":
        raise ValueError(f"{flag} is for tests: refused with OVERSPILL_ENV=production")


def gcp_credentials(settings: Settings) -> Any:
    """The Google credentials the settings call for: Application Default Credentials (google.auth.default), or
    anonymous ones for tests (`OVERSPILL_GCP_ANONYMOUS_CREDENTIALS`, only with `OVERSPILL_GCP_ENDPOINT`)."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    if settings.gcp_anonymous_credentials:
        _test_only(settings, "OVERSPILL_GCP_ANONYMOUS_CREDENTIALS", settings.gcp_endpoint, "OVERSPILL_GCP_ENDPOINT")
        return AnonymousCredentials()
    try:
        credentials, _ = google.auth.default(scopes=[GCP_SCOPE])
    except DefaultCredentialsError as exc:
        raise ValueError(
            "Google Application Default Credentials are needed (GOOGLE_APPLICATION_CREDENTIALS, "
            f"`gcloud auth application-default login` or an attached service account): {exc}"
        ) from exc
    return credentials


def azure_compute_client(settings: Settings) -> Any:
    """The ARM compute client the settings describe: `OVERSPILL_AZURE_SUBSCRIPTION_ID`, DefaultAzureCredential (or
    the static test token with `OVERSPILL_AZURE_ENDPOINT`), azure-core's retries off (`retry_total=0`: callers
    retry transient failures themselves) and `OVERSPILL_CLOUD_TIMEOUT_SECONDS` to connect and to read."""
    import time

    from azure.core.credentials import AccessToken, TokenCredential
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

    client_options: dict[str, Any] = {
        "retry_total": 0,
        "connection_timeout": settings.cloud_timeout_seconds,
        "read_timeout": settings.cloud_timeout_seconds,
    }
    if settings.azure_endpoint:
        client_options["base_url"] = settings.azure_endpoint
        client_options["credential_scopes"] = [ARM_SCOPE]
    credential: TokenCredential
    if settings.azure_static_test_token:
        _test_only(settings, "OVERSPILL_AZURE_STATIC_TEST_TOKEN", settings.azure_endpoint, "OVERSPILL_AZURE_ENDPOINT")

        class StaticTestToken:
            """A fixed bearer token for a local ARM stand-in."""

            def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
                return AccessToken("overspill-static-test-token", int(time.time()) + 3600)

        class PlainHttpBearer(ARMChallengeAuthenticationPolicy):
            """azure-core refuses a bearer token over http unless `enforce_https` is off (a local stand-in)."""

            def on_request(self, request: Any) -> None:
                request.context["enforce_https"] = False
                super().on_request(request)

        credential = StaticTestToken()
        if str(settings.azure_endpoint).startswith("http://"):
            client_options["authentication_policy"] = PlainHttpBearer(credential, ARM_SCOPE)
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return ComputeManagementClient(credential, settings.azure_subscription_id, **client_options)


def _gcp(settings: Settings) -> ComputeProvider:
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    from broker.config.launch import gcp_checked, gcp_images
    from providers.gcp import GcpProvider
    from providers.retry import RetryPolicy

    if not settings.gcp_project or not settings.gcp_regions:
        raise ValueError("OVERSPILL_GCP_LAUNCH needs OVERSPILL_GCP_PROJECT and OVERSPILL_GCP_REGIONS")
    images = gcp_images(settings)
    gcp_checked(settings)
    credentials = gcp_credentials(settings)
    options = ClientOptions(api_endpoint=settings.gcp_endpoint) if settings.gcp_endpoint else None
    # one credential for both clients (one token); the adapter passes retry=None and a timeout on every call
    instances = compute_v1.InstancesClient(transport="rest", client_options=options, credentials=credentials)
    operations = compute_v1.ZoneOperationsClient(transport="rest", client_options=options, credentials=credentials)
    return GcpProvider(
        instances,
        operations,
        project=settings.gcp_project,
        broker_id=settings.broker_id,
        image=settings.gcp_image,
        images=images,
        network=settings.gcp_network,
        termination_action=settings.gcp_termination_action,
        boot_disk_gb=settings.gcp_disk_gb,
        boot_disk_type=settings.gcp_disk_type,
        service_account=settings.gcp_service_account,
        extra_labels=settings.gcp_extra_labels,
        timeout=settings.cloud_timeout_seconds,
        retry=RetryPolicy(attempts=settings.cloud_retry_attempts),
    )


def _azure(settings: Settings) -> ComputeProvider:
    from broker.config.launch import azure_checked, azure_image
    from providers.azure import AzureProvider
    from providers.retry import RetryPolicy

    required = {
        "OVERSPILL_AZURE_SUBSCRIPTION_ID": settings.azure_subscription_id,
        "OVERSPILL_AZURE_RESOURCE_GROUP": settings.azure_resource_group,
        "OVERSPILL_AZURE_LOCATION": settings.azure_location,
        "OVERSPILL_AZURE_SUBNET_ID": settings.azure_subnet_id,
        "OVERSPILL_AZURE_IMAGE_REFERENCE": settings.azure_image_reference or settings.azure_image_references,
        "OVERSPILL_AZURE_SSH_PUBLIC_KEY": settings.azure_ssh_public_key,
    }
    missing = [name for name, value in required.items() if not value]
    if missing:
        raise ValueError(f"OVERSPILL_AZURE_LAUNCH needs {', '.join(missing)}")
    elsewhere = sorted({r for r in settings.azure_regions if r.lower() != settings.azure_location.lower()})
    if elsewhere:
        raise ValueError(
            f"OVERSPILL_AZURE_REGIONS prices {', '.join(elsewhere)}, where OVERSPILL_AZURE_LOCATION="
            f"{settings.azure_location} cannot launch: one Azure provider launches in one location"
        )
    image = azure_image(settings)
    azure_checked(settings)
    return AzureProvider(
        azure_compute_client(settings),
        resource_group=settings.azure_resource_group,
        location=settings.azure_location,
        broker_id=settings.broker_id,
        subnet_id=settings.azure_subnet_id,
        image_reference=image,
        admin_username=settings.azure_admin_username,
        ssh_public_key=settings.azure_ssh_public_key,
        eviction_policy=settings.azure_eviction_policy,
        os_disk_gb=settings.azure_os_disk_gb,
        os_disk_type=settings.azure_os_disk_type,
        managed_identity_id=settings.azure_managed_identity_id,
        extra_tags=settings.azure_extra_tags,
        retry=RetryPolicy(attempts=settings.cloud_retry_attempts),
    )


def _libcloud(settings: Settings) -> ComputeProvider:
    """The libcloud cloud: on-demand offerings for the sizes given a price (and GPUs), in the configured zones,
    launched there; transient failures retried like the other clouds' (`cloud_retry_attempts`), each call bounded
    by `cloud_timeout_seconds` unless the driver options set their own `timeout`."""
    from providers.libcloud import GpuSpec, LibcloudProvider
    from providers.retry import RetryPolicy

    gpus: dict[str, GpuSpec] = {}
    for size, text in settings.libcloud_gpus.items():
        try:
            gpus[size] = GpuSpec.parse(text)
        except ValueError as exc:
            raise ValueError(f"OVERSPILL_LIBCLOUD_GPUS[{size!r}]: {exc}") from exc
    zones = tuple(settings.libcloud_zones)
    return LibcloudProvider.from_config(
        settings.libcloud_provider,
        settings.libcloud_key,
        settings.libcloud_secret or None,
        name=settings.libcloud_provider.lower(),
        broker_id=settings.broker_id,
        image_id=settings.libcloud_image_id,
        location_for=(lambda offering: offering.zone or None) if zones else None,
        region=settings.libcloud_region,
        zones=zones or ("",),
        gpus=gpus,
        prices=settings.libcloud_prices,
        retry=RetryPolicy(attempts=settings.cloud_retry_attempts),
        driver_options={"timeout": settings.cloud_timeout_seconds, **settings.libcloud_options},
    )
