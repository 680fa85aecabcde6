"""The real on-prem provider: a Slurm cluster driven through its command-line tools (`sbatch`, `squeue --json`...)
or slurmrestd (see the transport paragraph at the end).

Contract: `SlurmProvider` implements `ComputeProvider`, `OfferingSource` and `QueuePressureSource`
(`providers.base`) for the partitions it is given, as provider `name` (default "onprem-slurm"), region "onprem",
one zone per partition. It is the real counterpart of `providers.simulated.onprem`.

- `offerings(now)`: per partition, ON_PREM offerings of 1, 2, 4 and 8 GPUs (up to the partition's GPUs per node)
  priced at the internal rate x GPUs, `expected_wait_hours` from the injected `queue_model` (the broker passes
  `federation.pressure.QueueModel`: providers never import federation), capped at a year; `available` is False
  when the shape can never start on the usable nodes.
- `pressure(now)`: one `PressureSample` per GPU type on the configured partitions (pending = Resources/Priority).
- `launch(request)`: `<submit wrapper> sbatch --parsable --job-name=ovs-<token[:16]>
  --comment=overspill:<broker>:<token> ... --partition=P --nodes=1 --gres=gpu:<type>:<n>
  --time=<remaining work in minutes, rounded up> --wrap=<command>`, run as the tenant's own unprivileged unix user
  (`submit_as[tenant]`, through `submit_wrapper`, default `sudo -n -u <user> --`, which a site allows with a
  sudoers rule limited to sbatch): never as the broker's operator account, which can hold and cancel anyone's
  jobs. A tenant without an identity is refused (`InvalidRequest`; `refuses_tenant` lets placement leave this
  provider's pools out for it beforehand). Idempotent on the launch token: it first looks for a job whose comment
  carries the token, and after submitting it looks again and cancels any duplicate a concurrent call made (the
  lowest job id wins). The comment also carries the job and placement tags (`job=`, `placement=`, URL-quoted
  extras), so `get`/`list_instances` can return them.
- `get(id)` / `get_many(ids)` (the sync step's one call per tick) read this tick's `squeue --json` for live jobs
  and raise / leave out `NotFound` for an unknown id or a job that is not this broker's (job ids are reused after
  a controller reset). A job that ended, or left squeue (`MinJobAge` after its end, 300 s by default), is read
  from accounting: one `sacct --json` (else `sacct -P`) for all of them (`providers.slurm.accounting`), so its
  outcome is never lost; `Instance.outcome` classifies it like the agent (user_failed, infra_failed, preempted).
  A job accounting still shows running after it left squeue is answered with an error (asked again next tick);
  without slurmdbd (`AccountingDisabled`) it is `NotFound`. Accounting records are this broker's by their comment
  (`AccountingStoreFlags=job_comment`), else by their `ovs-` name and a submit identity.
  States: PENDING/REQUEUED -> PENDING; RUNNING/CONFIGURING/COMPLETING/SUSPENDED -> RUNNING; COMPLETED ->
  SUCCEEDED; FAILED/TIMEOUT/OUT_OF_MEMORY/DEADLINE (user_failed), NODE_FAIL/BOOT_FAIL (infra_failed) -> FAILED;
  CANCELLED -> TERMINATED; PREEMPTED -> PREEMPTED. A v0.0.38 "COMPLETING" job has ended but Slurm is still
  cleaning up and does not yet say how it ended, so it stays RUNNING until the outcome shows.
- One read per tick: between `begin_tick(now)` and `end_tick()` (called by the broker's tick) `jobs()` and
  `nodes()` answer from one squeue and one sinfo shared by pressure, offerings, bursting and sync; a command that
  changes a job drops the job snapshot, and the exactly-once reads (`fresh_jobs`: after sbatch, after a hold)
  always go to slurmctld and become the snapshot.
- `terminate(id)`: `scancel` when the job is ours and not finished; unknown or foreign ids are success.
- `list_instances()`: the jobs whose comment starts `overspill:<broker_id>:`.
Burst-policy helpers, for a broker running as a Slurm operator (`AdminLevel=Operator`, not root): `queued_jobs()`
lists other users' pending GPU jobs with their reasons, one entry per pending array task (target `<array>_<task>`:
22.05's scancel/scontrol ignore a task's own job id; the components of a heterogeneous job are listed but never
burstable: the cloud would run one component without the others); `hold(target, reason)` marks and holds a job,
then reads it again and only answers held when it is still pending and held by us (else it undoes the hold: Slurm
may have started it first); `release(target, priority=)` gives it back (restoring the recorded priority only under
priority/basic, where a release sends a job to the back; other plugins recompute and keep ageing it);
`complete_held(target)` ends a job that ran in the cloud so its dependents see it as done (dependencies rewritten,
then `scancel`), `sweep_dependents(...)` catches dependents submitted later; `requeue(id)`. The hold mark
`[overspill-hold broker=.. at=.. reason=.. sig=..]` goes in the job's Comment (operators cannot write AdminComment),
signed with `hold_key` (HMAC-SHA256) so a user cannot forge one.

Every request goes through the injected transport (`providers.slurm.transport.SlurmTransport`): by default
`CliTransport`, the Slurm tools through `run(argv) -> CompletedProcess` (default: `subprocess.run` with
`SLURM_CONF`); or `providers.slurm.rest.RestTransport`, slurmrestd v0.0.38 with a JWT, which leaves release,
requeue, submission and the held job's batch-script read to the tools (v0.0.38 cannot do them; see there). `run`
stays the runner `providers.slurm.script` reads a held job with. Failures map onto the typed errors: controller
unreachable -> `SlurmUnavailable` (retryable, provider-wide), bad partition/GRES/shape -> `InvalidRequest`,
QOS/association limits -> `QuotaExceeded`, permission -> `AuthError`, anything else -> `SlurmCommandError`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import quote, unquote

from providers.accelerators import canonical, memory_gib
from providers.base import (
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    ProviderError,
    QueueDemand,
    QueueModelFactory,
    QueueView,
)
from providers.model import (
    BROKER_TAG,
    JOB_TAG,
    PLACEMENT_TAG,
    CapacityType,
    Offering,
    Outcome,
    PressureSample,
    Price,
    offering_key,
)
from providers.slurm.accounting import classify, describe_ending
from providers.slurm.dependency import DependencyParseError, mentions, rewrite_as_succeeded
from providers.slurm.json_api import SlurmJob, SlurmNode
from providers.slurm.transport import (
    AccountingDisabled,
    CliTransport,
    SlurmCommandError,
    SlurmTransport,
    SlurmUnavailable,
)
from providers.startup import container_env

__all__ = [  # the errors live with the transports; importers know them from here too
    "AccountingDisabled",
    "SlurmCommandError",
    "SlurmUnavailable",
]

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
CommandBuilder = Callable[[LaunchRequest], str]

GPU_SIZES = (1, 2, 4, 8)
PRICE_QUANTUM = Decimal("0.0001")
MAX_WAIT_HOURS = 8760.0
COMMENT_PREFIX = "overspill"
JOB_NAME_PREFIX = "ovs-"
HOLD_MARK = "overspill-hold"
HELD_BY_ADMIN = "JobHeldAdmin"  # what `scontrol hold` by an operator leaves (a user's own hold: JobHeldUser)
DEFAULT_SUBMIT_WRAPPER = ("sudo", "-n", "-u", "{user}", "--")
SACCT_BATCH = 500  # job ids per sacct command (a broker back after a long outage may have many ended jobs)
MAX_TASKS_PER_RECORD = 64  # array tasks of one pending array record offered to the burst policy per read
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_UNIX_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}\$?$")
_TARGET_RE = re.compile(r"^(\d+)(?:_(\d+))?$")
_HOLD_RE = re.compile(r"\s*\[overspill-hold [^\]]*\]")

_STATES: dict[str, InstanceState] = {
    "PENDING": InstanceState.PENDING,
    "REQUEUED": InstanceState.PENDING,
    "REQUEUE_HOLD": InstanceState.PENDING,
    "REQUEUE_FED": InstanceState.PENDING,
    "RESV_DEL_HOLD": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "CONFIGURING": InstanceState.RUNNING,
    "COMPLETING": InstanceState.RUNNING,
    "SUSPENDED": InstanceState.RUNNING,
    "RESIZING": InstanceState.RUNNING,
    "SIGNALING": InstanceState.RUNNING,
    "STAGE_OUT": InstanceState.RUNNING,
    "STOPPED": InstanceState.RUNNING,
    "COMPLETED": InstanceState.SUCCEEDED,
    "FAILED": InstanceState.FAILED,
    "TIMEOUT": InstanceState.FAILED,
    "NODE_FAIL": InstanceState.FAILED,
    "OUT_OF_MEMORY": InstanceState.FAILED,
    "BOOT_FAIL": InstanceState.FAILED,
    "DEADLINE": InstanceState.FAILED,
    "SPECIAL_EXIT": InstanceState.FAILED,
    "CANCELLED": InstanceState.TERMINATED,
    "REVOKED": InstanceState.TERMINATED,
    "PREEMPTED": InstanceState.PREEMPTED,
}


_OUTCOME_STATES: dict[Outcome, InstanceState] = {
    Outcome.SUCCEEDED: InstanceState.SUCCEEDED,
    Outcome.USER_FAILED: InstanceState.FAILED,
    Outcome.INFRA_FAILED: InstanceState.FAILED,
    Outcome.PREEMPTED: InstanceState.PREEMPTED,
    Outcome.CANCELLED: InstanceState.TERMINATED,
}
_EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """What the broker offers on one partition: its GPU type, internal rate and GPUs per node.

    `gres_type` is the GPU type name in Slurm's configuration (default: the accelerator, lower-cased).
    """

    accelerator: str
    rate_usd_per_gpu_hour: Decimal
    gpus_per_node: int
    gres_type: str | None = None

    @property
    def slurm_gpu_type(self) -> str:
        return self.gres_type or self.accelerator.lower()


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """Another user's pending GPU job (or one pending task of an array), for the burst policy.

    `target` addresses it in Slurm commands (`123`, or `123_4` for task 4 of array 123); `gpus` are that one
    job's or task's. `held_by` is the broker whose signed hold mark it carries while held by an operator, if any.
    """

    job: SlurmJob
    accelerator: str
    gpus: int
    reason: str
    burstable: bool
    held_by: str | None = None
    hold_reason: str = ""
    target: str = ""


@dataclass(frozen=True, slots=True)
class HoldOutcome:
    """What `hold` found after holding: `held` when the job is still pending and held by this broker (the burst
    may be committed), else `detail` says what happened instead (it started, ended or vanished) and the hold was
    undone. `job` is the job as read after the hold (None when gone); `priority` the priority it had before."""

    held: bool
    job: SlurmJob | None
    detail: str = ""
    priority: int | None = None


def subprocess_runner(slurm_conf: str | None = None, *, timeout: float = 30.0) -> Runner:
    """Run Slurm tools with `subprocess.run` (text mode, no check), `SLURM_CONF` set when given."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=timeout)

    return run


def default_command(request: LaunchRequest) -> str:
    """The job's command line with the same environment cloud instances give the container
    (providers.startup.container_env: checkpoint location, resume flag, job and placement ids)."""
    env = {"OVERSPILL_LAUNCH_TOKEN": request.launch_token, **container_env(request)}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"{exports} exec {shlex.join(request.spec.command)}"


class SlurmProvider:
    """A Slurm cluster as a compute provider (see the module docstring for the contract)."""

    def __init__(
        self,
        *,
        broker_id: str,
        partitions: Mapping[str, PartitionInfo],
        queue_model: QueueModelFactory,
        run: Runner | None = None,
        name: str = "onprem-slurm",
        slurm_conf: str | None = None,
        command: CommandBuilder = default_command,
        output: str = "/dev/null",
        workdir: str | None = None,
        unlimited_job_hours: float = 24.0,
        submit_as: Mapping[str, str] | None = None,
        submit_wrapper: Sequence[str] = DEFAULT_SUBMIT_WRAPPER,
        hold_key: bytes = b"",
        priority_type: str | None = None,
        transport: SlurmTransport | None = None,
    ) -> None:
        if not broker_id or not _TOKEN_RE.match(broker_id):
            raise ValueError("broker_id must be non-empty letters, digits, '.', '_' or '-' (it goes in comments)")
        if not partitions:
            raise ValueError("at least one partition is needed")
        for part, info in partitions.items():
            if info.gpus_per_node <= 0:
                raise ValueError(f"partition {part}: gpus_per_node must be positive")
        self.name = name
        self.region = "onprem"
        self.broker_id = broker_id
        self.partitions = dict(partitions)
        self.queue_model = queue_model
        self.transport: SlurmTransport = transport or CliTransport(run or subprocess_runner(slurm_conf), name)
        self.command = command
        self.output = output
        self.workdir = workdir
        self.unlimited_job_hours = unlimited_job_hours
        for tenant, user in (submit_as or {}).items():
            if not _UNIX_USER_RE.match(user) or user == "root":
                raise ValueError(f"submit_as[{tenant!r}]: {user!r} is not an unprivileged unix user name")
        if "{user}" not in submit_wrapper:
            raise ValueError("submit_wrapper must contain '{user}' (e.g. sudo -n -u {user} --)")
        self.submit_as = dict(submit_as or {})
        self.submit_wrapper = tuple(submit_wrapper)
        self.hold_key = hold_key
        self.priority_type = priority_type
        self._prefix = f"{COMMENT_PREFIX}:{broker_id}:"
        self._tick: datetime | None = None
        self._snapshot: tuple[datetime, list[SlurmJob] | None, list[SlurmNode] | None] | None = None
        self._model: tuple[Sequence[SlurmJob], Sequence[SlurmNode], QueueView] | None = None

    @property
    def run(self) -> Runner:
        """The command runner: the tools' transport's, or the REST transport's for what it leaves to the tools
        (and `providers.slurm.script`'s reads of a held job). Setting it re-points the transport."""
        return self.transport.run

    @run.setter
    def run(self, run: Runner) -> None:
        self.transport.run = run

    # ---- one read per tick --------------------------------------------------------------------------------

    def begin_tick(self, now: datetime) -> None:
        """Start a tick at `now`: until `end_tick`, `jobs()` and `nodes()` answer from one squeue and one sinfo
        read, cached under the tick's time and shared by pressure, offerings, the burst step and sync. A command
        that may change a job (sbatch, scancel, scontrol hold/release/update/requeue) drops the cache, so a read
        after it is fresh; the exactly-once checks (`hold`'s read after holding, `launch`'s token look-ups) always
        read afresh."""
        self._tick = now
        self._snapshot = None

    def end_tick(self) -> None:
        self._tick = None
        self._snapshot = None
        self._model = None

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows: this tick's snapshot inside a tick, else a fresh `squeue`."""
        if self._tick is None:
            return self.squeue()
        snap = self._snapshot if self._snapshot is not None and self._snapshot[0] == self._tick else None
        if snap is not None and snap[1] is not None:
            return snap[1]
        jobs = self.squeue()
        self._snapshot = (self._tick, jobs, snap[2] if snap is not None else None)
        return jobs

    def fresh_jobs(self) -> list[SlurmJob]:
        """A fresh `squeue`, always (the exactly-once checks); inside a tick it becomes the tick's snapshot, so the
        steps after it read what it read."""
        jobs = self.squeue()
        if self._tick is not None:
            snap = self._snapshot if self._snapshot is not None and self._snapshot[0] == self._tick else None
            self._snapshot = (self._tick, jobs, snap[2] if snap is not None else None)
        return jobs

    def nodes(self) -> list[SlurmNode]:
        """Every node: this tick's snapshot inside a tick, else a fresh `sinfo`. A change to a job keeps the node
        snapshot (nodes change only by the scheduler's own hand within a tick)."""
        if self._tick is None:
            return self.sinfo()
        snap = self._snapshot if self._snapshot is not None and self._snapshot[0] == self._tick else None
        if snap is not None and snap[2] is not None:
            return snap[2]
        nodes = self.sinfo()
        self._snapshot = (self._tick, snap[1] if snap is not None else None, nodes)
        return nodes

    # ---- commands -----------------------------------------------------------------------------------------

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Around any request that may change a job: it drops this tick's job snapshot (`begin_tick`), whatever
        the answer (a request that failed may still have changed the job)."""
        try:
            yield
        finally:
            if self._snapshot is not None:
                self._snapshot = (self._snapshot[0], None, self._snapshot[2])  # jobs changed; nodes are the scheduler's

    def squeue(self) -> list[SlurmJob]:
        """Every job slurmctld still knows (all states, all partitions), read afresh through the transport."""
        return self.transport.jobs()

    def sinfo(self) -> list[SlurmNode]:
        """Every node (one record per node), read afresh through the transport."""
        return self.transport.nodes()

    # ---- feeds --------------------------------------------------------------------------------------------

    def instance_type(self, accelerator: str, gpus: int) -> str:
        return f"slurm-{canonical(accelerator).lower()}-{gpus}gpu"

    def model(self, jobs: Sequence[SlurmJob] | None = None, nodes: Sequence[SlurmNode] | None = None) -> QueueView:
        """The queue model over the configured partitions, from this tick's squeue/sinfo (`jobs()`, `nodes()`)
        unless given; built once per snapshot."""
        jobs = self.jobs() if jobs is None else jobs
        nodes = self.nodes() if nodes is None else nodes
        cached = self._model
        if cached is not None and cached[0] is jobs and cached[1] is nodes:
            return cached[2]
        view = self.queue_model(jobs, nodes, partitions=self.partitions, unlimited_job_hours=self.unlimited_job_hours)
        self._model = (jobs, nodes, view)
        return view

    def offerings(self, now: datetime) -> list[Offering]:
        now = _utc(now)
        nodes = self.nodes()
        model = self.model(nodes=nodes)
        out: list[Offering] = []
        for part, info in sorted(self.partitions.items()):
            acc = canonical(info.accelerator)
            in_part = [n for n in nodes if part in n.partitions and n.gres.get(info.slurm_gpu_type, 0) > 0]
            node_gpus = max((n.gres[info.slurm_gpu_type] for n in in_part), default=info.gpus_per_node)
            cpus = max((n.cpus for n in in_part), default=0)
            mem = max((n.real_memory_mib for n in in_part), default=0)
            for n in GPU_SIZES:
                if n > info.gpus_per_node:
                    continue
                wait = model.expected_wait_hours(acc, n, now, partition=part)
                out.append(
                    Offering(
                        provider=self.name,
                        region=self.region,
                        zone=part,
                        instance_type=self.instance_type(acc, n),
                        accelerator=acc,
                        accelerator_count=n,
                        gpu_memory_gib=memory_gib(acc),
                        vcpus=cpus * n // node_gpus if node_gpus else 0,
                        memory_gib=(Decimal(mem) * n / node_gpus / 1024).quantize(Decimal("0.01"))
                        if node_gpus
                        else Decimal(0),
                        capacity_type=CapacityType.ON_PREM,
                        price=Price((info.rate_usd_per_gpu_hour * n).quantize(PRICE_QUANTUM), "internal-rate", now),
                        expected_wait_hours=min(wait, MAX_WAIT_HOURS),
                        available=math.isfinite(wait),
                    )
                )
        return out

    def partition_gpus(self, partition: str) -> int:
        """GPUs of the partition's configured type on its usable nodes (this tick's sinfo)."""
        info = self.partitions.get(partition)
        if info is None:
            return 0
        gpu_type = info.slurm_gpu_type
        return sum(n.gres.get(gpu_type, 0) for n in self.nodes() if partition in n.partitions and n.usable)

    def pressure(self, now: datetime) -> list[PressureSample]:
        now = _utc(now)
        samples = self.model().samples(now, source=self.name)
        return [
            PressureSample(
                s.accelerator,
                s.total_gpus,
                s.free_gpus,
                s.pending_jobs,
                s.pending_gpus,
                min(s.expected_wait_hours, MAX_WAIT_HOURS),
                s.observed_at,
                s.source,
            )
            for s in samples
        ]

    # ---- instances ----------------------------------------------------------------------------------------

    def identity(self, tenant: str) -> str | None:
        """The unprivileged unix user this tenant's on-prem jobs are submitted as, if the site configured one."""
        return self.submit_as.get(tenant)

    def refuses_tenant(self, tenant: str) -> str | None:
        """Why this provider cannot run the tenant's jobs (no submit identity), or None."""
        if self.identity(tenant) is None:
            return (
                f"tenant {tenant} has no Slurm submit identity (OVERSPILL_SLURM_SUBMIT_AS): "
                f"{self.name} runs no job as the broker's own account"
            )
        return None

    def launch(self, request: LaunchRequest) -> Instance:
        token = request.launch_token
        if not token or not _TOKEN_RE.match(token):
            raise InvalidRequest("launch_token must be letters, digits, '.', '_' or '-'", provider=self.name)
        refusal = self.refuses_tenant(request.spec.tenant)
        if refusal:
            raise InvalidRequest(refusal, provider=self.name)
        user = self.identity(request.spec.tenant)
        assert user is not None
        part, info = self._partition_for(request.offering)
        if request.remaining_work_hours < 0:
            raise InvalidRequest("remaining_work_hours must not be negative", provider=self.name)
        existing = self._by_token(self.jobs(), token)  # a later duplicate is caught by the fresh read below
        if existing:
            return self._instance(existing[0])
        minutes = max(1, math.ceil(request.remaining_work_hours * 60))
        argv = [
            *(part.replace("{user}", user) for part in self.submit_wrapper),
            "sbatch",
            "--parsable",
            f"--job-name={JOB_NAME_PREFIX}{token[:16]}",
            f"--comment={self._comment(request)}",
            f"--partition={part}",
            "--nodes=1",
            f"--gres=gpu:{info.slurm_gpu_type}:{request.offering.accelerator_count}",
            f"--time={minutes}",
            f"--output={self.output}",
        ]
        if self.workdir:
            argv.append(f"--chdir={self.workdir}")
        argv.append(f"--wrap={self.command(request)}")
        with self._changing():
            submitted = self.transport.submit(argv)
        mine = self._by_token(self.fresh_jobs(), token)
        if not mine:
            raise SlurmCommandError(f"job {submitted} vanished right after sbatch", provider=self.name)
        for duplicate in mine[1:]:  # a concurrent launch of the same token also submitted: keep the first
            with self._changing(), suppress(ProviderError):
                self.transport.cancel(str(duplicate.job_id))
        return self._instance(mine[0])

    def get(self, instance_id: str) -> Instance:
        found = self.get_many([instance_id]).get(instance_id)
        if isinstance(found, ProviderError):
            raise found
        if found is None:
            raise NotFound(
                f"no job {instance_id} of broker {self.broker_id} on {self.name} (neither in squeue nor in sacct)",
                provider=self.name,
            )
        return found

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance | ProviderError]:
        """This broker's jobs among `instance_ids`: live ones from this tick's squeue snapshot, ended or vanished
        ones from accounting (one `sacct` for all of them; see the module docstring). An id neither knows is left
        out (gone). An id that left squeue while accounting cannot answer for it yet is answered with the error."""
        mine = {str(j.job_id): j for j in self.jobs() if j.comment.startswith(self._prefix)}
        out: dict[str, Instance | ProviderError] = {}
        ask: list[str] = []
        for iid in dict.fromkeys(instance_ids):
            job = mine.get(iid)
            if job is not None and not self._state(job).terminal:
                out[iid] = self._instance(job)
            elif iid.isdigit():
                ask.append(iid)
        if not ask:
            return out
        try:
            accounted = self.accounting(ask)
        except AccountingDisabled:
            accounted = {}
        except ProviderError as exc:
            for iid in ask:
                out[iid] = self._instance(mine[iid]) if iid in mine else exc
            return out
        for iid in ask:
            record = accounted.get(iid)
            if record is not None and self._state(record).terminal:
                out[iid] = self._instance(record)
            elif iid in mine:
                out[iid] = self._instance(mine[iid])
            elif record is not None:
                out[iid] = SlurmCommandError(
                    f"job {iid} left squeue but accounting still shows it {record.state}: asking again next tick",
                    provider=self.name,
                )
        return out

    def accounting(self, job_ids: Sequence[str]) -> dict[str, SlurmJob]:
        """This broker's jobs among `job_ids` as slurmdbd recorded them (`sacct --json`, else `sacct -P`), by job
        id; when an id was reused (a controller reset), the latest of this broker's records. Raises
        `AccountingDisabled` when the cluster keeps no accounting, `SlurmUnavailable` when slurmdbd is down."""
        ids = [i for i in dict.fromkeys(job_ids) if i.isdigit()]
        if not ids:
            return {}
        records = self._sacct(ids)
        out: dict[str, SlurmJob] = {}
        for job in records:
            key = str(job.job_id)
            if key not in ids or not self._accounted_ours(job):
                continue
            seen = out.get(key)
            never = datetime.min.replace(tzinfo=UTC)
            if seen is None or (job.submit_time or never) >= (seen.submit_time or never):
                out[key] = job
        return out

    def _sacct(self, ids: list[str]) -> list[SlurmJob]:
        """Accounting records of these job ids or array tasks, `SACCT_BATCH` ids per command."""
        out: list[SlurmJob] = []
        for start in range(0, len(ids), SACCT_BATCH):
            out += self._sacct_batch(ids[start : start + SACCT_BATCH])
        return out

    def _sacct_batch(self, ids: list[str]) -> list[SlurmJob]:
        return self.transport.accounting(ids)

    def _accounted_ours(self, job: SlurmJob) -> bool:
        """A record this broker made: its comment when the site stores comments (`AccountingStoreFlags=job_comment`),
        else its `ovs-` job name and one of this broker's submit identities."""
        if job.comment:
            return job.comment.startswith(self._prefix)
        return job.name.startswith(JOB_NAME_PREFIX) and job.user in set(self.submit_as.values())

    def terminate(self, instance_id: str) -> None:
        job = self._ours(instance_id, self.squeue())
        if job is None or self._state(job).terminal:
            return
        with self._changing(), suppress(NotFound):
            self.transport.cancel(str(job.job_id))

    def list_instances(self) -> list[Instance]:
        return [self._instance(j) for j in self.jobs() if j.comment.startswith(self._prefix)]

    # ---- burst-policy helpers -----------------------------------------------------------------------------

    def queued_jobs(self) -> list[QueuedJob]:
        """Pending GPU jobs on the configured partitions that this broker did not launch, oldest first; a pending
        array record is listed once per pending task (at most `MAX_TASKS_PER_RECORD`), each with its own target."""
        model = self.model()
        out: list[QueuedJob] = []
        for d in model.demands():
            if d.job.comment.startswith(self._prefix):
                continue
            out.extend(self._queued(d))
        never = datetime.max.replace(tzinfo=UTC)
        return sorted(out, key=lambda q: (q.job.submit_time or never, q.job.job_id, q.target))

    def hold(self, target: int | str, reason: str) -> HoldOutcome:
        """Hold another user's pending job or array task, then read it again to see that it is still pending and
        held by this broker (see `HoldOutcome`).

        Order: a signed mark `[overspill-hold broker=.. at=.. reason=.. sig=..]` is appended to the job's Comment
        (an operator cannot write AdminComment; the signature keeps a user from forging it), then `scontrol hold`.
        Slurm may start the job at any moment before the hold lands, and `scontrol hold` of a job that has just
        started still succeeds (it only zeroes its priority): so the job is read again, and unless it is still
        PENDING with reason JobHeldAdmin and our mark, the hold is undone (`scontrol release`, which leaves a
        running job running) and the mark removed: the caller must then not burst it. Holding a job this broker
        already holds answers held; a job held by its user or another admin is refused (`InvalidRequest`).
        """
        job = self._find(target, self.jobs())  # this tick's read; the read after the hold is always fresh
        if job is None:
            raise NotFound(f"no job {target} on {self.name}", provider=self.name)
        name = job.target
        if not job.pending:
            return HoldOutcome(False, job, f"job {name} is {job.state}", job.priority)
        if job.state_reason.startswith("JobHeld"):
            if job.state_reason == HELD_BY_ADMIN and self.holds(job):
                return HoldOutcome(True, job, "", job.priority)
            raise InvalidRequest(f"job {name} is already held ({job.state_reason})", provider=self.name)
        failed: ProviderError | None = None
        try:
            self._set_comment(name, f"{strip_hold_mark(job.comment)} {self._mark(name, reason)}".strip())
            with self._changing():
                self.transport.hold(name)
        except (InvalidRequest, SlurmCommandError) as exc:  # e.g. it ended meanwhile: decided by the read below
            failed = exc
        after = self._find(name, self.fresh_jobs())
        if after is not None and after.pending and after.state_reason == HELD_BY_ADMIN and self.holds(after):
            return HoldOutcome(True, after, "", job.priority)
        self._undo_hold(name, after)
        state = "gone" if after is None else f"{after.state} ({after.state_reason or 'no reason'})"
        detail = f"job {name} is {state} after the hold: not burst" + (f" ({failed})" if failed else "")
        return HoldOutcome(False, after, detail, job.priority)

    def holds(self, job: SlurmJob) -> bool:
        """Whether the job carries this broker's hold mark (with a valid signature when a hold key is set)."""
        note = hold_note(job.comment)
        if note is None or note.get("broker") != self.broker_id:
            return False
        if not self.hold_key:
            return True
        want = self._sign(job.target, note.get("at", ""))
        return hmac.compare_digest(note.get("sig", ""), want)

    def release(self, target: int | str, *, priority: int | None = None, owned: bool = False) -> None:
        """Give back a job this broker held: `scontrol release`, then drop the mark.

        Converges: a job that is gone or no longer held only loses the mark. A job held by its user (JobHeldUser),
        or by an admin without this broker's mark unless the caller knows it is ours (`owned`, from its own
        records), is refused. Priority: under priority/multifactor (or any plugin but basic) the release alone lets
        Slurm recompute the job's priority from its factors, so it keeps ageing; setting it explicitly would pin it
        there for good. Under priority/basic a release gives the job a new, lowest priority (the back of the queue)
        and nothing ever ages, so the pre-hold `priority` the caller recorded is set again: the job keeps its
        place.
        """
        job = self._find(target)
        if job is None:
            return
        name = job.target
        if job.state_reason == "JobHeldUser":
            raise InvalidRequest(f"job {name} is held by its user, not by broker {self.broker_id}", provider=self.name)
        if job.state_reason == HELD_BY_ADMIN:
            if not (owned or self.holds(job)):
                raise InvalidRequest(f"job {name} was not held by broker {self.broker_id}", provider=self.name)
            with self._changing():
                self.transport.release(name)
            if job.pending and priority and priority > 0 and self.priority_plugin() == "priority/basic":
                with self._changing():
                    self.transport.update_job(name, priority=priority)
        if hold_note(job.comment) is not None and not self._state(job).terminal:
            self._set_comment(name, strip_hold_mark(job.comment))

    def complete_held(self, target: int | str, *, owned: bool = False) -> list[str]:
        """End a held job that ran in the cloud instead, so that its dependents see it as COMPLETED.

        Every pending job whose dependency names it (or its whole array) gets that dependency rewritten as if it
        had completed (`providers.slurm.dependency`), then the job, and only this task of an array, is cancelled.
        Returns the dependents rewritten. Converges: a job already gone or ended is success. A job not held by
        this broker (unless `owned`) or no longer pending (someone released it and it started) is refused: the
        on-prem run is never cancelled.
        """
        jobs = self.squeue()
        job = self._find(target, jobs)
        if job is None or self._state(job).terminal:
            return []
        name = job.target
        if not job.pending or job.state_reason != HELD_BY_ADMIN or not (owned or self.holds(job)):
            raise InvalidRequest(
                f"job {name} is {job.state} ({job.state_reason}), not held by broker {self.broker_id}",
                provider=self.name,
            )
        rewritten = self._rewrite_dependents(jobs, [name])
        with self._changing(), suppress(NotFound):
            self.transport.cancel(name)
        return rewritten

    def sweep_dependents(self, targets: Iterable[str], done: Collection[str] = ()) -> list[str]:
        """Rewrite the dependencies of pending jobs submitted after `complete_held` ended these targets (jobs that
        ran in the cloud): a late `afterok:X` would otherwise wait for ever. `done` are the dependents already
        rewritten (an `afternotok:X` turned into `afterok:X` must stay so). Returns the jobs rewritten."""
        wanted = list(targets)
        if not wanted:
            return []
        return self._rewrite_dependents(self.jobs(), wanted, skip=frozenset(done), convert_notok=False)

    def lost_holds(self, targets: Sequence[str]) -> dict[str, SlurmJob]:
        """Of these jobs this broker holds for bursts running in the cloud, those no longer pending on-prem: ended
        (cancelled by their user, say) or started (someone released the hold). From this tick's squeue; a target
        gone from it is looked up in accounting (one `sacct`), since it may have ended `MinJobAge` ago. A target
        neither knows, or that accounting cannot answer for now, is left out (still held, as far as we know)."""
        jobs = self.jobs()
        out: dict[str, SlurmJob] = {}
        missing: list[str] = []
        for target in dict.fromkeys(targets):
            job = self._find(target, jobs)
            if job is None:
                missing.append(target)
            elif not job.pending:
                out[target] = job
        if not missing:
            return out
        try:
            records = self._sacct(missing)
        except ProviderError:
            return out
        for record in records:
            if record.target in missing and self._state(record).terminal:
                seen = out.get(record.target)
                if seen is None or (record.submit_time or _EPOCH) >= (seen.submit_time or _EPOCH):
                    out[record.target] = record
        return out

    def priority_plugin(self) -> str:
        """The cluster's PriorityType (`scontrol show config`, asked once), unless given to the constructor."""
        if self.priority_type is None:
            self.priority_type = self.transport.priority_type()
        return self.priority_type

    def requeue(self, job_id: int | str) -> None:
        """Put a running job back in the queue (`scontrol requeue`; Slurm delays its restart by a BeginTime)."""
        job = self._find(job_id)
        if job is None:
            raise NotFound(f"no job {job_id} on {self.name}", provider=self.name)
        with self._changing():
            self.transport.requeue(job.target)

    # ---- helpers ------------------------------------------------------------------------------------------

    def _find(self, target: int | str, jobs: Sequence[SlurmJob] | None = None) -> SlurmJob | None:
        """The job or array task `target` names (`123` or `123_4`): a task still inside a pending array record
        is returned as a view of that record for that one task."""
        m = _TARGET_RE.match(str(target))
        if m is None:
            return None
        jobs = self.squeue() if jobs is None else jobs
        if m.group(2) is None:
            wanted = int(m.group(1))
            return next((j for j in jobs if j.job_id == wanted), None)
        array, task = int(m.group(1)), int(m.group(2))
        for j in jobs:
            if j.array_job_id == array and j.array_task_id == task:
                return j
        for j in jobs:
            if j.array_job_id == array and j.array_task_id is None and task in j.array_task_ids:
                return replace(j, array_task_id=task, array_task_string="", array_tasks=1)
        return None

    def _queued(self, d: QueueDemand) -> list[QueuedJob]:
        note = hold_note(d.job.comment) if d.reason.startswith("JobHeld") else None
        held_by = note.get("broker") if note else None
        if held_by == self.broker_id and not self.holds(d.job):
            held_by = None  # a mark this broker did not sign
        tasks = d.job.array_task_ids
        per_task = max(1, d.gpus // len(tasks)) if tasks else d.gpus
        views = [replace(d.job, array_task_id=t, array_task_string="", array_tasks=1) for t in tasks]
        return [
            QueuedJob(
                job=view,
                accelerator=d.accelerator,
                gpus=per_task,
                reason=d.reason,
                burstable=d.burstable and d.job.het_job_id is None,  # one component alone is not the job
                held_by=held_by,
                hold_reason=note.get("reason", "") if note else "",
                target=view.target,
            )
            for view in (views[:MAX_TASKS_PER_RECORD] if tasks else [d.job])
        ]

    def _mark(self, target: str, reason: str) -> str:
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        fields = f"broker={self.broker_id} at={at} reason={quote(reason, safe='')}"
        if self.hold_key:
            fields += f" sig={self._sign(target, at)}"
        return f"[{HOLD_MARK} {fields}]"

    def _sign(self, target: str, at: str) -> str:
        msg = f"{self.broker_id}|{target}|{at}".encode()
        return hmac.new(self.hold_key, msg, hashlib.sha256).hexdigest()[:32]

    def _set_comment(self, target: str, comment: str) -> None:
        with self._changing():
            self.transport.update_job(target, comment=comment)

    def _undo_hold(self, target: str, job: SlurmJob | None) -> None:
        """After a hold that lost the race: clear our hold (a running job keeps running; a requeue would otherwise
        bring it back held) and our mark. Best effort: a job that has ended accepts neither."""
        if job is None:
            return
        if job.state_reason == HELD_BY_ADMIN and self.holds(job):
            with self._changing(), suppress(ProviderError):
                self.transport.release(target)
        if hold_note(job.comment) is not None and not self._state(job).terminal:
            with self._changing(), suppress(ProviderError):
                self.transport.update_job(target, comment=strip_hold_mark(job.comment))

    def _rewrite_dependents(
        self,
        jobs: Sequence[SlurmJob],
        targets: Sequence[str],
        skip: frozenset[str] = frozenset(),
        convert_notok: bool = True,
    ) -> list[str]:
        out: list[str] = []
        for dep in jobs:
            if not dep.pending or not dep.dependency or dep.target in skip:
                continue
            text, changed = dep.dependency, False
            for target in targets:
                if not mentions(text, target):
                    continue
                try:
                    new = rewrite_as_succeeded(
                        text, target, self._other_tasks(jobs, target), convert_notok=convert_notok
                    )
                except DependencyParseError:
                    new = None
                if new is not None:
                    text, changed = new, True
            if changed:
                with self._changing():
                    self.transport.update_job(dep.target, dependency=text)
                out.append(dep.target)
        return out

    def _other_tasks(self, jobs: Sequence[SlurmJob], target: str) -> list[str]:
        array, sep, task = target.partition("_")
        if not sep:
            return []
        ids: set[int] = set()
        for j in jobs:
            if j.array_job_id == int(array):
                ids.update([j.array_task_id] if j.array_task_id is not None else j.array_task_ids)
        ids.discard(int(task))
        return [f"{array}_{t}" for t in sorted(ids)]

    def _partition_for(self, offering: Offering) -> tuple[str, PartitionInfo]:
        info = self.partitions.get(offering.zone)
        if offering.provider != self.name or offering.capacity_type is not CapacityType.ON_PREM or info is None:
            raise InvalidRequest(f"{self.name} does not offer {offering.key}", provider=self.name)
        n = offering.accelerator_count
        if canonical(offering.accelerator) != canonical(info.accelerator) or not 0 < n <= info.gpus_per_node:
            raise InvalidRequest(f"{self.name} has no {offering.instance_type} on {offering.zone}", provider=self.name)
        return offering.zone, info

    def _comment(self, request: LaunchRequest) -> str:
        tags = request.tags
        parts = [f"{self._prefix}{request.launch_token}", f"job={quote(tags.job_id, safe='')}"]
        parts.append(f"placement={quote(tags.placement_id, safe='')}")
        parts += [f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(tags.extra.items())]
        return " ".join(parts)

    def _by_token(self, jobs: Sequence[SlurmJob], token: str) -> list[SlurmJob]:
        head = f"{self._prefix}{token}"
        found = [j for j in jobs if j.comment == head or j.comment.startswith(head + " ")]
        return sorted(found, key=lambda j: j.job_id)

    def _ours(self, instance_id: str, jobs: Sequence[SlurmJob]) -> SlurmJob | None:
        if not instance_id.isdigit():
            return None
        wanted = int(instance_id)
        return next((j for j in jobs if j.job_id == wanted and j.comment.startswith(self._prefix)), None)

    def _state(self, job: SlurmJob) -> InstanceState:
        outcome = classify(job)
        if outcome is not None:
            return _OUTCOME_STATES[outcome]
        return _STATES.get(job.state, InstanceState.RUNNING if job.holds_resources else InstanceState.PENDING)

    def _instance(self, job: SlurmJob) -> Instance:
        token, tags = self._parse_comment(job.comment)
        state = self._state(job)
        part = job.partitions[0] if job.partitions else ""
        info = self.partitions.get(part)
        acc = canonical(info.accelerator) if info else canonical(next(iter(job.gpus), "") or "gpu")
        key = offering_key(self.name, self.region, part, self.instance_type(acc, job.gpu_count), CapacityType.ON_PREM)
        started = job.start_time if state is not InstanceState.PENDING else None
        outcome = classify(job)
        detail = describe_ending(job) if outcome is not None else job.state.lower()
        if job.state_reason:
            detail += f": {job.state_reason}"
        if state is InstanceState.PENDING and job.start_time is not None:
            detail += f", estimated start {job.start_time.isoformat()}"
        return Instance(
            id=str(job.job_id),
            provider=self.name,
            offering_key=key,
            launch_token=token,
            state=state,
            tags=tags,
            launched_at=job.submit_time or datetime.now(UTC),
            started_at=started,
            ended_at=job.end_time if state.terminal else None,
            checkpointed_work_hours=None,
            detail=detail,
            outcome=outcome,
        )

    def _parse_comment(self, comment: str) -> tuple[str, dict[str, str]]:
        """(launch token, tags) from `overspill:<broker>:<token> job=.. placement=.. k=v`."""
        head, *pairs = comment.split(" ")
        token = head[len(self._prefix) :] if head.startswith(self._prefix) else ""
        values = {unquote(k): unquote(v) for k, _, v in (p.partition("=") for p in pairs if "=" in p)}
        tags = {BROKER_TAG: self.broker_id}
        tags[JOB_TAG] = values.pop("job", "")
        tags[PLACEMENT_TAG] = values.pop("placement", "")
        tags.update(values)
        return token, tags


def hold_note(comment: str) -> dict[str, str] | None:
    """The fields of the `[overspill-hold broker=.. at=.. reason=.. sig=..]` mark in a job's Comment, if any."""
    found = _HOLD_RE.search(comment or "")
    if found is None:
        return None
    body = found.group(0).strip()[len(HOLD_MARK) + 2 : -1]
    return {k: unquote(v) for k, _, v in (p.partition("=") for p in body.split(" ") if "=" in p)}


def strip_hold_mark(comment: str) -> str:
    """A Comment without any hold mark (the user's own text, e.g. their `overspill-burst {...}` opt-in)."""
    return _HOLD_RE.sub("", comment or "").strip()


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
