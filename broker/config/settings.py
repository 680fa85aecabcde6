"""Broker configuration from the environment (`OVERSPILL_*`), with defaults that run everything locally.

Build with `Settings()` (reads the environment) or `Settings(field=...)` in tests; never at import time.
In production mode the broker refuses to start with the development API key, an empty or short secret (the metrics
token included: /metrics is never open in production), or a well-known default (broker/config/secrets.py); secrets
may come from AWS Secrets Manager (`OVERSPILL_<NAME>_ARN`) and are kept out of `repr(settings)`.
"""

from __future__ import annotations

from decimal import Decimal
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.slurm.accounts import SlurmAccountPolicy
from overspill.defaults import DEV_API_KEY  # the one definition, shared with the client without importing this


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVERSPILL_", extra="ignore")

    env: Literal["development", "production"] = Field(
        default="development",
        description="production refuses to start with the development key, or an empty, short or well-known default "
        "secret (broker/config/secrets.py)",
    )
    data_dir: Path = Field(
        default=Path(".overspill"), description="where the default SQLite database (and reports, logs of the demo) live"
    )
    database_url: str = Field(default="", repr=False, description="SQLAlchemy URL; default: SQLite file in data_dir")
    host: str = Field(default="127.0.0.1", description="address `overspill serve` listens on")
    port: int = Field(default=8000, description="port `overspill serve` listens on")

    broker_id: str = Field(
        default="overspill-local",
        description="this deployment's name in the `overspill:broker` tag of every instance it launches; the orphan "
        "sweep only ever touches instances carrying it",
    )
    bootstrap_tenant: str = Field(
        default="demo",
        description="tenant of the bootstrap key; tenant names everywhere are 1-63 characters of a-z0-9_-, starting "
        "with a letter or digit (broker/config/tenants.py)",
    )
    bootstrap_api_key: str = Field(default=DEV_API_KEY, repr=False, description="admin key created at first start")

    simulated: bool = Field(default=True, description="run the built-in simulated cloud market and on-prem")
    seed: int = Field(default=7, description="seed of the simulated market (same seed, same market)")
    onprem_gpus: dict[str, int] = Field(
        default_factory=lambda: {"A100": 32, "V100": 16}, description='simulated on-prem fleet, JSON {"A100": 32}'
    )
    onprem_rate_usd_per_gpu_hour: dict[str, Decimal] = Field(
        default_factory=lambda: {"A100": Decimal("1.10"), "V100": Decimal("0.45")},
        description="internal (amortised) $/GPU-hour per GPU type",
    )
    onprem_background_jobs_per_hour: float = Field(
        default=6.0, ge=0, description="other users' jobs arriving per hour on the simulated on-prem cluster"
    )
    tick_interval_seconds: float = Field(
        default=10.0, description="control loop period of `overspill serve` and `tick --loop`"
    )
    # -- the local pool (providers/local): this machine and SSH hosts, jobs run under the real agent --------------
    local_pool: bool | None = Field(
        default=None,
        description="offer this machine (and local_pool_hosts) as an on-prem pool whose jobs run under the real "
        "instance agent; default: on under `overspill serve`, off when the broker is embedded",
    )
    local_pool_this_machine: bool = Field(default=True, description="offer this machine itself in the local pool")
    local_pool_slots: int | None = Field(
        default=None, ge=1, description="slots of this machine: its GPUs (nvidia-smi), else CPU slots; default all"
    )
    local_pool_accelerator: str | None = Field(
        default=None, description="the name of this machine's GPUs (default from nvidia-smi); CPU: offer CPU slots"
    )
    local_pool_rate_usd_per_hour: Decimal = Field(
        default=Decimal("0"), ge=0, description="what one slot-hour of the local pool costs (the ledger's rate)"
    )
    local_pool_root: Path | None = Field(
        default=None, description="where the local pool's attempts live on this machine (default data_dir/pool)"
    )
    local_pool_hosts: dict[str, dict[str, str | int]] = Field(
        default_factory=dict,
        description='SSH hosts of the local pool, e.g. {"gpu1": {"ssh": "me@gpu1", "port": 22, "identity_file": '
        '"~/.ssh/id_ed25519", "slots": 4, "accelerator": "A100", "root": "/var/tmp/overspill-pool"}}',
    )
    shard_lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="how long a tick replica's shard leases last without renewal (each tick renews them): a replica "
        "that stops has its share of the live placements taken over by the others after this long",
    )
    tick_item_quarantine_after: int = Field(
        default=5,
        ge=1,
        description="ticks in a row an item (placement, mailbox entry, feed, report run) may fail in a step before "
        "it is quarantined: skipped by that step until an operator releases it (broker.services.bulkhead)",
    )
    loop_batch_size: int = Field(
        default=100,
        ge=1,
        description="placements the sync and accrual steps handle per transaction (fewer commits; shorter locks)",
    )
    accrual_cadence_seconds: float = Field(
        default=60.0,
        ge=0,
        description="a running placement's cost is written to the ledger once its unaccrued stretch reaches this "
        "long (at once when it ends, its price changes or a UTC day ends); 0 accrues every placement every tick. "
        "Ceilings and budgets add the unaccrued stretch, so a longer cadence never lets them be overspent",
    )
    price_stale_after_seconds: float = Field(
        default=3 * 3600, description="price data older than this is marked stale and makes `/readyz` fail"
    )

    interruption_traces: dict[str, Path] = Field(
        default_factory=dict,
        description="spot availability traces (JSON) as interruption priors, by pool-key prefix, e.g. "
        '{"aws/us-east-1/us-east-1a/p3.2xlarge": "trace.json"}',
    )
    price_refresh_seconds: float = Field(default=300.0, description="how often live cloud price feeds are asked")
    aws_regions: list[str] = Field(default_factory=list, description="enables the AWS price feed for these regions")
    aws_instance_types: list[str] = Field(
        default_factory=list, description="limit the AWS feed (default: all GPU types)"
    )
    aws_endpoint_url: str | None = Field(default=None, description="EC2 endpoint override (e.g. a moto server)")
    aws_spot_advisor_file: Path | None = Field(default=None, description="Spot Instance Advisor JSON (.gz ok)")
    gcp_project: str = Field(default="", description="enables the GCP price feed (Cloud Billing Catalog)")
    gcp_regions: list[str] = Field(
        default_factory=list, description="with gcp_project: the GCP price feed (Cloud Billing Catalog + Compute) here"
    )
    gcp_endpoint: str | None = Field(default=None, description="API endpoint override for tests")
    azure_regions: list[str] = Field(default_factory=list, description="enables the Azure Retail Prices feed")
    azure_prices_url: str = Field(
        default="https://prices.azure.com/api/retail/prices",
        description="Azure Retail Prices API base URL (a local stand-in in tests)",
    )
    azure_subscription_id: str = Field(default="", description="with azure_regions: VM sizes from azure-mgmt-compute")

    aws_launch: bool = Field(default=False, description="launch jobs on AWS in aws_regions (needs an image per region)")
    aws_image_id: str = Field(
        default="", description="AMI with Docker and NVIDIA drivers for any region aws_image_ids does not name"
    )
    aws_image_ids: dict[str, str] = Field(
        default_factory=dict,
        description='AMI per region (AMIs are regional): an id or "resolve:ssm:/param/name", read from SSM at launch',
    )
    aws_subnet_ids: dict[str, str] = Field(default_factory=dict, description='per AZ, e.g. {"us-east-1a": "subnet-.."}')
    aws_instance_profile: str = Field(default="", description="instance profile ARN or name the instances run as")
    aws_security_group_ids: list[str] | dict[str, list[str]] = Field(
        default_factory=list, description='security groups, one list for every region or per region {"us-east-1": [..]}'
    )
    aws_imds_v2_required: bool = Field(
        default=True, description="IMDSv2 only, PUT hop limit 1: containers cannot reach the instance's credentials"
    )
    aws_extra_tags: dict[str, str] = Field(default_factory=dict, description="tags added to instances and volumes")
    aws_root_volume_gb: int = Field(default=200, description="root EBS volume size (encrypted, deleted on termination)")
    aws_root_volume_type: str = Field(default="gp3", description="root EBS volume type (gp3, gp2, io1, io2)")
    aws_public_ipv4: bool = Field(
        default=True, description="the instances get a public IPv4 (a default VPC's subnets give one): billed hourly"
    )
    aws_interruption_queue_url: str = Field(default="", description="SQS queue fed by EventBridge spot warnings")
    aws_interruption_redeliver_seconds: int = Field(
        default=60, ge=0, le=43200, description="an unacknowledged spot warning comes back after this"
    )
    gcp_launch: bool = Field(
        default=False, description="launch jobs on Compute Engine in gcp_project, in the zones of gcp_regions"
    )
    gcp_image: str = Field(
        default="", description="boot image with Docker and NVIDIA drivers (URL or family path), for any region"
    )
    gcp_images: dict[str, str] = Field(default_factory=dict, description="boot image per region (else gcp_image)")
    gcp_service_account: str = Field(
        default="", description="service account email the VMs run as (scope cloud-platform; its roles decide)"
    )
    gcp_extra_labels: dict[str, str] = Field(
        default_factory=dict, description="labels added to every VM (GCP label syntax: [a-z][a-z0-9_-])"
    )
    gcp_disk_gb: int = Field(default=200, description="boot disk size of the VMs")
    gcp_disk_type: str = Field(default="pd-balanced", description="boot disk type (pd-balanced, pd-ssd, pd-standard)")
    gcp_network: str = Field(default="global/networks/default", description="VPC network of the VMs")
    gcp_termination_action: Literal["STOP", "DELETE"] = Field(
        default="STOP", description="what Google does to a preempted Spot VM (STOP keeps the evidence)"
    )
    gcp_anonymous_credentials: bool = Field(
        default=False, description="tests only: no Google credentials, honoured only with gcp_endpoint set"
    )
    azure_launch: bool = Field(
        default=False, description="launch jobs on Azure VMs in azure_subscription_id / azure_resource_group"
    )
    azure_resource_group: str = Field(default="", description="resource group the VMs are created in")
    azure_location: str = Field(default="", description="the one location VMs are created in (e.g. eastus)")
    azure_subnet_id: str = Field(default="", description="ARM id of the subnet the VMs' NICs join")
    azure_image_reference: dict[str, str] = Field(
        default_factory=dict,
        description='e.g. {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", '
        '"version": "latest"} or {"id": "/subscriptions/.../images/..."}',
    )
    azure_image_references: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="image per location (else azure_image_reference)"
    )
    azure_managed_identity_id: str = Field(
        default="", description="resource id of the user-assigned managed identity the VMs run as"
    )
    azure_extra_tags: dict[str, str] = Field(
        default_factory=dict, description="tags added to every VM (the broker's overspill:* tags win)"
    )
    azure_os_disk_gb: int = Field(default=200, description="OS disk size of the VMs")
    azure_os_disk_type: str = Field(
        default="StandardSSD_LRS", description="OS managed disk type (StandardSSD_LRS, Premium_LRS, Standard_LRS)"
    )
    azure_admin_username: str = Field(default="overspill", description="the VMs' admin user (SSH key only)")
    azure_ssh_public_key: str = Field(default="", description="the admin user's SSH public key")
    azure_eviction_policy: Literal["Delete", "Deallocate"] = Field(
        default="Delete", description="what Azure does to an evicted Spot VM"
    )
    azure_endpoint: str | None = Field(default=None, description="ARM endpoint override for tests")
    azure_static_test_token: bool = Field(
        default=False, description="tests only: a fixed bearer token, honoured only with azure_endpoint set"
    )
    slurm_partitions: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description='on-prem Slurm, e.g. {"gpu": {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.10", '
        '"gpus_per_node": "8"}}',
    )
    burst_policy: Literal["economic", "wait_threshold"] = Field(
        default="economic",
        description="economic: burst when the wait costs more than the cloud premium or a deadline is at risk "
        "(federation.burst, what `overspill simulate` scores); wait_threshold: when the wait exceeds "
        "burst_after_wait_hours",
    )
    burst_value_usd_per_gpu_hour: float = Field(
        default=2.0, ge=0, description="economic bursting: what one GPU-hour of a job's waiting costs the site"
    )
    burst_min_wait_hours: float = Field(default=0.05, ge=0, description="never burst a job starting sooner")
    burst_deadline_margin_hours: float = Field(
        default=0.5, ge=0, description="economic bursting: a deadline this close to the on-prem finish is at risk"
    )
    burst_after_wait_hours: float = Field(
        default=1.0, description="wait_threshold bursting: burst an opted-in Slurm job waiting longer"
    )
    burst_give_up_minutes: float = Field(default=30.0, description="release it on-prem if no cloud pool takes it")
    return_onprem: bool = Field(default=True, description="move cloud jobs back on-prem when its queue drains")
    return_min_saving_usd: float = Field(default=5.0, ge=0, description="move back only when it saves this much")
    return_max_wait_hours: float = Field(default=0.05, ge=0, description="...and on-prem starts it within this")
    return_checks_per_tick: int = Field(
        default=2000,
        ge=1,
        description="cloud jobs the return check puts to the placement policy per tick, longest unasked first (the "
        "rest wait for the next tick): a fresh process with tens of thousands of running jobs spreads its first "
        "look over several ticks instead of one long tick",
    )
    move_running_jobs: bool = Field(
        default=True,
        description="ask the deadline policy about running cloud jobs with a deadline too, and move one (back to "
        "spot from on-demand, to a cheaper spot pool, or off to wait) at its next checkpoint when the policy says so",
    )
    move_check_seconds: float = Field(
        default=60.0, ge=0, description="ask again about a running deadline job the policy kept at most this often"
    )
    move_checks_per_tick: int = Field(
        default=2000, ge=1, description="running deadline jobs asked about per tick, longest unasked first"
    )
    slurm_conf: str = Field(default="", description="SLURM_CONF for the Slurm tools (default: Slurm's own)")
    slurm_transport: Literal["cli", "rest"] = Field(
        default="cli",
        description="how the broker talks to Slurm: cli (squeue, scontrol, sacct... as the operator account) or "
        "rest (slurmrestd v0.0.38 with a JWT; release, requeue, submission and the batch-script read stay on the "
        "tools, which v0.0.38 cannot do)",
    )
    slurmrestd_url: str = Field(default="", description="rest transport: slurmrestd's base URL, e.g. http://ctl:6820")
    slurmrestd_user: str = Field(
        default="", description="rest transport: the Slurm operator the JWT was issued for (X-SLURM-USER-NAME)"
    )
    slurm_jwt_file: str = Field(
        default="",
        description="rest transport: a file holding the operator's JWT (`scontrol token username=U lifespan=S`), "
        "re-read when it changes and when slurmctld refuses the token",
    )
    slurm_jwt: str = Field(default="", repr=False, description="rest transport: the JWT itself, when no file is set")
    slurmrestd_timeout_seconds: float = Field(
        default=30.0, gt=0, description="rest transport: seconds to connect to slurmrestd and for it to answer"
    )
    slurm_accounts: dict[str, SlurmAccountPolicy] = Field(
        default_factory=dict,
        description='who may burst out of Slurm, per Slurm account ("*": every other account; none: nobody), e.g. '
        '{"acme": {"tenant": "acme", "team": "nlp", "project": "atlas", "burst": true, "max_job_usd": "200", '
        '"monthly_budget_usd": "5000", "allowed_images": ["registry.site/acme/*"], "users": ["alice"]}}',
    )
    slurm_default_images: dict[str, str] = Field(
        default_factory=dict,
        description='the image a burst runs when its comment names none, per partition, e.g. {"gpu": "reg/run:1"}',
    )
    slurm_container_runtime: Literal["none", "podman", "apptainer", "pyxis"] = Field(
        default="none",
        description="how jobs the broker places on Slurm run their image: podman, apptainer, pyxis (srun "
        "--container-image), or none (the command on the node itself, image ignored)",
    )
    slurm_container_launcher: list[str] = Field(
        default_factory=list,
        description='the runtime\'s command with any global options, e.g. ["podman", "--root", "/scratch/podman"] '
        "(default: podman, apptainer or srun)",
    )
    slurm_container_args: list[str] = Field(
        default_factory=list,
        description='extra run options, e.g. the GPU hook ["--device", "nvidia.com/gpu=all"] for podman with CDI',
    )
    slurm_job_output: str = Field(
        default="/dev/null",
        description="--output of jobs the broker places on Slurm (Slurm patterns allowed), e.g. "
        "/shared/overspill/%u/%j.out: a path their submit identity can write",
    )
    slurm_job_workdir: str = Field(default="", description="--chdir of jobs the broker places on Slurm")
    slurm_cloud_paths: dict[str, str] = Field(
        default_factory=dict,
        description="where the site's shared directories are mounted in the cloud image, on-prem prefix -> cloud path; "
        'a burst job whose working directory is under none is refused, e.g. {"/home": "/home", "/scratch": "/mnt/s"}',
    )
    slurm_require_environment: bool = Field(
        default=True,
        description="refuse a burst whose submission environment accounting does not hold (sacct --env-vars needs "
        "AccountingStoreFlags=job_env); false: run it with only the SLURM_* variables",
    )
    slurm_output_writer: list[str] = Field(
        default_factory=lambda: ["sudo", "-n", "-u", "{user}", "--", "/usr/bin/tee", "--"],
        description="what writes a burst job's log to its --output/--error path as the job's Slurm user (the path "
        "follows; the log arrives on stdin): a sudoers rule limited to tee",
    )
    slurm_submit_as: dict[str, str] = Field(
        default_factory=dict,
        description="the unprivileged unix user each tenant's on-prem Slurm jobs are submitted as; a tenant "
        'without one is never placed on Slurm, e.g. {"acme": "svc-acme"}',
    )
    slurm_submit_wrapper: list[str] = Field(
        default_factory=lambda: ["sudo", "-n", "-u", "{user}", "--"],
        description="what runs sbatch as that user (a sudoers rule limited to sbatch)",
    )
    libcloud_provider: str = Field(default="", description="e.g. openstack: add a private cloud through libcloud")
    libcloud_key: str = Field(default="", description="libcloud driver's key (user name, access key id...)")
    libcloud_secret: str = Field(default="", repr=False, description="libcloud driver's secret (password, API secret)")
    libcloud_image_id: str = Field(default="", description="image (id) the libcloud nodes boot")
    libcloud_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description='driver keyword arguments, JSON-typed, e.g. {"ex_force_auth_url": "https://keystone:5000", '
        '"ex_force_auth_version": "3.x_password", "ex_tenant_name": "ml"} or {"host": "ec2.local", "port": 8443}',
    )
    libcloud_prices: dict[str, Decimal] = Field(
        default_factory=dict,
        description='USD per hour of each size (flavor) id to offer, e.g. {"gpu.a100x8": "14.20"}: a size without a '
        "price is never offered",
    )
    libcloud_gpus: dict[str, str] = Field(
        default_factory=dict,
        description='GPUs of a size as accelerator[:count], e.g. {"gpu.a100x8": "A100:8"} (default: read from the '
        "flavor's extra specs)",
    )
    libcloud_region: str = Field(default="", description="the region the libcloud cloud's offerings are in")
    libcloud_zones: list[str] = Field(
        default_factory=list, description="availability zones to offer (and launch in); none: the driver's default"
    )

    disk_usd_per_gb_month: dict[str, Decimal] = Field(
        default_factory=dict,
        description='boot disk list prices over the built-in table (pricing/extras.py), e.g. {"aws/gp3": "0.08"}',
    )
    public_ipv4_usd_per_hour: dict[str, Decimal] = Field(
        default_factory=dict,
        description="public IPv4 list prices over the built-in ones, by provider or provider/capacity, e.g. "
        '{"aws": "0.005", "gcp/spot": "0.0025"}',
    )

    cloud_retry_attempts: int = Field(default=3, ge=1, le=10, description="calls per cloud API request (transient)")
    cloud_timeout_seconds: float = Field(default=20.0, gt=0, description="connect and read timeout of cloud calls")

    checkpoint_interval_hours: float = Field(
        default=0.5, description="assumed checkpoint cadence of workloads in the preemption cost model"
    )
    checkpoint_stores: dict[str, str] = Field(
        default_factory=dict,
        description="the checkpoint store prefix per location, e.g. "
        '{"aws/us-east-1": "s3://ckpt-use1/overspill/", "gcp/us-central1": "gs://ckpt-usc1/overspill/"}; '
        "tenant T owns <prefix>tenants/T/ in each (broker/agent_side/checkpoint_layout.py). Stores may not nest; "
        "a file:// store may not be / nor be, contain or lie inside the data dir, the database's or reports' "
        "directory, the Python installation or the project (the broker stops at start, naming the entry)",
    )
    tenant_checkpoint_prefixes: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="further checkpoint prefixes the operator assigns to a tenant, each with the location it is at, "
        'e.g. {"acme": {"s3://acme-ml/ckpt/": "aws/us-east-1"}}; a job\'s checkpoint_uri must lie under one of its '
        "tenant's prefixes",
    )
    checkpoint_stage_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="how long one attempt at pre-staging a checkpoint may copy before it stops (the copy resumes on "
        "the next tick)",
    )
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint override for checkpoint stores")
    gcs_endpoint: str | None = Field(default=None, description="GCS endpoint override (e.g. an emulator)")
    azure_storage_connection_string: str = Field(default="", description="for az:// checkpoint stores")
    onprem_egress_usd_per_gb: Decimal = Field(
        default=Decimal("0"), ge=0, description="what sending a GiB out of the on-prem site costs you"
    )
    checkpoint_stage_lease_seconds: float = Field(
        default=1800.0, gt=0, description="how long one replica may hold a checkpoint copy before another takes over"
    )
    restart_hours: float = Field(default=0.1, description="restart time after a preemption (cost model)")
    deadline_policy: str = Field(
        default="overspill",
        description="the policy that places jobs with a deadline: overspill (the default), or an experimental one "
        "(uniform_progress, greedy_safety_net, model_dp, chain_dp, forecast; the simulate_bench "
        "benchmark page compares them)",
    )
    wait_value_usd_per_gpu_hour: float = Field(
        default=0.5, description="what an hour of queueing costs you per GPU (ranking only, never charged)"
    )
    max_placements_per_tick: int = Field(
        default=500,
        ge=1,
        description="how many pending jobs one placement round looks at, shared among the tenants with jobs waiting "
        "in weighted fair share (tenant_weights)",
    )
    tenant_weights: dict[str, float] = Field(
        default_factory=dict,
        description='each tenant\'s weight in the placement round\'s fair share, e.g. {"acme": 2, "beta": 1}: a '
        "tenant's turns are its weight over the weights of the tenants with jobs waiting, counted against the jobs "
        "it already runs (as Kueue's fair sharing and Slurm's fairshare do); a job's priority orders it only within "
        "its tenant. Tenants not named weigh default_tenant_weight",
    )
    default_tenant_weight: float = Field(
        default=1.0, gt=0, description="the fair-share weight of a tenant not named in tenant_weights"
    )
    placement_scan_per_tenant: int = Field(
        default=2000,
        ge=1,
        description="how many of one tenant's pending jobs (highest priority, then oldest) a placement round reads "
        "to choose from; jobs whose wait cannot have changed since the last look are skipped without being judged",
    )
    max_pending_jobs_per_tenant: int = Field(
        default=10_000,
        ge=1,
        description="how many pending jobs one tenant may have; a submission beyond it is refused with 429",
    )
    orphan_grace_seconds: float = Field(default=600.0, description="an untracked instance younger than this is spared")
    orphan_sweep_seconds: float = Field(default=300.0, description="how often tagged instances are checked for owners")

    smtp_host: str = Field(default="", description="SMTP server for budget alerts and emailed reports")
    smtp_port: int = Field(default=25, description="SMTP port for report and budget emails")
    smtp_username: str = Field(default="", description="SMTP login user (empty: no login)")
    smtp_password: str = Field(default="", description="SMTP login password")
    smtp_from: str = Field(default="overspill@localhost", description="sender address of report and budget emails")
    smtp_starttls: bool = Field(default=False, description="upgrade the SMTP connection with STARTTLS")
    reports_dir: Path | None = Field(
        default=None, description="root of 'directory' report deliveries (data_dir/reports)"
    )
    reports_s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint override for report delivery")
    report_destinations: dict[str, list[str]] = Field(
        default_factory=dict,
        description='S3 report destinations each tenant may use, e.g. {"acme": ["s3://finance-reports/acme/"]}: a '
        "destination must lie under one of its tenant's prefixes (none configured: no S3 destination)",
    )
    webhook_allowed_networks: list[str] = Field(
        default_factory=list,
        description='private networks webhooks may reach, as CIDRs (e.g. ["10.20.0.0/16"]); by default budget and '
        "report webhooks go to public addresses only",
    )
    delivery_deadline_seconds: float = Field(
        default=30.0, gt=0, le=600, description="total time one webhook, email or S3 delivery may take, DNS included"
    )
    delivery_workers: int = Field(default=4, ge=1, le=32, description="deliveries a tick runs at once")
    delivery_step_seconds: float = Field(
        default=20.0, gt=0, description="a tick starts no new delivery after this (the rest wait for the next tick)"
    )
    serverless: bool = Field(
        default=False,
        description="set by broker.serverless on AWS Lambda (no durable local disk: no directory reports)",
    )
    bill_max_decompressed_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="an uploaded or imported bill larger than this once decompressed (CSV bytes, decoded "
        "Parquet values) gets 413 naming the limit",
    )
    bill_max_rows: int = Field(default=2_000_000, ge=1, description="rows a bill may have")
    bill_max_columns: int = Field(default=400, ge=3, description="columns a bill may have")
    bill_max_expansion_ratio: float = Field(
        default=100.0,
        ge=2,
        description="how much a bill may grow beyond its first MiB: a .csv.gz's decompressed / compressed bytes, a "
        "Parquet file's decoded values / the pages' stated size (real exports: 5-30x; bombs: 1000x)",
    )
    finance_invoice_issuer: str = Field(default="", description="FOCUS InvoiceIssuerName of on-prem rows (tenant)")

    max_request_bytes: int = Field(default=1_000_000, description="request bodies larger than this get 413")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="json lines, text, or auto: text when stderr is a terminal, else json"
    )
    log_level: Literal["debug", "info", "warning", "error", "DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="info", description="lowest level of log records written to stderr"
    )
    tick_metrics_port: int = Field(
        default=0, description="`overspill tick --loop` serves its loop metrics on this port (0: off)"
    )
    metrics_token: str = Field(
        default="",
        repr=False,
        description="when set, GET /metrics needs 'Authorization: Bearer <token>'; in development it may be empty "
        "(/metrics open, for a scraper on a private network); with OVERSPILL_ENV=production the broker refuses to "
        "start without one of at least 32 characters (/metrics spans every tenant: names, job counts, spend rate)",
    )
    rate_limit_per_second: float = Field(default=20.0, ge=0, description="per API key; 0 turns it off")
    rate_limit_burst: int = Field(default=60, ge=1, description="requests a key may send at once")
    rate_limit_tenant_per_second: float = Field(
        default=50.0,
        ge=0,
        description="per tenant, over all its keys together (each key also has its own rate_limit_per_second): "
        "minting more keys does not multiply a tenant's share; 0 turns it off",
    )
    rate_limit_tenant_burst: int = Field(default=150, ge=1, description="requests a tenant's keys may send at once")
    max_keys_per_tenant: int = Field(
        default=100,
        ge=1,
        description="active (unrevoked) API keys a tenant may hold; POST /v1/keys beyond answers 409 (revoke one "
        "first)",
    )
    rate_limit_unverified_per_second: float = Field(
        default=2.0,
        gt=0,
        description="per client address, for requests whose API key this process has not verified yet (each costs "
        "a slow scrypt hash): guessing keys from one address is held to this rate",
    )
    rate_limit_unverified_burst: int = Field(
        default=10, ge=1, description="unverified keys one address may send at once"
    )
    log_follow_max_per_tenant: int = Field(
        default=100,
        ge=1,
        description="logs one tenant may follow at once (`GET /v1/jobs/{id}/logs?follow=true`, `overspill logs -f`) "
        "per API process; beyond, 429 with Retry-After",
    )
    log_follow_max_per_process: int = Field(
        default=1000,
        ge=1,
        description="logs followed at once across all tenants per API process (each holds a connection and polls "
        "the store); beyond, 429 with Retry-After",
    )
    log_follow_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="threads per API process that read followed logs (their own pool: followers never take the "
        "threads other requests run on, however many there are)",
    )
    key_hash_concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="slow key hashes run at once per API process, on their own threads (32 more per slot may wait; "
        "beyond, 429): unverified keys cannot take the threads legitimate requests run on",
    )
    forwarded_allow_ips: str = Field(
        default="",
        description="`overspill serve`: comma-separated proxy addresses (or '*') whose X-Forwarded-For / "
        "X-Forwarded-Proto uvicorn trusts for the client address; empty (default): none, the socket peer is the "
        "client (uvicorn's own default would trust 127.0.0.1)",
    )
    rate_limit_store: Literal["auto", "shared", "local"] = Field(
        default="auto",
        description="where the buckets live: 'shared' in the database (one limit per key across every process on "
        "it), 'local' in each process (N processes admit N x the rate); 'auto': shared on PostgreSQL and under "
        "`uvicorn --factory broker.app:app_from_env` (several workers on one SQLite file), local otherwise",
    )
    # -- the instance agent (broker/agent_side/publish.py, broker/agent_side/attempt_spec.py) ------------------------
    agent_runtime: dict[str, Literal["docker", "podman", "process"]] = Field(
        default_factory=dict,
        description='how the agent runs workloads, per provider, e.g. {"aws": "docker", "libcloud": "podman"}; '
        "default docker ('process' runs the command on the host itself, unisolated: only when configured)",
    )
    agent_url_expiry_seconds: int = Field(
        default=12 * 3600,
        ge=300,
        le=7 * 24 * 3600,
        description="how long the agent wheel's URL in a start-up script stays readable (S3 presigned GET, GCS V4 "
        "signed URL, Azure SAS)",
    )
    agent_root: str = Field(
        default="/var/lib/overspill-agent",
        pattern=r"^/[A-Za-z0-9._/-]*$",
        description="directory on the instance for the agent's wheel, work dir (checkpoints) and log",
    )
    agent_heartbeat_seconds: int = Field(default=600, ge=10, le=86400, description="agent heartbeat report period")
    gcs_signing_key_file: Path | None = Field(
        default=None,
        description="service-account key JSON that signs GCS URLs for the agent wheel (default: the GCS client's "
        "credentials, or the IAM signBlob API for the service account they belong to)",
    )
    tenant_secret_prefixes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="the secret references each tenant's jobs may use, as prefixes, e.g. "
        '{"acme": ["arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/acme/", '
        '"projects/p/secrets/acme-", "https://acme-kv.vault.azure.net/secrets/"]}; none: no secrets',
    )
    public_url: str = Field(
        default="",
        description="where instances reach the broker: each attempt's spec names <url>/v1/placements/<id>/reports "
        "for the agent's signed reports (an accelerator: the mailbox in the store is the source of truth), and Azure "
        "evictions",
    )
    callback_secret: str = Field(
        default="", repr=False, description="signs per-placement callback tokens (default: derived)"
    )
    # any secret above may instead come from AWS Secrets Manager: OVERSPILL_<NAME>_ARN (see broker/config/secrets.py)
    bootstrap_api_key_arn: str = Field(default="", description="read bootstrap_api_key from this secret (ARN#field)")
    callback_secret_arn: str = Field(default="", description="read callback_secret from this secret (ARN#field)")
    database_url_arn: str = Field(default="", description="read database_url from this secret (ARN#field)")
    libcloud_secret_arn: str = Field(default="", description="read libcloud_secret from this secret (ARN#field)")
    metrics_token_arn: str = Field(default="", description="read metrics_token from this secret (ARN#field)")
    secrets_endpoint_url: str | None = Field(default=None, description="Secrets Manager endpoint override (tests)")

    @field_validator("bootstrap_tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        from broker.config.tenants import validate_tenant

        return validate_tenant(value)

    @field_validator("tenant_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        import math

        for tenant, weight in value.items():
            if not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"tenant_weights[{tenant!r}] = {weight}: a weight must be a positive finite number")
        return value

    @field_validator("slurm_cloud_paths")
    @classmethod
    def _cloud_paths(cls, value: dict[str, str]) -> dict[str, str]:
        import posixpath

        for onprem, cloud in value.items():
            for what, path in (("key", onprem), ("value", cloud)):
                if not path.startswith("/") or posixpath.normpath(path) != path or any(ord(c) < 32 for c in path):
                    raise ValueError(f"slurm_cloud_paths {what} {path!r}: must be an absolute, normal path")
        return value

    @field_validator("deadline_policy")
    @classmethod
    def _deadline_policy(cls, value: str) -> str:
        from federation.policies import build_deadline_policy

        build_deadline_policy(value, 0.1)  # ValueError naming the policies there are
        return value

    @field_validator("slurm_output_writer")
    @classmethod
    def _output_writer(cls, value: list[str]) -> list[str]:
        if "{user}" not in value:
            raise ValueError("slurm_output_writer must contain '{user}' (e.g. sudo -n -u {user} -- /usr/bin/tee --)")
        return value

    @model_validator(mode="after")
    def _finance_targets(self) -> Settings:
        from broker.finance.outbound import parse_networks
        from broker.finance.reports.paths import parse_s3_prefix

        parse_networks(self.webhook_allowed_networks)  # ValueError naming the bad CIDR
        for tenant, prefixes in self.report_destinations.items():
            for prefix in prefixes:
                parse_s3_prefix(prefix, f"report_destinations[{tenant!r}]")
        return self

    @property
    def webhook_networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """`webhook_allowed_networks` parsed."""
        from broker.finance.outbound import parse_networks

        return parse_networks(self.webhook_allowed_networks)

    @model_validator(mode="after")
    def _secrets(self) -> Settings:
        from broker.config.secrets import resolve_secrets, unsafe_in_production

        found = resolve_secrets(
            self.__dict__, endpoint_url=self.secrets_endpoint_url or self.aws_endpoint_url
        )  # before the checks, so a secret from Secrets Manager counts
        for name, value in found.items():
            object.__setattr__(self, name, value)
        if self.env == "production":
            problems = unsafe_in_production(self.__dict__, dev_api_key=DEV_API_KEY)
            if problems:
                raise ValueError("refusing to start in production: " + "; ".join(problems))
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'overspill.db').as_posix()}"

    @property
    def resolved_reports_dir(self) -> Path:
        return self.reports_dir or self.data_dir / "reports"

    def callback_key(self) -> bytes:
        """The key that signs instances' exit-status callbacks (derived from the bootstrap key if not set)."""
        import hashlib

        return hashlib.sha256(
            ("overspill-callback:" + (self.callback_secret or self.bootstrap_api_key)).encode()
        ).digest()
