"""The local pool: this machine (and any host the operator names over SSH) as an on-prem pool whose attempts run
under the real instance agent, booted exactly as a cloud instance boots it.

A first-class provider (`providers.base`): `launch` / `terminate` / `get` / `get_many` / `list_instances` /
`offerings`, with these specifics:
- Pools: one per host and size, `local/<host>/<host>/<accelerator>-<n>` (region and zone are the host's name),
  on-prem capacity at the configured hourly rate per slot (0 by default), available while the host has `n` free
  slots. A host's slots are its GPUs (`nvidia-smi -L` for this machine, declared for an SSH host), else CPU slots
  (accelerator `CPU`; the agent is then told the attempt uses no GPU: `provides_gpus` is False).
- Launch: the broker renders the start-up script with this pool's root for the placement (`agent_root`, never as
  a systemd unit: `agent_systemd = False`) and the pool runs it on the host with `sh` (`providers.local.scripts`),
  beside a per-instance metadata endpoint that speaks EC2's IMDSv2 (`providers.local.imds`): the agent watches spot
  notices as on EC2 (`notice_source = "aws"`). The instance id is `<host>/<placement id>`, its directory
  `<root>/<placement id>`: a second launch of the same placement finds the directory and starts nothing (idempotent
  on the launch token, which names the placement). A launch with no free slot raises `InsufficientCapacity`; an
  unreachable host raises it too (zone scope: the host is avoided a while).
- State: PENDING until the agent's PID is recorded, RUNNING while that process lives, then SUCCEEDED with
  `ended_at` (the agent exits once its final report is in the mailbox; the verdict is that report's), FAILED with
  `launch_error` when the start-up script failed (both `lingering`: terminate is still due), TERMINATED once
  `terminate` began (released: the host's reaper removes the rest), gone once its directory is.
- `terminate` sends the agent SIGTERM (it saves and reports, as on a shutdown) and, detached on the host, kills
  what is left after `stop_grace_seconds` and removes the directory; it returns at once and converges.
- `inject_notice(instance_id)`: a development drill, an AWS-format spot interruption (`instance-action`,
  `terminate` two minutes ahead) on the instance's metadata endpoint (`overspill notice JOB`).
- A notice here says nothing about the host's reliability: `preemption_blocks_zone = False` (the broker does not
  avoid the host after one).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from providers.base import (
    Instance,
    InstanceState,
    InsufficientCapacity,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    ProviderError,
    Scope,
)
from providers.local import scripts
from providers.local.hosts import Host, HostUnreachable, LocalHost
from providers.model import BROKER_TAG, CapacityType, Offering, Price

log = logging.getLogger(__name__)

NAME = "local"
CPU = "CPU"
STATUS_TTL = 1.0
NOTICE_LEAD = timedelta(minutes=2)  # what EC2 gives a spot instance


class LaunchFailed(ProviderError):
    """The start-up script failed on the host (the agent's wheel could not be fetched, no python3...)."""

    scope = Scope.ZONE
    retryable = True


@dataclass(frozen=True)
class PoolHost:
    """One host of the pool: how to reach it, what it offers and where the pool's instances live on it."""

    host: Host
    root: str
    slots: int
    accelerator: str = CPU
    gpu_memory_gib: int = 0
    vcpus: int = 0
    memory_gib: Decimal = Decimal(0)

    @property
    def name(self) -> str:
        return self.host.name


def local_gpus() -> list[str]:
    """This machine's GPU names from `nvidia-smi -L` (empty without a working driver)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        out = subprocess.run([binary, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.+?) \(UUID", out, re.M)]


def local_memory_gib() -> Decimal:
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
        return Decimal(kib // (1024 * 1024))
    except (OSError, StopIteration, ValueError):
        return Decimal(0)


def this_machine(root: str, *, slots: int | None = None, accelerator: str | None = None) -> PoolHost:
    """This machine as a pool host: its GPUs when `nvidia-smi` lists any (named by `accelerator` when given),
    else `slots` CPU slots (default: the CPUs this process may use)."""
    from providers.accelerators import canonical, memory_gib

    gpus = local_gpus()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if gpus and accelerator != CPU:
        name = accelerator or canonical(_gpu_model(gpus[0]))
        count = min(slots, len(gpus)) if slots else len(gpus)
        return PoolHost(LocalHost(), root, count, name, memory_gib(name), cpus, local_memory_gib())
    return PoolHost(LocalHost(), root, max(1, slots or cpus), CPU, 0, cpus, local_memory_gib())


def _gpu_model(text: str) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `A100-80GB`-ish names `providers.accelerators.canonical` knows."""
    words = text.replace("NVIDIA ", "").replace("Tesla ", "").split()
    return words[0] if words else text


class LocalPool:
    """See the module docstring."""

    name = NAME
    boots_agent = True
    default_runtime = "process"  # the agent runs the command on the host itself unless agent_runtime says podman
    notice_source = "aws"
    agent_systemd = False
    preemption_blocks_zone = False

    def __init__(
        self,
        hosts: Sequence[PoolHost],
        *,
        broker_id: str,
        rate_usd_per_hour: Decimal = Decimal(0),
        stop_grace_seconds: float = 30.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if not hosts:
            raise ValueError("a local pool needs at least one host")
        self.hosts = {h.name: h for h in hosts}
        if len(self.hosts) != len(hosts):
            raise ValueError("local pool host names must be unique")
        self.broker_id = broker_id
        self.rate = Decimal(rate_usd_per_hour)
        self.stop_grace_seconds = stop_grace_seconds
        self.clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._status: dict[str, tuple[float, list[dict[str, object]]]] = {}

    @property
    def provides_gpus(self) -> bool:
        return any(h.accelerator != CPU for h in self.hosts.values())

    # -- where attempts live ---------------------------------------------------------------------------------------

    def agent_root(self, region: str, placement_id: str) -> str:
        """The agent's root on host `region` for this placement (what the start-up script is rendered with)."""
        host = self.hosts.get(region)
        if host is None:
            raise ValueError(f"the local pool has no host {region!r}")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", placement_id):
            raise ValueError(f"placement id {placement_id!r} is not a safe directory name")
        return f"{host.root.rstrip('/')}/{placement_id}"

    def _split(self, instance_id: str) -> tuple[PoolHost, str] | None:
        host_name, _, placement_id = instance_id.partition("/")
        host = self.hosts.get(host_name)
        if host is None or not placement_id or not re.fullmatch(r"[A-Za-z0-9._-]+", placement_id):
            return None
        return host, placement_id

    # -- offerings -------------------------------------------------------------------------------------------------

    def offerings(self, now: datetime) -> list[Offering]:
        out: list[Offering] = []
        for host in self.hosts.values():
            try:
                free = host.slots - self._used(host)
            except HostUnreachable as exc:
                log.warning("local pool host %s: %s", host.name, exc)
                free = 0
            n = 1
            while n <= host.slots:
                out.append(self._offering(host, n, free >= n, now))
                n *= 2
        return out

    def _offering(self, host: PoolHost, n: int, available: bool, now: datetime) -> Offering:
        cpu = host.accelerator == CPU
        return Offering(
            provider=self.name,
            region=host.name,
            zone=host.name,
            instance_type=f"{host.accelerator.lower()}-{n}",
            accelerator=host.accelerator,
            accelerator_count=n,
            gpu_memory_gib=host.gpu_memory_gib,
            vcpus=n if cpu else host.vcpus,
            memory_gib=host.memory_gib,
            capacity_type=CapacityType.ON_PREM,
            price=Price(self.rate * n, "local-pool-rate", now, False),
            available=available,
        )

    def _used(self, host: PoolHost) -> int:
        used = 0
        for row in self._rows(host):
            if row.get("stopping") or row.get("launch_failed") or row.get("ended_at") is not None:
                continue
            try:
                used += max(1, int((row.get("meta") or {}).get("slots", 1)))  # type: ignore[union-attr]
            except (TypeError, ValueError):
                used += 1
        return used

    # -- the provider contract -------------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance:
        offering = request.offering
        host = self.hosts.get(offering.zone)
        if host is None:
            raise InvalidRequest(f"the local pool has no host {offering.zone!r}", provider=self.name)
        if request.user_data is None:
            raise InvalidRequest("a local pool attempt needs the agent's start-up script", provider=self.name)
        instance_id = f"{host.name}/{request.tags.placement_id}"
        root = self.agent_root(host.name, request.tags.placement_id)
        try:
            existing = self._find(host, request.tags.placement_id, fresh=True)
            if existing is not None:
                return self._instance(host, existing)
            if host.slots - self._used(host) < offering.accelerator_count:
                raise InsufficientCapacity(
                    f"host {host.name} has no {offering.accelerator_count} free slots", provider=self.name
                )
            meta = {
                "tags": request.tags.as_dict(),
                "launch_token": request.launch_token,
                "offering_key": offering.key,
                "slots": offering.accelerator_count,
                "launched_at": self.clock().isoformat(),
            }
            done = host.host.sh(scripts.launch_script(root, meta, request.user_data))
        except HostUnreachable as exc:
            raise InsufficientCapacity(str(exc), provider=self.name) from None
        if done.code != 0:
            raise LaunchFailed(f"host {host.name}: launching failed: {done.err.strip()[-500:]}", provider=self.name)
        self._forget(host)
        try:
            return self.get(instance_id)
        except NotFound:
            raise LaunchFailed(f"host {host.name}: the instance did not appear", provider=self.name) from None

    def terminate(self, instance_id: str) -> None:
        found = self._split(instance_id)
        if found is None:
            return
        host, placement_id = found
        try:
            host.host.sh(scripts.stop_script(self.agent_root(host.name, placement_id), self.stop_grace_seconds))
        except HostUnreachable as exc:
            raise InsufficientCapacity(str(exc), provider=self.name) from None
        self._forget(host)

    def get(self, instance_id: str) -> Instance:
        found = self.get_many([instance_id]).get(instance_id)
        if found is None:
            raise NotFound(f"no instance {instance_id}", provider=self.name)
        if isinstance(found, ProviderError):
            raise found
        return found

    def get_many(self, instance_ids: Sequence[str]) -> Mapping[str, Instance | ProviderError]:
        """One status read per host for all the ids on it (fresh: never the offerings' cached view)."""
        out: dict[str, Instance | ProviderError] = {}
        wanted: dict[str, list[tuple[str, str]]] = {}
        for iid in instance_ids:
            found = self._split(iid)
            if found is not None:
                wanted.setdefault(found[0].name, []).append((iid, found[1]))
        for name, ids in wanted.items():
            host = self.hosts[name]
            try:
                rows = {str(r.get("id")): r for r in self._rows(host, fresh=True)}
            except HostUnreachable as exc:
                error = InsufficientCapacity(str(exc), provider=self.name)
                out.update(dict.fromkeys((iid for iid, _ in ids), error))
                continue
            for iid, placement_id in ids:
                row = rows.get(placement_id)
                if row is not None:
                    out[iid] = self._instance(host, row)
        return out

    def list_instances(self) -> list[Instance]:
        out: list[Instance] = []
        for host in self.hosts.values():
            try:
                rows = self._rows(host, fresh=True)
            except HostUnreachable as exc:
                log.warning("local pool host %s: %s", host.name, exc)
                continue
            for row in rows:
                if (row.get("meta") or {}).get("tags", {}).get(BROKER_TAG) == self.broker_id:  # type: ignore[union-attr]
                    out.append(self._instance(host, row))
        return out

    def inject_notice(self, instance_id: str) -> datetime:
        """Deliver an AWS-format spot interruption notice to the instance (a drill); returns its deadline."""
        found = self._split(instance_id)
        if found is None:
            raise NotFound(f"no instance {instance_id}", provider=self.name)
        host, placement_id = found
        deadline = datetime.now(UTC) + NOTICE_LEAD
        body = {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
        try:
            done = host.host.sh(scripts.notice_script(self.agent_root(host.name, placement_id), body))
        except HostUnreachable as exc:
            raise InsufficientCapacity(str(exc), provider=self.name) from None
        if done.code != 0:
            raise NotFound(f"no instance {instance_id}", provider=self.name)
        return deadline

    # -- reading the hosts -----------------------------------------------------------------------------------------

    def _rows(self, host: PoolHost, *, fresh: bool = False) -> list[dict[str, object]]:
        with self._lock:
            held = self._status.get(host.name)
        if held is not None and not fresh and time.monotonic() - held[0] < STATUS_TTL:
            return held[1]
        done = host.host.sh(scripts.status_script(host.root))
        rows = []
        for line in done.out.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("meta"), dict):
                rows.append(row)
        with self._lock:
            self._status[host.name] = (time.monotonic(), rows)
        return rows

    def _forget(self, host: PoolHost) -> None:
        with self._lock:
            self._status.pop(host.name, None)

    def _find(self, host: PoolHost, placement_id: str, *, fresh: bool = False) -> dict[str, object] | None:
        return next((r for r in self._rows(host, fresh=fresh) if r.get("id") == placement_id), None)

    def _instance(self, host: PoolHost, row: dict[str, object]) -> Instance:
        meta: dict[str, object] = row["meta"]  # type: ignore[assignment]
        tags = {str(k): str(v) for k, v in dict(meta.get("tags") or {}).items()}  # type: ignore[call-overload]
        launched = _when(meta.get("launched_at")) or self.clock()
        started = _stamp(row.get("started_at"))
        ended = _stamp(row.get("ended_at"))
        error: ProviderError | None = None
        detail = ""
        if row.get("stopping"):
            state = InstanceState.TERMINATED
        elif row.get("launch_failed"):
            state, detail = InstanceState.FAILED, str(row["launch_failed"])
            error = LaunchFailed(f"host {host.name}: the start-up script failed: {detail}", provider=self.name)
        elif row.get("running"):
            state = InstanceState.RUNNING
        elif started is not None:
            state, detail = InstanceState.SUCCEEDED, "the agent exited"
        else:
            state = InstanceState.PENDING
        return Instance(
            id=f"{host.name}/{row['id']}",
            provider=self.name,
            offering_key=str(meta.get("offering_key", "")),
            launch_token=str(meta.get("launch_token", "")),
            state=state,
            tags=tags,
            launched_at=launched,
            started_at=started,
            ended_at=ended if state.terminal else None,
            detail=detail,
            lingering=state in (InstanceState.SUCCEEDED, InstanceState.FAILED),  # terminate is still due
            launch_error=error,
        )


def _when(value: object) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _stamp(value: object) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if isinstance(value, (int, float)) else None
