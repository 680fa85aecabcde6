"""The one small contract every compute provider implements, its typed errors and optional capabilities.

Contract (asynchronous and eventually consistent, after Ray autoscaler v2 and Karpenter):
- `launch(request)` is idempotent on `request.launch_token`: calling it again with the same token returns the
  instance the first call made and never makes a second one. It returns once the cloud has accepted the request
  (typically PENDING) and never waits for a cloud operation to finish: the broker's tick must not stall on one.
  A refusal the cloud gives at once is raised (a typed `ProviderError`); a refusal that arrives later, in the
  operation the launch started (no capacity in the zone, quota, an organisation policy), is reported by `get` /
  `get_many` as the instance in state FAILED with `launch_error` set to the typed error `launch` would have
  raised, so the broker fails the placement over exactly as for a synchronous refusal.
- `terminate(instance_id)` converges: an unknown or already-gone instance is success. It does not wait either.
- `get(instance_id)` returns the provider's current view or raises `NotFound`.
- `list_instances()` returns only instances carrying this broker's tags. An ended instance that still exists and
  bills (a stopped VM keeping its disk, an Azure VM stopped but not deallocated, a VM whose create failed) is
  reported `lingering`: deleting it is still due, and `terminate` does it. An ended instance that holds nothing
  any more (deleted, terminated at the cloud, or being deleted) is `released`, and the orphan sweep leaves it
  alone, so one sweep ends each orphan once and later sweeps find nothing to do.
- Optionally (`BatchDescriber`), `get_many(ids)` answers for many instances in one call to the cloud (EC2's
  DescribeInstances takes hundreds of ids): the broker's sync step watches every live instance each tick, and one
  `get` per instance would not scale to thousands of jobs (nor stay inside a cloud's API rate limits).
  `describe(provider, ids)` uses it when the provider has it, and falls back to one `get` per id.
SDK clients are injected by the caller, so tests hand real clients pointed at local servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Protocol, runtime_checkable

from providers.model import BatchJob, BatchNode, JobSpec, Offering, Outcome, PressureSample, Tags


class InstanceState(StrEnum):
    PENDING = "pending"  # requested, not yet running (for on-prem: queued)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the job's command exited 0
    FAILED = "failed"  # the job's command failed
    PREEMPTED = "preempted"  # reclaimed by the provider
    TERMINATED = "terminated"  # stopped by us

    @property
    def terminal(self) -> bool:
        return self not in (InstanceState.PENDING, InstanceState.RUNNING)


class Scope(StrEnum):
    """How far a failure reaches, so failover blocklists the right thing."""

    ZONE = "zone"
    REGION = "region"
    PROVIDER = "provider"
    REQUEST = "request"


class ProviderError(Exception):
    """Base of every provider failure. `scope` says what to avoid on retry; `retryable` whether to retry."""

    scope: Scope = Scope.REQUEST
    retryable: bool = False

    def __init__(self, message: str, *, provider: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.detail = detail


class InsufficientCapacity(ProviderError):
    scope = Scope.ZONE
    retryable = True


class QuotaExceeded(ProviderError):
    scope = Scope.REGION
    retryable = True


class Throttled(ProviderError):
    scope = Scope.REQUEST
    retryable = True


class AuthError(ProviderError):
    """The credentials themselves failed (expired, unknown, unsigned): nothing on this provider can work."""

    scope = Scope.PROVIDER


class NotFound(ProviderError):
    scope = Scope.REQUEST


class InvalidRequest(ProviderError):
    scope = Scope.REQUEST


class PolicyDenied(ProviderError):
    """The cloud refused this request by policy: an organisation policy or service control policy, an IAM policy
    whose conditions the request does not meet (mandatory tags, instance types, regions), an Azure Policy
    assignment. The credentials are fine and other requests may pass, so it is scoped to the request: the broker
    refuses that pool for that job only, with the cloud's message, instead of blocking the whole provider."""

    scope = Scope.REQUEST


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything a provider needs to start one job attempt."""

    offering: Offering
    launch_token: str
    tags: Tags
    spec: JobSpec
    remaining_work_hours: Decimal
    resume_from: str | None = None
    checkpoint_interval_hours: Decimal = Decimal("0.5")
    # the start-up script the instance boots with (providers.startup: it installs and starts the instance agent,
    # which reads the attempt's spec from the store), passed as the cloud takes it: EC2 UserData, GCP metadata
    # `startup-script`, Azure customData, libcloud `ex_userdata`. None: the instance boots with none (simulated
    # providers and Slurm run no agent). Never holds a secret.
    user_data: str | None = None


@dataclass(frozen=True, slots=True)
class Instance:
    """A provider's view of one instance. `checkpointed_work_hours` is the work saved so far, when known.

    `lingering`: the instance has ended (a terminal state) but still exists at the provider and bills (a stopped
    VM keeping its boot disk, an Azure VM stopped without being deallocated, a VM left by a failed create), so
    `terminate` is still due; False for a running instance and for one that is gone or being deleted.
    `launch_error`: set (with state FAILED) when the cloud accepted the launch and then refused it in the operation
    it started: the typed error a synchronous refusal would have raised. Not part of equality (errors compare by
    identity). `outcome`: how an ended instance's work ended, when the provider knows it (an on-prem scheduler's
    accounting): FAILED with `Outcome.USER_FAILED` is final for the job, FAILED with INFRA_FAILED is re-placed."""

    id: str
    provider: str
    offering_key: str
    launch_token: str
    state: InstanceState
    tags: dict[str, str]
    launched_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    checkpointed_work_hours: Decimal | None = None
    detail: str = ""
    lingering: bool = False
    launch_error: ProviderError | None = field(default=None, compare=False)
    outcome: Outcome | None = None

    @property
    def released(self) -> bool:
        """Ended and holding nothing at the provider any more (deleted, terminated, or being deleted): there is
        nothing left to terminate. An ended instance that still exists and bills is `lingering` instead."""
        return self.state.terminal and not self.lingering


@runtime_checkable
class ComputeProvider(Protocol):
    """Launch, watch and stop capacity on one provider. See the module docstring for the contract."""

    name: str

    def launch(self, request: LaunchRequest) -> Instance: ...

    def terminate(self, instance_id: str) -> None: ...

    def get(self, instance_id: str) -> Instance: ...

    def list_instances(self) -> list[Instance]: ...


@runtime_checkable
class BatchDescriber(Protocol):
    """Optional capability of a `ComputeProvider`: the current view of many instances at once.

    `get_many(ids)` returns the instances it found, keyed by the id asked for; an id missing from the answer is
    gone (as `get` raising `NotFound`). An id it could not learn about on its own (a follow-up read for that one
    instance failed) may be answered with that `ProviderError`, so the rest of the batch still counts. A failure of
    the call as a whole raises a `ProviderError`."""

    def get_many(self, instance_ids: Sequence[str]) -> Mapping[str, Instance | ProviderError]: ...


def describe(provider: ComputeProvider, instance_ids: Sequence[str]) -> dict[str, Instance | ProviderError]:
    """The provider's view of each instance: an `Instance`, `NotFound` when it is gone, or the `ProviderError`
    that stopped the provider from answering for it (then the caller knows nothing new about that instance).

    Uses `get_many` when the provider has it (one error then stands for every id), else one `get` per id. Any other
    exception an answer raises (a malformed answer its parser did not expect) becomes an `UnreadableAnswer` for
    that id (for every id of a failed `get_many`), so one bad instance never hides the others."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids:
        return {}
    out: dict[str, Instance | ProviderError] = {}
    if isinstance(provider, BatchDescriber):
        try:
            found = provider.get_many(ids)
        except ProviderError as exc:
            return dict.fromkeys(ids, exc)
        except Exception as exc:  # a bulkhead: a malformed answer is this read's failure, not the caller's
            return dict.fromkeys(ids, UnreadableAnswer.of(provider.name, exc))
        for iid in ids:
            out[iid] = found.get(iid) or NotFound(f"no instance {iid}", provider=provider.name)
        return out
    for iid in ids:
        try:
            out[iid] = provider.get(iid)
        except ProviderError as exc:
            out[iid] = exc
        except Exception as exc:  # a bulkhead: one instance's malformed answer, never the others'
            out[iid] = UnreadableAnswer.of(provider.name, exc)
    return out


class UnreadableAnswer(ProviderError):
    """The provider answered something its adapter could not read (a malformed or hostile answer)."""

    @classmethod
    def of(cls, provider: str, exc: BaseException) -> UnreadableAnswer:
        return cls(f"unreadable answer: {type(exc).__name__}: {str(exc)[:300]}", provider=provider)


@runtime_checkable
class OfferingSource(Protocol):
    """A provider that can list its pools with current prices (a price feed)."""

    name: str

    def offerings(self, now: datetime) -> list[Offering]: ...


@runtime_checkable
class QueuePressureSource(Protocol):
    """An on-prem scheduler that reports how backed up its GPU queue is."""

    name: str

    def pressure(self, now: datetime) -> list[PressureSample]: ...


class QueueDemand(Protocol):
    """One pending job's GPU request as a queue model classifies it (`federation.pressure.GpuDemand`)."""

    @property
    def job(self) -> BatchJob: ...
    @property
    def accelerator(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def burstable(self) -> bool: ...


class QueueView(Protocol):
    """A queue-pressure model over one snapshot of an on-prem queue (`federation.pressure.QueueModel`)."""

    def demands(self) -> Sequence[QueueDemand]: ...

    def samples(self, now: datetime, source: str = ...) -> list[PressureSample]: ...

    def expected_wait_hours(
        self,
        gpu_type: str,
        gpus: int,
        now: datetime,
        *,
        partition: str | None = None,
        work_hours: float | None = None,
    ) -> float: ...


class QueueModelFactory(Protocol):
    """Builds a `QueueView` (`federation.pressure.QueueModel` itself). An on-prem provider is given one by its
    caller, since providers never import the federation layer that models queues."""

    def __call__(
        self,
        jobs: Sequence[BatchJob],
        nodes: Sequence[BatchNode],
        *,
        partitions: Iterable[str] | None = ...,
        unlimited_job_hours: float = ...,
    ) -> QueueView: ...


@dataclass(frozen=True, slots=True)
class InterruptionNotice:
    """A provider's warning that an instance is about to be (or was) reclaimed.

    `kind` is "interruption" (the instance will stop at `action_at`) or "rebalance" (elevated risk, no deadline).
    """

    instance_id: str
    provider: str
    kind: str
    at: datetime
    action_at: datetime | None = None
    raw: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class InterruptionSource(Protocol):
    """A provider that pushes interruption notices (AWS EventBridge -> SQS, Azure Scheduled Events relayed...).

    `poll_interruptions` returns notices received since the last call and acknowledges them (at-least-once:
    a notice may be returned again after a crash, so handling must be idempotent). A source may instead leave
    them unacknowledged until `ack_interruptions(notices)` (optional; the broker calls it once it has acted on
    them), so that a crash between the poll and the broker's commit loses nothing.
    """

    name: str

    def poll_interruptions(self) -> list[InterruptionNotice]: ...
