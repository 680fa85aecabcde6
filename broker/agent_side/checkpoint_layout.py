"""Where each tenant's checkpoints live inside a checkpoint store: the one place the layout is written down.

For every configured store prefix `P` (`OVERSPILL_CHECKPOINT_STORES`), tenant `T` owns `P tenants/T/`:

    P tenants/T/jobs/<job id>/checkpoint/                 a job's checkpoint location when the broker derives it,
                                                          and where pre-staging copies a checkpoint to
    P tenants/T/jobs/<job id>/attempts/<placement id>/    reserved for the instance agent (spec, logs)
    P tenants/T/mailbox/                                  reserved for instance reports
    P _agent/<sha256>/<wheel file name>                   the instance agent's wheel (broker-owned, beside
                                                          `tenants/`, so no tenant's area can hold or name it)

`P` ends in `/`; every name put into a path (tenant, job id, placement id) must be one safe segment
(`providers.storage.keys.safe_segment`: no `/`, `..`, control characters...), or `UnsafeKey` is raised, so no
tenant's name can reach into another tenant's area. `reserved_reason` tells whether a key relative to a tenant's
area is one of the reserved places a user-given checkpoint URI may not point at.
"""

from __future__ import annotations

from providers.storage.keys import safe_segment

TENANTS = "tenants/"
JOBS = "jobs/"
CHECKPOINT = "checkpoint/"
ATTEMPTS = "attempts/"
MAILBOX = "mailbox/"
AGENT = "_agent/"
BROKER_AREAS = (AGENT,)  # what the broker keeps beside `tenants/` in every store


def tenant_area(store_prefix: str, tenant: str) -> str:
    """`P tenants/T/`: everything of tenant `T` in the store at `P`."""
    return f"{store_prefix}{TENANTS}{safe_segment(tenant)}/"


def job_prefix(store_prefix: str, tenant: str, job_id: str) -> str:
    """`P tenants/T/jobs/<job id>/`."""
    return f"{tenant_area(store_prefix, tenant)}{JOBS}{safe_segment(job_id)}/"


def job_checkpoint_prefix(store_prefix: str, tenant: str, job_id: str) -> str:
    """`P tenants/T/jobs/<job id>/checkpoint/`: a job's derived checkpoint location and staging target."""
    return job_prefix(store_prefix, tenant, job_id) + CHECKPOINT


def attempt_prefix(store_prefix: str, tenant: str, job_id: str, placement_id: str) -> str:
    """`P tenants/T/jobs/<job id>/attempts/<placement id>/`: reserved for the instance agent."""
    return f"{job_prefix(store_prefix, tenant, job_id)}{ATTEMPTS}{safe_segment(placement_id)}/"


def mailbox_prefix(store_prefix: str, tenant: str) -> str:
    """`P tenants/T/mailbox/`: reserved for instance reports."""
    return tenant_area(store_prefix, tenant) + MAILBOX


def agent_wheel_key(sha256: str, wheel_name: str) -> str:
    """`_agent/<sha256>/<wheel name>`, relative to a store prefix: where the broker publishes the agent's wheel."""
    return f"{AGENT}{safe_segment(sha256)}/{safe_segment(wheel_name)}"


def reserved_reason(key_in_area: str) -> str | None:
    """Why a key relative to a tenant's area may not be a user's checkpoint location, or None when it may."""
    if key_in_area.startswith(MAILBOX) or key_in_area == MAILBOX[:-1]:
        return "tenants/<tenant>/mailbox/ is reserved for instance reports"
    segments = key_in_area.split("/")
    if len(segments) >= 3 and segments[0] == JOBS[:-1] and segments[2] == ATTEMPTS[:-1]:
        return "tenants/<tenant>/jobs/<job>/attempts/ is reserved for the instance agent"
    return None
