"""A simulated on-prem GPU cluster: a FIFO queue with EASY backfill shared by other users and the broker.

Contract: `SimulatedOnPremCluster` implements `ComputeProvider`, `OfferingSource` and `QueuePressureSource`
(see `providers.base`) as provider "onprem", region "onprem", one zone. Each accelerator is a separate pool of
nodes of 8 GPUs; a job needs at most 8 GPUs, all on one node. The queue holds a deterministic background workload
of other users' jobs (Poisson arrivals, busier in the working day, 1-8 GPUs, 0.5-12 h lognormal durations, all
drawn from blake2b hashes of the seed) plus the broker's jobs (store records, in launch order).

The schedule is a pure function of the seed, the store's records and time, so every process computes the same
one: an event-driven simulation from a history start (48 h before the day of the oldest record launched in the
last `history_hours`, or of now) over arrivals up to the end of the current hour. It is causal - a decision at
time t uses only jobs submitted by t, running jobs' walltimes and cancellations made by t - so later submissions
never rewrite the past. EASY backfill: the queue head starts as soon as it fits; when it does not, it gets a
reservation at the earliest time enough GPUs free up on one node, and a later job may start now only if it fits
now and cannot delay that reservation (it runs on another node, ends before the reservation, or uses GPUs the
head will not need). Results are cached per (history start, hour, records and their terminations).

`launch` never raises for lack of capacity: the job queues (PENDING) until the schedule starts it, then runs
for its remaining work (SUCCEEDED). `terminate` cancels: a queued job leaves the queue, a running one frees its
GPUs. `offerings(now)` prices each accelerator at 1, 2, 4 and 8 GPUs at the internal rate, with
`expected_wait_hours` = when a job of that size submitted now would start; `pressure(now)` samples each pool.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from providers.accelerators import memory_gib
from providers.base import Instance, InstanceState, InvalidRequest, LaunchRequest, NotFound
from providers.model import CapacityType, Offering, PressureSample, Price, offering_key
from providers.simulated.market import (
    PRICE_QUANTUM,
    UNIX_EPOCH,
    checkpointed,
    hour_bucket,
    stable_hex,
    stable_unit,
    utc,
)
from providers.simulated.store import SimRecord, SimStore

Clock = Callable[[], datetime]

NODE_GPUS = 8
GPU_SIZES = (1, 2, 4, 8)
_SIZE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
US_PER_HOUR = 3_600_000_000
_DAY_US = 24 * US_PER_HOUR
_LOOKBACK_US = 48 * US_PER_HOUR
_NODE_SHAPE = {"A100": (16, 128), "A100-80GB": (16, 128), "H100": (24, 256), "V100": (10, 64)}  # per GPU


def to_us(at: datetime) -> int:
    """Microseconds since the Unix epoch (exact integer time for the scheduler)."""
    delta = utc(at) - UNIX_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    return UNIX_EPOCH + timedelta(microseconds=us)


@dataclass(slots=True)
class Job:
    """One queued job: `order` is its FIFO position; `walltime` its exact run length; times in microseconds."""

    id: str
    arrival: int
    order: tuple[int, int, int]
    gpus: int
    walltime: int
    cancel_at: int | None = None


@dataclass(frozen=True, slots=True)
class Slot:
    """Where and when a job ran: `start` is None when it was cancelled before starting; `end` is actual."""

    start: int | None
    end: int | None
    node: int | None


def schedule(
    nodes: Sequence[int],
    jobs: Sequence[Job],
    running: Sequence[tuple[Job, int, int]] = (),
    until_started: str | None = None,
) -> dict[str, Slot]:
    """FIFO + EASY backfill over `nodes` (GPUs per node). `running` are (job, node, start) already placed.

    Runs until every job has ended (or `until_started` has started) and returns each job's slot.
    """
    free = list(nodes)
    on_node: list[dict[str, tuple[int, int]]] = [{} for _ in nodes]  # job id -> (walltime end, gpus)
    status: dict[str, str] = {}
    slots: dict[str, Slot] = {}
    events: list[tuple[int, int, int, Job]] = []  # (time, 0 end | 1 cancel | 2 arrival, seq, job)
    queue: list[Job] = []
    seq = 0

    def push(at: int, kind: int, job: Job) -> None:
        nonlocal seq
        heapq.heappush(events, (at, kind, seq, job))
        seq += 1

    def start(job: Job, node: int, at: int) -> None:
        free[node] -= job.gpus
        on_node[node][job.id] = (at + job.walltime, job.gpus)
        status[job.id] = "running"
        slots[job.id] = Slot(at, at + job.walltime, node)
        push(at + job.walltime, 0, job)

    def release(job: Job, at: int) -> None:
        slot = slots[job.id]
        assert slot.node is not None
        free[slot.node] += job.gpus
        del on_node[slot.node][job.id]
        status[job.id] = "done"
        slots[job.id] = Slot(slot.start, at, slot.node)

    def best_fit(gpus: int, exclude: int = -1) -> int | None:
        fits = [(free[i], i) for i in range(len(free)) if i != exclude and free[i] >= gpus]
        return min(fits)[1] if fits else None

    def reservation(gpus: int) -> tuple[int, int, int]:
        """(shadow time, node, spare GPUs at that time) for the queue head."""
        best: tuple[int, int, int] | None = None
        for i, size in enumerate(nodes):
            if size < gpus:
                continue
            avail, when = free[i], -1
            for end, used in sorted(on_node[i].values()):
                avail += used
                if avail >= gpus:
                    when = end
                    break
            if when >= 0 and (best is None or when < best[0]):
                best = (when, i, avail - gpus)
        assert best is not None, "a queued job larger than every node"
        return best

    def pass_at(now: int) -> None:
        while queue:
            node = best_fit(queue[0].gpus)
            if node is None:
                break
            start(queue.pop(0), node, now)
        if not queue or max(free) == 0:
            return
        shadow, rnode, spare = reservation(queue[0].gpus)
        for job in list(queue[1:]):
            most = max(free)
            if most == 0:
                break
            if job.gpus > most:
                continue
            node = best_fit(job.gpus, exclude=rnode)
            if node is None:
                ends_in_time = now + job.walltime <= shadow
                if free[rnode] < job.gpus or not (ends_in_time or job.gpus <= spare):
                    continue
                node = rnode
                if not ends_in_time:
                    spare -= job.gpus
            queue.remove(job)
            start(job, node, now)

    for job, node, at in running:
        start(job, node, at)
        if job.cancel_at is not None:
            push(job.cancel_at, 1, job)
    for job in jobs:
        status[job.id] = "waiting"
        push(job.arrival, 2, job)
        if job.cancel_at is not None:
            push(job.cancel_at, 1, job)
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, job = heapq.heappop(events)
            state = status[job.id]
            if kind in (0, 1) and state == "running":
                release(job, now)
            elif kind == 1 and state in ("queued", "waiting"):
                if state == "queued":
                    queue.remove(job)
                status[job.id] = "cancelled"
                slots[job.id] = Slot(None, None, None)
            elif kind == 2 and state == "waiting":
                status[job.id] = "queued"
                bisect.insort(queue, job, key=lambda j: j.order)
        pass_at(now)
        if until_started is not None and until_started in slots:
            break
    return slots


@dataclass(frozen=True, slots=True)
class _Plan:
    jobs: dict[str, list[Job]]  # accelerator -> jobs
    slots: dict[str, dict[str, Slot]]  # accelerator -> job id -> slot


class SimulatedOnPremCluster:
    """A simulated on-prem GPU cluster (see the module docstring for the contract)."""

    def __init__(
        self,
        *,
        seed: int,
        clock: Clock,
        store: SimStore,
        broker_id: str,
        gpus: dict[str, int] | None = None,
        rate_usd_per_gpu_hour: dict[str, Decimal] | None = None,
        background_jobs_per_hour: float = 6.0,
        history_hours: float = 168.0,
        name: str = "onprem",
        zone: str = "dc1",
    ) -> None:
        self.name = name
        self.region = "onprem"
        self.zone = zone
        self.seed = seed
        self.clock = clock
        self.store = store
        self.broker_id = broker_id
        self.gpus = dict(gpus if gpus is not None else {"A100": 32, "V100": 16})
        if not self.gpus or min(self.gpus.values()) <= 0:
            raise ValueError("every accelerator needs a positive GPU count")
        rates = rate_usd_per_gpu_hour or {"A100": Decimal("1.10"), "V100": Decimal("0.45")}
        self.rates = {acc: Decimal(rates.get(acc, Decimal("1.00"))) for acc in self.gpus}
        self.background_jobs_per_hour = background_jobs_per_hour
        self.history_us = int(history_hours * US_PER_HOUR)
        self.nodes = {
            acc: [NODE_GPUS] * (n // NODE_GPUS) + ([n % NODE_GPUS] if n % NODE_GPUS else [])
            for acc, n in self.gpus.items()
        }
        self._accs = sorted(self.gpus)
        self._bg: dict[int, list[tuple[str, Job]]] = {}
        self._plan_cache: dict[tuple[Any, ...], _Plan] = {}
        self._lock = threading.Lock()

    # ---- workload and schedule ----------------------------------------------------------------------------

    def background_hour(self, hour: int) -> list[tuple[str, Job]]:
        """Other users' jobs arriving in one hour (hours since the Unix epoch), as (accelerator, job)."""
        cached = self._bg.get(hour)
        if cached is not None:
            return cached
        diurnal = 1.0 + 0.45 * math.sin(2 * math.pi * ((hour % 24) - 8) / 24)  # busiest at 14:00 UTC
        lam = self.background_jobs_per_hour * diurnal
        count, p, draw = 0, math.exp(-lam), stable_unit(self.seed, "bg-n", hour)
        cdf = p
        while draw > cdf and count < 1000:
            count += 1
            p *= lam / count
            cdf += p
        total = sum(self.gpus.values())
        out: list[tuple[str, Job]] = []
        for i in range(count):
            u = [stable_unit(self.seed, "bg", hour, i, part) for part in range(5)]
            arrival = hour * US_PER_HOUR + int(u[0] * US_PER_HOUR)
            pick, acc = u[1] * total, self._accs[-1]
            for name in self._accs:
                if pick < self.gpus[name]:
                    acc = name
                    break
                pick -= self.gpus[name]
            size, acc_w = GPU_SIZES[-1], 0.0
            for gpus, weight in zip(GPU_SIZES, _SIZE_WEIGHTS, strict=True):
                acc_w += weight
                if u[2] < acc_w:
                    size = gpus
                    break
            size = min(size, max(self.nodes[acc]))
            z = math.sqrt(-2.0 * math.log(1.0 - u[3])) * math.cos(2.0 * math.pi * u[4])
            hours = min(12.0, max(0.5, 1.8 * math.exp(0.9 * z)))
            job = Job(f"bg-{hour}-{i}", arrival, (arrival, 0, i), size, int(hours * US_PER_HOUR))
            out.append((acc, job))
        self._bg[hour] = out
        if len(self._bg) > 4096:
            self._bg.clear()
        return out

    def _plan(self, now: datetime, records: list[SimRecord] | None = None) -> _Plan:
        now_us = to_us(now)
        records = self.store.list(self.name) if records is None else records
        launches = [to_us(r.launched_at) for r in records]
        recent = [at for at in launches if at >= now_us - self.history_us]
        epoch = (min([now_us, *recent]) // _DAY_US) * _DAY_US - _LOOKBACK_US
        horizon_hour = max([hour_bucket(now), *(at // US_PER_HOUR for at in launches)]) + 1
        key = (epoch, horizon_hour, tuple((r.instance_id, r.terminated_at) for r in records))
        with self._lock:
            cached = self._plan_cache.get(key)
        if cached is not None:
            return cached
        jobs: dict[str, list[Job]] = {acc: [] for acc in self._accs}
        for hour in range(epoch // US_PER_HOUR, horizon_hour):
            for acc, job in self.background_hour(hour):
                jobs[acc].append(job)
        for index, (rec, launched) in enumerate(zip(records, launches, strict=True)):
            acc, gpus = rec.data.get("accelerator", ""), int(rec.data.get("gpus", 0))
            if launched < epoch or acc not in jobs or not 0 < gpus <= max(self.nodes[acc]):
                continue  # outside the simulated history, or a pool this configuration does not have
            walltime = int(Decimal(rec.data["remaining_work_hours"]) * US_PER_HOUR)
            cancel = to_us(rec.terminated_at) if rec.terminated_at is not None else None
            jobs[acc].append(Job(rec.instance_id, launched, (launched, 1, index), gpus, walltime, cancel))
        plan = _Plan(jobs, {acc: schedule(self.nodes[acc], jobs[acc]) for acc in self._accs})
        with self._lock:
            if len(self._plan_cache) >= 4:
                self._plan_cache.pop(next(iter(self._plan_cache)))
            self._plan_cache[key] = plan
        return plan

    def _snapshot(self, plan: _Plan, acc: str, now_us: int) -> tuple[list[tuple[Job, int, int]], list[Job]]:
        """Running (job, node, start) and queued jobs (FIFO order) of one pool at `now_us`."""
        running: list[tuple[Job, int, int]] = []
        queued: list[Job] = []
        slots = plan.slots[acc]
        for job in plan.jobs[acc]:
            if job.arrival > now_us or (job.cancel_at is not None and job.cancel_at <= now_us):
                continue
            slot = slots[job.id]
            if slot.start is not None and slot.start <= now_us:
                if slot.end is not None and slot.end > now_us and slot.node is not None:
                    running.append((job, slot.node, slot.start))
            else:
                queued.append(job)
        queued.sort(key=lambda j: j.order)
        return running, queued

    def expected_wait_hours(self, accelerator: str, gpus: int, now: datetime, work_hours: float | None = None) -> float:
        """Hours until a job of `gpus` GPUs submitted at `now` would start under the current schedule.

        Without `work_hours` the job is assumed too long to backfill into a gap before the queue head's
        reservation (the conservative answer, as offerings do not know the job).
        """
        if accelerator not in self.nodes or not 0 < gpus <= max(self.nodes[accelerator]):
            raise ValueError(f"{self.name} cannot run {gpus} x {accelerator} on one node")
        now_us = to_us(now)
        running, queued = self._snapshot(self._plan(now), accelerator, now_us)
        walltime = int((work_hours if work_hours is not None else 10_000.0) * US_PER_HOUR)
        probe = Job("probe", now_us, (now_us, 9, 0), gpus, walltime)
        waiting = [replace(j, arrival=now_us) for j in queued]
        slot = schedule(self.nodes[accelerator], [*waiting, probe], running, until_started="probe")["probe"]
        assert slot.start is not None
        return round((slot.start - now_us) / US_PER_HOUR, 4)

    # ---- feeds --------------------------------------------------------------------------------------------

    def instance_type(self, accelerator: str, gpus: int) -> str:
        return f"onprem-{accelerator.lower()}-{gpus}gpu"

    def offerings(self, now: datetime) -> list[Offering]:
        now = utc(now)
        out: list[Offering] = []
        for acc in self._accs:
            vcpus, mem = _NODE_SHAPE.get(acc, (12, 96))
            for n in GPU_SIZES:
                if n > max(self.nodes[acc]):
                    continue
                price = Price((self.rates[acc] * n).quantize(PRICE_QUANTUM), "internal-rate", now, False)
                out.append(
                    Offering(
                        provider=self.name,
                        region=self.region,
                        zone=self.zone,
                        instance_type=self.instance_type(acc, n),
                        accelerator=acc,
                        accelerator_count=n,
                        gpu_memory_gib=memory_gib(acc),
                        vcpus=vcpus * n,
                        memory_gib=Decimal(mem * n),
                        capacity_type=CapacityType.ON_PREM,
                        price=price,
                        expected_wait_hours=self.expected_wait_hours(acc, n, now),
                        simulated=True,
                    )
                )
        return out

    def pressure(self, now: datetime) -> list[PressureSample]:
        now = utc(now)
        now_us, plan = to_us(now), self._plan(now)
        samples = []
        for acc in self._accs:
            running, queued = self._snapshot(plan, acc, now_us)
            used = sum(job.gpus for job, _, _ in running)
            samples.append(
                PressureSample(
                    accelerator=acc,
                    total_gpus=self.gpus[acc],
                    free_gpus=self.gpus[acc] - used,
                    pending_jobs=len(queued),
                    pending_gpus=sum(j.gpus for j in queued),
                    expected_wait_hours=self.expected_wait_hours(acc, 1, now),
                    observed_at=now,
                )
            )
        return samples

    # ---- instances ----------------------------------------------------------------------------------------

    def instance_id(self, launch_token: str) -> str:
        return "job-" + stable_hex(self.name, launch_token)

    def launch(self, request: LaunchRequest) -> Instance:
        now = utc(self.clock())
        iid = self.instance_id(request.launch_token)
        existing = self.store.get(self.name, iid)
        if existing is not None and existing.launch_token == request.launch_token:
            return self._instance(existing, now, self._plan(now))
        off = request.offering
        acc, n = off.accelerator, off.accelerator_count
        if off.provider != self.name or off.capacity_type is not CapacityType.ON_PREM or acc not in self.gpus:
            raise InvalidRequest(f"{self.name} does not offer {off.key}", provider=self.name)
        if off.instance_type != self.instance_type(acc, n) or not 0 < n <= max(self.nodes[acc]):
            raise InvalidRequest(f"{self.name} has no {off.instance_type} shape", provider=self.name)
        if request.remaining_work_hours < 0:
            raise InvalidRequest("remaining_work_hours must not be negative", provider=self.name)
        key = offering_key(self.name, self.region, self.zone, off.instance_type, CapacityType.ON_PREM)
        data: dict[str, Any] = {
            "offering_key": key,
            "accelerator": acc,
            "gpus": n,
            "hourly_usd": str((self.rates[acc] * n).quantize(PRICE_QUANTUM)),
            "remaining_work_hours": str(request.remaining_work_hours),
            "checkpoint_interval_hours": str(request.checkpoint_interval_hours),
            "resume_from": request.resume_from,
            "tags": request.tags.as_dict(),
        }
        won = self.store.insert_if_absent(SimRecord(self.name, request.launch_token, iid, key, now, data))
        return self._instance(won, now, self._plan(now))

    def get(self, instance_id: str) -> Instance:
        rec = self.store.get(self.name, instance_id)
        if rec is None:
            raise NotFound(f"no job {instance_id} on {self.name}", provider=self.name)
        now = utc(self.clock())
        return self._instance(rec, now, self._plan(now))

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        """One schedule replay for all of them (`get` replays it per call)."""
        records = self.store.get_many(self.name, instance_ids)
        if not records:
            return {}
        now = utc(self.clock())
        plan = self._plan(now)
        return {rec.instance_id: self._instance(rec, now, plan) for rec in records}

    def terminate(self, instance_id: str) -> None:
        rec = self.store.get(self.name, instance_id)
        if rec is None:
            return
        now = utc(self.clock())
        if not self._instance(rec, now, self._plan(now)).state.terminal:
            self.store.mark_terminated(self.name, instance_id, now)

    def list_instances(self) -> list[Instance]:
        now = utc(self.clock())
        records = self.store.list(self.name)
        plan = self._plan(now, records)
        return [
            self._instance(rec, now, plan)
            for rec in records
            if rec.data.get("tags", {}).get("overspill:broker") == self.broker_id
        ]

    def _instance(self, rec: SimRecord, now: datetime, plan: _Plan) -> Instance:
        data, now_us = rec.data, to_us(now)
        work = Decimal(data["remaining_work_hours"])
        wall = int(work * US_PER_HOUR)
        cancel = to_us(rec.terminated_at) if rec.terminated_at is not None else None
        slot = plan.slots.get(data.get("accelerator", ""), {}).get(rec.instance_id)
        if slot is None:  # launched before the simulated history: report it as run straight away
            launched = to_us(rec.launched_at)
            slot = Slot(launched, min(launched + wall, cancel if cancel is not None else launched + wall), None)
        start, end = slot.start, slot.end
        if start is None or end is None:  # cancelled while queued
            ended = cancel if cancel is not None and cancel <= now_us else None
            state = InstanceState.PENDING if ended is None else InstanceState.TERMINATED
        elif now_us < start:
            state, ended = InstanceState.PENDING, None
        elif now_us < end:
            state, ended = InstanceState.RUNNING, None
        else:
            finished = cancel is None or cancel >= start + wall
            state, ended = (InstanceState.SUCCEEDED if finished else InstanceState.TERMINATED), end
        started_at = from_us(start) if start is not None and start <= now_us else None
        run_until = from_us(min(now_us, end)) if end is not None else now
        return Instance(
            id=rec.instance_id,
            provider=self.name,
            offering_key=rec.offering_key,
            launch_token=rec.launch_token,
            state=state,
            tags=dict(data.get("tags", {})),
            launched_at=utc(rec.launched_at),
            started_at=started_at,
            ended_at=from_us(ended) if ended is not None else None,
            checkpointed_work_hours=checkpointed(
                work, Decimal(data["checkpoint_interval_hours"]), started_at or now, run_until, state
            ),
            detail={InstanceState.PENDING: "queued", InstanceState.TERMINATED: "cancelled"}.get(state, ""),
        )
