"""Building the compute providers the settings enable, with real SDK clients (imported only when enabled).

- `OVERSPILL_AWS_LAUNCH=true` with `OVERSPILL_AWS_REGIONS` and `OVERSPILL_AWS_IMAGE_ID`: launch on EC2 (spot and
  on-demand); `OVERSPILL_AWS_INTERRUPTION_QUEUE_URL` to receive EventBridge spot warnings through SQS.
- `OVERSPILL_LIBCLOUD_PROVIDER=openstack` (+ key, secret, image id, driver options): a private cloud via libcloud.
- `OVERSPILL_SLURM_PARTITIONS={...}`: the on-prem Slurm cluster (its pools, pressure and queue), priced at each
  partition's internal $/GPU-hour.
The built-in simulated providers are wired in `broker.runtime`.
"""

from __future__ import annotations

from broker.settings import Settings
from providers.base import ComputeProvider


def build_providers(settings: Settings) -> list[ComputeProvider]:
    out: list[ComputeProvider] = []
    if settings.aws_launch:
        out.append(_aws(settings))
    if settings.libcloud_provider:
        out.append(_libcloud(settings))
    if settings.slurm_partitions:
        out.append(_slurm(settings))
    return out


def _slurm(settings: Settings) -> ComputeProvider:
    from decimal import Decimal

    from providers.slurm import PartitionInfo, SlurmProvider, subprocess_runner

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
    return SlurmProvider(
        broker_id=settings.broker_id, partitions=partitions, run=subprocess_runner(conf), slurm_conf=conf
    )


def _aws(settings: Settings) -> ComputeProvider:
    from datetime import timedelta

    import boto3
    from botocore.config import Config

    from providers.aws import AwsProvider
    from providers.retry import RetryPolicy

    if not settings.aws_regions or not settings.aws_image_id:
        raise ValueError("OVERSPILL_AWS_LAUNCH needs OVERSPILL_AWS_REGIONS and OVERSPILL_AWS_IMAGE_ID")
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
    return AwsProvider(
        ec2,
        broker_id=settings.broker_id,
        sqs_client=sqs if queue else None,
        queue_url=queue,
        image_id_for=settings.aws_image_id,
        subnet_for=(lambda off: subnets.get(off.zone)) if subnets else None,
        retry=RetryPolicy(attempts=settings.cloud_retry_attempts),
        redeliver_after=timedelta(seconds=settings.aws_interruption_redeliver_seconds),
    )


def _libcloud(settings: Settings) -> ComputeProvider:
    from providers.libcloud import LibcloudProvider

    return LibcloudProvider.from_config(
        settings.libcloud_provider,
        settings.libcloud_key,
        settings.libcloud_secret or None,
        name=settings.libcloud_provider.lower(),
        broker_id=settings.broker_id,
        image_id=settings.libcloud_image_id,
        **settings.libcloud_options,
    )
