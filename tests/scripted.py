"""A scripted cloud for loop scenarios: the test sets prices, capacity and preemptions by hand.

It honours the provider contract (idempotent launch on the token, converging terminate, tagged list), so the
broker's loop is exercised exactly as with a real provider; only the market is under the test's control.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from fastapi.testclient import TestClient

from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from providers.base import (
    Instance,
    InstanceState,
    InsufficientCapacity,
    InterruptionNotice,
    InvalidRequest,
    LaunchRequest,
    NotFound,
)
from providers.model import CapacityType, Offering, Price, hours_between


@dataclass
class _Vm:
    instance: Instance
    work_hours: Decimal
    interval: Decimal


class ScriptedCloud:
    def __init__(
        self,
        name: str,
        clock: Callable[[], datetime],
        zones: tuple[str, ...] = ("z1", "z2"),
        region: str = "r1",
        capacity: CapacityType = CapacityType.SPOT,
    ) -> None:
        self.name = name
        self.region = region
        self.capacity = capacity  # SPOT: a cloud; ON_PREM: an on-prem cluster whose queue wait the test sets
        self.wait_hours = 0.0  # the expected queue wait its offerings report
        self.slow_start: set[str] = set()  # zones whose instances stay pending until the test starts them
        self.requests: list[LaunchRequest] = []  # every launch asked of this cloud, in order
        self.clock = clock
        self.zones = zones
        self.prices: dict[str, Decimal] = {z: Decimal("10") for z in zones}
        self.on_demand: dict[str, Decimal] = {}  # zones that also offer on-demand capacity, at these prices
        self.no_capacity: set[str] = set()
        self.invalid: set[str] = set()  # zones that refuse every launch request as invalid
        self.remembers_tokens = True  # False: a repeated launch token starts another instance (an expired token)
        self.vms: dict[str, _Vm] = {}
        self.launch_calls = 0
        self.notices: list[InterruptionNotice] = []

    def offerings(self, now: datetime) -> list[Offering]:
        return [
            Offering(
                provider=self.name,
                region=self.region,
                zone=z,
                instance_type="gpu.1",
                accelerator="A100",
                accelerator_count=1,
                gpu_memory_gib=40,
                vcpus=8,
                memory_gib=Decimal("64"),
                capacity_type=self.capacity,
                price=Price(self.prices[z], "scripted", now),
                interruption_rate_per_hour=0.0,
                expected_wait_hours=self.wait_hours,
            )
            for z in self.zones
        ] + [
            Offering(
                provider=self.name,
                region=self.region,
                zone=z,
                instance_type="gpu.1",
                accelerator="A100",
                accelerator_count=1,
                gpu_memory_gib=40,
                vcpus=8,
                memory_gib=Decimal("64"),
                capacity_type=CapacityType.ON_DEMAND,
                price=Price(price, "scripted", now),
            )
            for z, price in self.on_demand.items()
        ]

    def launch(self, request: LaunchRequest) -> Instance:
        self.launch_calls += 1
        self.requests.append(request)
        for vm in self.vms.values():
            if self.remembers_tokens and vm.instance.launch_token == request.launch_token:
                return vm.instance
        if request.offering.zone in self.no_capacity:
            raise InsufficientCapacity(f"no capacity in {request.offering.zone}", provider=self.name)
        if request.offering.zone in self.invalid:
            raise InvalidRequest(f"{request.offering.instance_type} is not supported here", provider=self.name)
        now = self.clock()
        pending = request.offering.zone in self.slow_start
        inst = Instance(
            id=f"vm-{len(self.vms) + 1}",
            provider=self.name,
            offering_key=request.offering.key,
            launch_token=request.launch_token,
            state=InstanceState.PENDING if pending else InstanceState.RUNNING,
            tags=request.tags.as_dict(),
            launched_at=now,
            started_at=None if pending else now,
        )
        self.vms[inst.id] = _Vm(inst, request.remaining_work_hours, request.checkpoint_interval_hours)
        return inst

    def _progress(self, vm: _Vm, end: datetime) -> Decimal:
        if vm.instance.started_at is None:
            return Decimal("0")  # never started: nothing done
        run = hours_between(vm.instance.started_at, end)
        return min(vm.work_hours, (run // vm.interval) * vm.interval)

    def get(self, instance_id: str) -> Instance:
        vm = self.vms.get(instance_id)
        if vm is None:
            raise NotFound(instance_id, provider=self.name)
        inst = vm.instance
        if inst.state is InstanceState.RUNNING:
            assert inst.started_at is not None
            done_at = inst.started_at + timedelta(hours=float(vm.work_hours))
            if self.clock() >= done_at:
                inst = replace(
                    inst, state=InstanceState.SUCCEEDED, ended_at=done_at, checkpointed_work_hours=vm.work_hours
                )
                vm.instance = inst
            else:
                inst = replace(inst, checkpointed_work_hours=self._progress(vm, self.clock()))
        return inst

    def preempt(self, instance_id: str) -> None:
        vm = self.vms[instance_id]
        now = self.clock()
        vm.instance = replace(
            vm.instance, state=InstanceState.PREEMPTED, ended_at=now, checkpointed_work_hours=self._progress(vm, now)
        )

    def terminate(self, instance_id: str) -> None:
        vm = self.vms.get(instance_id)
        if vm is None or vm.instance.state.terminal:
            return
        now = self.clock()
        vm.instance = replace(
            vm.instance, state=InstanceState.TERMINATED, ended_at=now, checkpointed_work_hours=self._progress(vm, now)
        )

    def list_instances(self) -> list[Instance]:
        return [self.get(i) for i in self.vms]

    def warn(self, instance_id: str, minutes: float = 2) -> None:
        """Queue a spot interruption notice, as AWS's EventBridge warning would deliver it."""
        now = self.clock()
        self.notices.append(
            InterruptionNotice(instance_id, self.name, "interruption", now, now + timedelta(minutes=minutes))
        )

    def poll_interruptions(self) -> list[InterruptionNotice]:
        out, self.notices = self.notices, []
        return out

    def running(self) -> list[Instance]:
        return [self.get(i) for i in self.vms if self.get(i).state is InstanceState.RUNNING]


def attach(rt: Runtime, *clouds: ScriptedCloud) -> Runtime:
    """Make `clouds` providers and price sources of `rt` (tests build runtimes with `simulated=False`)."""
    for cloud in clouds:
        rt.providers[cloud.name] = cloud
        rt.offering_sources.append(cloud)
    return rt


def admin_api(rt: Runtime) -> TestClient:
    """A test client on `rt`'s app, signed in with the development admin key."""
    client = TestClient(create_app(runtime=rt))
    client.headers["Authorization"] = f"Bearer {DEV_API_KEY}"
    return client
