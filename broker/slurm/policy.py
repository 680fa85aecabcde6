"""Governance of bursts out of Slurm: which Slurm accounts may burst, as which tenant, team and project, within
what limits; and the one place that turns a Slurm user's `overspill-burst {...}` comment into a broker job.

Nobody who can only `sbatch` holds an API key, so nothing in a comment may choose who pays or how much:
- `OVERSPILL_SLURM_ACCOUNTS` (`SlurmAccountPolicy` per Slurm account, optional "*" default entry; an account with
  no entry and no "*" never bursts) maps the job's account to tenant, team and project and says whether it may
  burst (`burst`), the largest per-job ceiling (`max_job_usd`), a monthly budget (`monthly_budget_usd`), the
  images it may run (`allowed_images`: exact references, or a prefix ending in `/*`, `:*` or `@*`), and
  optionally which Slurm users (`users`) and QOS (`qos`) of it may burst and which clouds (`allowed_providers`).
  Validated when the settings load: an error names the entry and field.
- The comment may lower the ceiling (`max_total_usd` <= `max_job_usd`; default: `max_job_usd`), pick an allowed
  image (default: the site's image for the job's partition, `OVERSPILL_SLURM_DEFAULT_IMAGES`), narrow the clouds
  and regions, and give `work_gpu_hours`/`runtime_hours`, `deadline`, `max_hourly_usd`, `preemptible` and `name`.
  Anything else (`checkpoint_uri`, which the broker derives; `team`, `project`, `tenant`; GPU type and count, which
  come from the Slurm request; `command`, which is the job's own batch script (`broker.slurm.job`); `priority`)
  refuses the burst with the field named.

`burst_request(...)` returns a `BurstRequest` or a `Refusal` whose `reason` is a bounded code
(`broker.observe.metrics.BurstReason`) and whose `message` says what to change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from broker.api.schemas import JobCreate
from broker.observe.metrics import BurstReason
from broker.slurm.accounts import DEFAULT_ENTRY, SlurmAccountPolicy, image_allowed
from providers.slurm.provider import strip_hold_mark

OPT_IN = "overspill-burst"
COMMENT_FIELDS = frozenset(
    {
        "max_total_usd",
        "max_hourly_usd",
        "image",
        "work_gpu_hours",
        "runtime_hours",
        "deadline",
        "name",
        "allowed_providers",
        "allowed_regions",
        "preemptible",
    }
)


def policy_for(accounts: Mapping[str, SlurmAccountPolicy], account: str) -> SlurmAccountPolicy | None:
    return accounts.get(account) or accounts.get(DEFAULT_ENTRY)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job that asked to burst may not: `reason` is a bounded metric code, `message` says what to change."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class BurstRequest:
    """An allowed burst: the broker job to create and the policy it was judged under."""

    create: JobCreate
    policy: SlurmAccountPolicy
    account: str


@dataclass(frozen=True, slots=True)
class SlurmRequest:
    """What the broker read from Slurm about the job asking to burst."""

    target: str
    name: str
    user: str
    account: str
    qos: str
    partition: str
    accelerator: str
    gpus: int
    time_limit_minutes: int | None
    comment: str


def burst_request(
    job: SlurmRequest,
    accounts: Mapping[str, SlurmAccountPolicy],
    default_images: Mapping[str, str],
    cloud_providers: Sequence[str],
) -> BurstRequest | Refusal:
    """Judge one opted-in job against its account's policy (see the module docstring)."""
    policy = policy_for(accounts, job.account)
    who = f"Slurm user {job.user or '?'} of account {job.account or '?'}"
    if policy is None:
        return Refusal(BurstReason.ACCOUNT_NOT_MAPPED, f"{who}: the account is not in OVERSPILL_SLURM_ACCOUNTS")
    if not policy.burst:
        return Refusal(BurstReason.ACCOUNT_NOT_ALLOWED, f"{who}: the account's policy does not allow bursting")
    if policy.users is not None and job.user not in policy.users:
        return Refusal(BurstReason.USER_NOT_ALLOWED, f"{who}: the user is not among the account's burst users")
    if policy.qos is not None and job.qos not in policy.qos:
        return Refusal(BurstReason.QOS_NOT_ALLOWED, f"{who}: QOS {job.qos or '?'} may not burst")
    fields = _comment_fields(job.comment)
    if isinstance(fields, Refusal):
        return fields
    assert policy.max_job_usd is not None  # validated: burst needs it
    ceiling = _decimal(fields.get("max_total_usd", policy.max_job_usd))
    if ceiling is None:
        return Refusal(BurstReason.UNUSABLE_SPEC, f"{who}: max_total_usd is not a number")
    if ceiling > policy.max_job_usd:
        return Refusal(
            BurstReason.CEILING_ABOVE_POLICY,
            f"{who}: max_total_usd {ceiling} is above the account's max_job_usd {policy.max_job_usd}",
        )
    image = fields.get("image", default_images.get(job.partition))
    if not isinstance(image, str) or not image:
        return Refusal(BurstReason.IMAGE_NOT_ALLOWED, f"{who}: no image given and no default for {job.partition}")
    if image != default_images.get(job.partition) and not image_allowed(image, policy.allowed_images):
        return Refusal(BurstReason.IMAGE_NOT_ALLOWED, f"{who}: image {image} is not in the account's allowed_images")
    clouds = list(cloud_providers) if policy.allowed_providers is None else list(policy.allowed_providers)
    asked = fields.get("allowed_providers")
    if asked is not None:
        if not isinstance(asked, list) or not set(map(str, asked)) <= set(clouds):
            return Refusal(BurstReason.PROVIDER_NOT_ALLOWED, f"{who}: allowed_providers {asked} beyond {clouds}")
        clouds = [str(p) for p in asked]
    if not clouds:
        return Refusal(BurstReason.PROVIDER_NOT_ALLOWED, f"{who}: the account's policy allows no cloud")
    spec: dict[str, Any] = {**fields, "max_total_usd": str(ceiling), "image": image, "allowed_providers": clouds}
    spec.setdefault("name", job.name or f"slurm-{job.target}")
    spec["team"], spec["project"] = policy.team, policy.project
    spec["accelerators"], spec["gpu_count"] = [job.accelerator], job.gpus
    if "work_gpu_hours" not in spec and "runtime_hours" not in spec:
        spec["runtime_hours"] = str(Decimal(job.time_limit_minutes or 60) / 60)
    try:
        create = JobCreate(**spec)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'comment'}: {e['msg']}" for e in exc.errors())
        return Refusal(BurstReason.UNUSABLE_SPEC, f"{who}: {problems}"[:500])
    return BurstRequest(create, policy, job.account)


def _comment_fields(comment: str) -> dict[str, Any] | Refusal:
    comment = strip_hold_mark(comment)
    text = comment.split(OPT_IN, 1)[1].strip() if OPT_IN in comment else ""
    try:
        fields = json.loads(text) if text else {}
    except ValueError as exc:
        return Refusal(BurstReason.UNUSABLE_SPEC, f"the {OPT_IN} comment is not a JSON object: {exc}")
    if not isinstance(fields, dict):
        return Refusal(BurstReason.UNUSABLE_SPEC, f"the {OPT_IN} comment is not a JSON object")
    refused = sorted(set(fields) - COMMENT_FIELDS)
    if refused:
        why = "the broker derives it" if refused == ["checkpoint_uri"] else "it is not the comment's to choose"
        return Refusal(BurstReason.FIELD_NOT_ALLOWED, f"comment field(s) {', '.join(refused)} refused: {why}")
    return fields


def _decimal(value: object) -> Decimal | None:
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        return None
    return number if number.is_finite() and number > 0 else None
