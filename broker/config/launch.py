"""The per-provider launch settings, checked and shaped at start-up: identity, network, images, tags and disks, and
what an instance bills beside compute (boot disk, public IPv4).

Role: `broker.config.providers` builds the adapters from what these functions return; `instance_extras` gives the
broker (ledger, ceiling guard, placement) each launching provider's extra charges. Every function raises
`ValueError` whose message names the `OVERSPILL_` variable to fix, so a bad setting stops the broker at start
instead of failing launches one by one.

- AWS: `aws_options` (`AwsLaunchOptions`: instance profile ARN or name, security groups as one list or per
  region, IMDSv2, extra tags, root volume size and type) and `aws_images` (an image for every region of
  `OVERSPILL_AWS_REGIONS`: `OVERSPILL_AWS_IMAGE_IDS[region]` or the `OVERSPILL_AWS_IMAGE_ID` fallback, each an AMI id
  or `resolve:ssm:/parameter`).
- GCP: `gcp_images` (an image for every region of `OVERSPILL_GCP_REGIONS`), `gcp_checked` (service account email,
  extra labels in GCP's label syntax, disk size and type).
- Azure: `azure_image` (the image for `OVERSPILL_AZURE_LOCATION`), `azure_checked` (managed identity resource id,
  extra tags in Azure's tag syntax, OS disk size and type).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING

from broker.config.settings import Settings
from pricing.extras import DISK_USD_PER_GB_MONTH, PUBLIC_IPV4_USD_PER_HOUR, InstanceExtras

if TYPE_CHECKING:  # the AWS SDK is imported only when AWS launching is enabled
    from providers.aws import AwsLaunchOptions

AWS_VOLUME_TYPES = ("gp3", "gp2", "io1", "io2", "standard")
GCP_DISK_TYPES = ("pd-balanced", "pd-ssd", "pd-standard", "pd-extreme", "hyperdisk-balanced")
AZURE_DISK_TYPES = ("StandardSSD_LRS", "Premium_LRS", "Standard_LRS", "StandardSSD_ZRS", "Premium_ZRS")
PROVIDERS_WITH_EXTRAS = ("aws", "gcp", "azure")
CAPACITY_TYPES = ("spot", "on_demand", "reserved")

_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")
_SSM_NAME = re.compile(r"^/?[a-zA-Z0-9_.\-/]{1,2048}$")
_SECURITY_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}$")
_PROFILE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:instance-profile/[\w+=,.@/-]{1,128}$")
_PROFILE_NAME = re.compile(r"^[\w+=,.@-]{1,128}$")
_EMAIL = re.compile(r"^[a-z0-9][a-z0-9.\-_+]*@[a-z0-9][a-z0-9.\-]*\.[a-z]{2,}$")
_GCP_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_GCP_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_AZURE_TAG_FORBIDDEN = re.compile(r"[<>%&\\?/]")
_AZURE_IDENTITY = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/[^/]+$",
    re.IGNORECASE,
)
_RESERVED_TAG_PREFIX = "overspill:"
_RESERVED_LABEL_PREFIX = "overspill-"
_BROKER_TAGS = 5  # the broker's own tags on an instance: broker, job, placement, launch token, offering


# -- AWS ----------------------------------------------------------------------------------------------------------


def aws_images(settings: Settings) -> dict[str, str]:
    """The image (AMI id or `resolve:ssm:` reference) of every region the broker launches in on AWS."""
    regions = settings.aws_regions
    stray = sorted(set(settings.aws_image_ids) - set(regions))
    if stray:
        raise ValueError(
            f"OVERSPILL_AWS_IMAGE_IDS names {', '.join(stray)}, not in OVERSPILL_AWS_REGIONS ({', '.join(regions)})"
        )
    out: dict[str, str] = {}
    for region in regions:
        value = settings.aws_image_ids.get(region) or settings.aws_image_id
        variable = (
            f"OVERSPILL_AWS_IMAGE_IDS[{region!r}]" if region in settings.aws_image_ids else "OVERSPILL_AWS_IMAGE_ID"
        )
        if not value:
            raise ValueError(
                f"OVERSPILL_AWS_LAUNCH needs an image for {region}: set OVERSPILL_AWS_IMAGE_IDS (per region) or "
                "OVERSPILL_AWS_IMAGE_ID"
            )
        _check_image(value, variable)
        out[region] = value
    return out


def _check_image(value: str, variable: str) -> None:
    from providers.aws import SSM_PREFIX

    if value.startswith(SSM_PREFIX):
        if not _SSM_NAME.match(value.removeprefix(SSM_PREFIX)):
            raise ValueError(f"{variable}: {value!r} is not a valid SSM parameter name")
        return
    if not _AMI.match(value):
        raise ValueError(f"{variable}: {value!r} is neither an AMI id (ami-...) nor resolve:ssm:/parameter")


def aws_options(settings: Settings) -> AwsLaunchOptions:
    """Identity, security groups, IMDS, tags and root volume of every EC2 launch."""
    from providers.aws import AwsLaunchOptions

    profile = settings.aws_instance_profile
    if profile and not (_PROFILE_ARN.match(profile) or _PROFILE_NAME.match(profile)):
        raise ValueError(f"OVERSPILL_AWS_INSTANCE_PROFILE: {profile!r} is neither an instance profile ARN nor a name")
    groups = _security_groups(settings)
    _check_tags(
        settings.aws_extra_tags,
        "OVERSPILL_AWS_EXTRA_TAGS",
        key_max=128,
        value_max=256,
        total_max=50,
        bad_key=lambda k: k.lower().startswith("aws:"),
        bad_key_reason="keys starting with aws: are AWS's",
    )
    if not 8 <= settings.aws_root_volume_gb <= 16384:
        raise ValueError(f"OVERSPILL_AWS_ROOT_VOLUME_GB: {settings.aws_root_volume_gb} is not within 8-16384")
    _check_choice(settings.aws_root_volume_type, AWS_VOLUME_TYPES, "OVERSPILL_AWS_ROOT_VOLUME_TYPE")
    return AwsLaunchOptions(
        instance_profile=profile,
        security_group_ids=groups,
        imds_v2_required=settings.aws_imds_v2_required,
        extra_tags=dict(settings.aws_extra_tags),
        root_volume_gb=settings.aws_root_volume_gb,
        root_volume_type=settings.aws_root_volume_type,
    )


def _security_groups(settings: Settings) -> dict[str, tuple[str, ...]]:
    raw = settings.aws_security_group_ids
    by_region: Mapping[str, list[str]] = {"*": raw} if isinstance(raw, list) else raw
    out: dict[str, tuple[str, ...]] = {}
    for region, ids in by_region.items():
        if region != "*" and region not in settings.aws_regions:
            raise ValueError(f"OVERSPILL_AWS_SECURITY_GROUP_IDS names {region}, not in OVERSPILL_AWS_REGIONS")
        for sg in ids:
            if not _SECURITY_GROUP.match(sg):
                raise ValueError(f"OVERSPILL_AWS_SECURITY_GROUP_IDS: {sg!r} is not a security group id (sg-...)")
        if len(ids) > 5:
            raise ValueError(f"OVERSPILL_AWS_SECURITY_GROUP_IDS: at most 5 groups per instance, {len(ids)} given")
        if ids:
            out[region] = tuple(ids)
    return out


# -- GCP ----------------------------------------------------------------------------------------------------------


def gcp_images(settings: Settings) -> dict[str, str]:
    """The boot image of every region the broker launches in on Compute Engine."""
    stray = sorted(set(settings.gcp_images) - set(settings.gcp_regions))
    if stray:
        raise ValueError(f"OVERSPILL_GCP_IMAGES names {', '.join(stray)}, not in OVERSPILL_GCP_REGIONS")
    out: dict[str, str] = {}
    for region in settings.gcp_regions:
        image = settings.gcp_images.get(region) or settings.gcp_image
        if not image:
            raise ValueError(
                f"OVERSPILL_GCP_LAUNCH needs an image for {region}: set OVERSPILL_GCP_IMAGES (per region) or "
                "OVERSPILL_GCP_IMAGE"
            )
        out[region] = image
    return out


def gcp_checked(settings: Settings) -> None:
    """Service account, extra labels and disk of the VMs, as Compute Engine will accept them."""
    account = settings.gcp_service_account
    if account and not _EMAIL.match(account):
        raise ValueError(f"OVERSPILL_GCP_SERVICE_ACCOUNT: {account!r} is not a service account email")
    labels = settings.gcp_extra_labels
    for key, value in labels.items():
        if not _GCP_LABEL_KEY.match(key) or key.startswith(_RESERVED_LABEL_PREFIX):
            raise ValueError(
                f"OVERSPILL_GCP_EXTRA_LABELS: key {key!r} must be [a-z][a-z0-9_-]{{0,62}} and not start with "
                f"{_RESERVED_LABEL_PREFIX}"
            )
        if not _GCP_LABEL_VALUE.match(value):
            raise ValueError(f"OVERSPILL_GCP_EXTRA_LABELS[{key!r}]: {value!r} must be [a-z0-9_-]{{0,63}}")
    if len(labels) > 64 - 4:
        raise ValueError(f"OVERSPILL_GCP_EXTRA_LABELS: {len(labels)} labels, at most 60 beside the broker's")
    if not 10 <= settings.gcp_disk_gb <= 65536:
        raise ValueError(f"OVERSPILL_GCP_DISK_GB: {settings.gcp_disk_gb} is not within 10-65536")
    _check_choice(settings.gcp_disk_type, GCP_DISK_TYPES, "OVERSPILL_GCP_DISK_TYPE")


# -- Azure --------------------------------------------------------------------------------------------------------


def azure_image(settings: Settings) -> dict[str, str]:
    """The image reference for `OVERSPILL_AZURE_LOCATION`: its entry in `OVERSPILL_AZURE_IMAGE_REFERENCES`, else
    `OVERSPILL_AZURE_IMAGE_REFERENCE`."""
    by_location = {k.lower(): v for k, v in settings.azure_image_references.items()}
    location = settings.azure_location.lower()
    stray = sorted(k for k in by_location if k != location)
    if stray:
        raise ValueError(
            f"OVERSPILL_AZURE_IMAGE_REFERENCES names {', '.join(stray)}: the provider launches only in "
            f"OVERSPILL_AZURE_LOCATION={settings.azure_location}"
        )
    image = by_location.get(location)
    variable = f"OVERSPILL_AZURE_IMAGE_REFERENCES[{settings.azure_location!r}]"
    if image is None:
        image, variable = settings.azure_image_reference, "OVERSPILL_AZURE_IMAGE_REFERENCE"
    if not image:
        raise ValueError(
            "OVERSPILL_AZURE_LAUNCH needs OVERSPILL_AZURE_IMAGE_REFERENCE (or OVERSPILL_AZURE_IMAGE_REFERENCES for "
            f"{settings.azure_location})"
        )
    marketplace = {"publisher", "offer", "sku"}
    if not (set(image) == {"id"} or marketplace <= set(image) <= marketplace | {"version"}):
        raise ValueError(f"{variable}: give {{'id': ...}} or publisher, offer, sku (and version), not {sorted(image)}")
    return dict(image)


def azure_checked(settings: Settings) -> None:
    """Managed identity, extra tags and OS disk of the VMs, as ARM will accept them."""
    identity = settings.azure_managed_identity_id
    if identity and not _AZURE_IDENTITY.match(identity):
        raise ValueError(
            f"OVERSPILL_AZURE_MANAGED_IDENTITY_ID: {identity!r} is not a user-assigned identity's resource id "
            "(/subscriptions/.../resourceGroups/.../providers/Microsoft.ManagedIdentity/userAssignedIdentities/...)"
        )
    _check_tags(
        settings.azure_extra_tags,
        "OVERSPILL_AZURE_EXTRA_TAGS",
        key_max=512,
        value_max=256,
        total_max=50,
        bad_key=lambda k: bool(_AZURE_TAG_FORBIDDEN.search(k)),
        bad_key_reason="Azure tag names may not hold < > % & \\ ? /",
    )
    if not 1 <= settings.azure_os_disk_gb <= 4095:
        raise ValueError(f"OVERSPILL_AZURE_OS_DISK_GB: {settings.azure_os_disk_gb} is not within 1-4095")
    _check_choice(settings.azure_os_disk_type, AZURE_DISK_TYPES, "OVERSPILL_AZURE_OS_DISK_TYPE")


# -- shared -------------------------------------------------------------------------------------------------------


def _check_choice(value: str, allowed: tuple[str, ...], variable: str) -> None:
    if value not in allowed:
        raise ValueError(f"{variable}: {value!r} is not one of {', '.join(allowed)}")


def _check_tags(
    tags: Mapping[str, str],
    variable: str,
    *,
    key_max: int,
    value_max: int,
    total_max: int,
    bad_key: Callable[[str], bool],
    bad_key_reason: str,
) -> None:
    for key, value in tags.items():
        if not key or len(key) > key_max or key.lower().startswith(_RESERVED_TAG_PREFIX) or bad_key(key):
            raise ValueError(
                f"{variable}: tag {key!r} is refused (1-{key_max} characters, not {_RESERVED_TAG_PREFIX}...; "
                f"{bad_key_reason})"
            )
        if len(value) > value_max:
            raise ValueError(f"{variable}[{key!r}]: a value has at most {value_max} characters")
    if len(tags) > total_max - _BROKER_TAGS:
        raise ValueError(f"{variable}: {len(tags)} tags, at most {total_max - _BROKER_TAGS} beside the broker's own")


def instance_extras(settings: Settings) -> dict[str, InstanceExtras]:
    """What an instance of each launching cloud bills beside compute (boot disk; public IPv4 on AWS when
    `OVERSPILL_AWS_PUBLIC_IPV4`, on GCP always, on Azure never: the adapter attaches none), at list prices with
    `OVERSPILL_DISK_USD_PER_GB_MONTH` and `OVERSPILL_PUBLIC_IPV4_USD_PER_HOUR` over the built-in tables."""
    disk_prices = {
        **DISK_USD_PER_GB_MONTH,
        **_prices(settings.disk_usd_per_gb_month, "OVERSPILL_DISK_USD_PER_GB_MONTH"),
    }
    ipv4_prices = {
        **PUBLIC_IPV4_USD_PER_HOUR,
        **_prices(settings.public_ipv4_usd_per_hour, "OVERSPILL_PUBLIC_IPV4_USD_PER_HOUR"),
    }
    enabled = {
        "aws": (
            settings.aws_launch,
            settings.aws_root_volume_gb,
            settings.aws_root_volume_type,
            settings.aws_public_ipv4,
        ),
        "gcp": (settings.gcp_launch, settings.gcp_disk_gb, settings.gcp_disk_type, True),
        "azure": (settings.azure_launch, settings.azure_os_disk_gb, settings.azure_os_disk_type, False),
    }
    out: dict[str, InstanceExtras] = {}
    for provider, (launch, gb, disk_type, ipv4) in enabled.items():
        if not launch:
            continue
        if f"{provider}/{disk_type}" not in disk_prices:
            raise ValueError(
                f'no list price for {provider} disk type {disk_type}: add "{provider}/{disk_type}" to '
                "OVERSPILL_DISK_USD_PER_GB_MONTH"
            )
        out[provider] = InstanceExtras(provider, gb, disk_type, ipv4, disk_prices, ipv4_prices)
    return out


def _prices(values: Mapping[str, Decimal], variable: str) -> dict[str, Decimal]:
    for key, price in values.items():
        provider = key.split("/", 1)[0]
        if provider not in PROVIDERS_WITH_EXTRAS:
            raise ValueError(f"{variable}: {key!r} names no cloud ({', '.join(PROVIDERS_WITH_EXTRAS)})")
        if price < 0:
            raise ValueError(f"{variable}[{key!r}]: a price cannot be negative")
    return dict(values)
