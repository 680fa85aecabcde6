"""Launch step, agent part: write an attempt's spec to the job's checkpoint store and render its start-up script.

Called by `launch_placement` after the checkpoint is staged and before the cloud launch, for placements on providers
whose instances run the agent (`broker.agent_side.attempt_spec.boots_agent`); the simulated clouds and Slurm skip it.

1. The store: the one the instance's job uses, `CheckpointStores.for_launch(provider, region)` (the store at the
   target, else the nearest of that provider). Placement never chooses a pool of an agent provider without one
   (`no_checkpoint_store`); should the configuration change under a recorded placement, its launch fails over.
2. The spec (`broker.agent_side.attempt_spec.build_spec`) goes to `<attempt prefix>spec.json`, the attempt prefix being
   `P tenants/T/jobs/<job>/attempts/<placement>/` (`checkpoint_layout.attempt_prefix`), through the store confined
   beneath that prefix. The agent deletes it once read.
3. The agent's wheel is published to the store (`broker.agent_side.publish`) and the start-up script rendered
   (`providers.startup`) with a URL to it, the spec's URI and the endpoint variables.
4. The attempt prefix (`placement.attempt_uri`) and the script (`placement.user_data`) are recorded on the
   placement, under its row lock, in one commit. A placement that has them is launched with that same script on
   every retry (a retried launch must send the same bytes), and its spec is not written again.

Failures. A store error (writing the spec, publishing the wheel, signing its URL) leaves the placement LAUNCHING
with an `attempt_spec_failed` event, to be tried again next tick, like a staging failure: it is never launched
without its spec. After `MAX_SPEC_FAILURES` such errors its launch fails over (`AttemptStoreUnavailable`, the region
blocklisted a while). A job whose image is not an image reference, or whose secret references its tenant may no
longer use, is not launched at all (`Prepared.REFUSED`: `launch_placement` pauses it with the reason).
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum

from sqlmodel import Session, select

from agent import protocol
from broker.agent_side import checkpoint_layout as layout
from broker.agent_side.attempt_spec import agent_root, agent_systemd, boots_agent, bootstrap_env, build_spec
from broker.loop.common import locked
from broker.runtime import Runtime
from broker.services.jobs import add_event, spec_of
from broker.store.tables import Job, JobEvent, Placement
from providers.base import ProviderError, Scope
from providers.model import PlacementState
from providers.startup import startup_script
from providers.storage import StorageError
from providers.storage.small import put_object

log = logging.getLogger(__name__)

MAX_SPEC_FAILURES = 3


class Prepared(StrEnum):
    NOT_NEEDED = "not_needed"  # the provider's instances run no agent
    READY = "ready"  # the spec is written and the start-up script recorded on the placement
    FAILED = "failed"  # a store error: try again next tick
    REFUSED = "refused"  # the job's image or secret references are refused: do not launch it
    NO_STORE = "no_store"  # no checkpoint store for the provider (the configuration changed)


class AttemptStoreUnavailable(ProviderError):
    """The attempt's spec could not be written to the checkpoint store after several tries: avoid the region."""

    scope = Scope.REGION


def resume_from(job: Job) -> str | None:
    """The checkpoint to resume from: the job's own after a first attempt, or a staged copy of the one it came
    with (a location the broker assigned to a first attempt holds nothing to resume from yet)."""
    given = spec_of(job).checkpoint_uri
    if job.checkpoint_uri and (job.attempts > 1 or (given is not None and job.checkpoint_uri != given)):
        return job.checkpoint_uri
    return None


def prepare_attempt(rt: Runtime, placement_id: str, now: datetime) -> tuple[Prepared, str]:
    """Write the spec and record the start-up script of a LAUNCHING placement (see the module docstring).
    Returns what happened and, for REFUSED and FAILED, why."""
    with Session(rt.engine) as session:
        p = session.get(Placement, placement_id)
        job = session.get(Job, p.job_id) if p is not None else None
    if p is None or job is None or p.state != PlacementState.LAUNCHING.value or p.instance_id is not None:
        return Prepared.NOT_NEEDED, ""
    provider = rt.provider(p.provider)
    if provider is None or not boots_agent(provider):
        return Prepared.NOT_NEEDED, ""
    if p.user_data is not None:
        return Prepared.READY, ""
    found = rt.checkpoint_stores.for_launch(p.provider, p.region)
    if found is None:
        return Prepared.NO_STORE, f"no checkpoint store is configured for {p.provider}"
    _, store_prefix = found
    try:
        attempt = layout.attempt_prefix(store_prefix, job.tenant, job.id, p.id)
        checkpoint_uri = job.checkpoint_uri or layout.job_checkpoint_prefix(store_prefix, job.tenant, job.id)
        spec = build_spec(
            rt.settings,
            spec_of(job),
            job_id=job.id,
            placement_id=p.id,
            provider_name=p.provider,
            provider=provider,
            checkpoint_uri=checkpoint_uri,
            resume=resume_from(job) is not None,
            attempt_prefix=attempt,
            mailbox_uri=layout.mailbox_prefix(store_prefix, job.tenant),
        )
    except (ValueError, StorageError) as exc:  # an unsafe name (UnsafeKey) or a refused image / secret reference
        return Prepared.REFUSED, str(exc)
    try:
        put_object(rt.checkpoint_stores.store(attempt), protocol.SPEC_NAME, spec.to_json())
        url, wheel = rt.agent_publisher().wheel_url(store_prefix)
        script = startup_script(
            wheel_url=url,
            wheel_sha256=wheel.sha256,
            spec_uri=attempt + protocol.SPEC_NAME,
            env=bootstrap_env(rt.settings, rt.checkpoint_stores),
            root=agent_root(provider, p.region, p.id, rt.settings.agent_root),
            systemd=agent_systemd(provider),
        )
    except (StorageError, ValueError) as exc:
        log.warning("writing the attempt spec of %s failed: %s", p.id, exc)
        _failed(rt, job.id, p.id, now, f"writing the attempt's spec to {attempt} failed: {exc}; retrying next tick")
        return Prepared.FAILED, str(exc)
    with Session(rt.engine) as session:
        row = session.exec(locked(select(Placement).where(Placement.id == placement_id))).first()
        if row is None or row.state != PlacementState.LAUNCHING.value or row.user_data is not None:
            return (Prepared.READY if row is not None and row.user_data is not None else Prepared.NOT_NEEDED), ""
        row.attempt_uri = attempt
        row.user_data = script
        session.add(row)
        add_event(
            session,
            job,
            now,
            "attempt_spec_written",
            f"the attempt's spec is at {attempt}{protocol.SPEC_NAME}",
            placement_id=p.id,
            attempt_uri=attempt,
            runtime=spec.runtime.value,
            agent_sha256=wheel.sha256,
        )
        session.commit()
    return Prepared.READY, ""


def spec_failures(rt: Runtime, job_id: str, placement_id: str) -> int:
    """How many times writing this placement's spec failed."""
    with Session(rt.engine) as session:
        events = session.exec(
            select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == "attempt_spec_failed")
        ).all()
    return sum(1 for data in events if data.get("placement_id") == placement_id)


def _failed(rt: Runtime, job_id: str, placement_id: str, now: datetime, message: str) -> None:
    with Session(rt.engine) as session:
        job = session.get(Job, job_id)
        if job is not None:
            add_event(session, job, now, "attempt_spec_failed", message, placement_id=placement_id)
            session.commit()
