"""The one contract test suite every compute provider adapter must pass.

Use it by subclassing `ProviderContract` in an adapter's test module and defining the `env` fixture, which
returns a `ContractEnv`: the adapter under test (built with real SDK clients pointed at a local server), an
offering it can launch, and optional hooks. Every test here then runs against that adapter.

    class TestMyCloudContract(ProviderContract):
        @pytest.fixture
        def env(self, ...) -> ContractEnv:
            return ContractEnv(provider=..., offering=...)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import pytest

from providers.base import (
    ComputeProvider,
    Instance,
    InstanceState,
    InsufficientCapacity,
    LaunchRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    describe,
)
from providers.model import JobSpec, Offering, Tags

BROKER_ID = "overspill-contract"

# what the broker passes as a launch's start-up script (providers.startup); every adapter must deliver it as is
USER_DATA = "#!/bin/sh\n# overspill contract test\nexec python3 -m agent run --spec 's3://b/a b/spec.json'\n"


def contract_spec() -> JobSpec:
    return JobSpec(
        tenant="t",
        team="vision",
        project="atlas",
        name="contract-job",
        image="ghcr.io/example/train:1.0",
        command=("python", "train.py"),
        accelerators=("A100",),
        gpu_count=1,
        max_total_usd=Decimal("100"),
        runtime_hours=Decimal("2"),
        checkpoint_uri="s3://bucket/ckpt/",
    )


@dataclass
class ContractEnv:
    """What the suite needs from an adapter's test module.

    `make_foreign` creates an instance at the provider that the broker did not launch (no broker tags) and
    returns its id, so the suite can check `list_instances` ignores it; leave it None when the provider cannot
    hold foreign instances. `settle` is called before reading state that the provider updates asynchronously.
    `end_by_itself(instance_id)` ends an instance the way a finished job does (the start-up script powers the VM
    off, the simulated work runs out): the instance may then still exist (stopped: `lingering`) or not.
    `refuse_next_launch()` makes the stand-in refuse the next launch for lack of capacity or quota, where the cloud
    says so (at once, or in the operation the launch starts). Leave either None where the stand-in cannot do it.
    """

    provider: ComputeProvider
    offering: Offering
    broker_id: str = BROKER_ID
    make_foreign: Callable[[], str] | None = None
    settle: Callable[[], None] = field(default=lambda: None)
    unknown_id: str = "does-not-exist-0"  # an id shaped like the provider's that it never issued
    end_by_itself: Callable[[str], None] | None = None
    refuse_next_launch: Callable[[], None] | None = None

    def request(self, token: str | None = None) -> LaunchRequest:
        token = token or uuid.uuid4().hex
        return LaunchRequest(
            offering=self.offering,
            launch_token=token,
            tags=Tags(self.broker_id, f"job-{token[:8]}", f"plc-{token[:8]}"),
            spec=contract_spec(),
            remaining_work_hours=Decimal("2"),
            user_data=USER_DATA,
        )


class ProviderContract:
    """Behaviour every adapter guarantees (see providers/base.py). Subclasses provide the `env` fixture."""

    def test_launch_returns_a_tagged_instance(self, env: ContractEnv) -> None:
        req = env.request()
        inst = env.provider.launch(req)
        assert isinstance(inst, Instance) and inst.id
        assert inst.launch_token == req.launch_token
        assert inst.tags.get("overspill:broker") == env.broker_id
        assert inst.tags.get("overspill:job") == req.tags.job_id
        assert inst.tags.get("overspill:placement") == req.tags.placement_id
        assert inst.state in (InstanceState.PENDING, InstanceState.RUNNING)

    def test_launch_is_idempotent_on_the_token(self, env: ContractEnv) -> None:
        req = env.request()
        first = env.provider.launch(req)
        again = env.provider.launch(req)
        assert again.id == first.id
        env.settle()
        ours = [i for i in env.provider.list_instances() if i.launch_token == req.launch_token]
        assert [i.id for i in ours] == [first.id]

    def test_get_reads_back_and_unknown_is_not_found(self, env: ContractEnv) -> None:
        inst = env.provider.launch(env.request())
        env.settle()
        got = env.provider.get(inst.id)
        assert got.id == inst.id and got.offering_key == inst.offering_key
        with pytest.raises(NotFound):
            env.provider.get(env.unknown_id)

    def test_describe_agrees_with_get_and_reports_the_unknown_as_not_found(self, env: ContractEnv) -> None:
        """`providers.base.describe`, the sync step's batched read: `get_many` where the adapter has it (one
        cloud call for many instances), else `get` per id. Either way the same view as `get`."""
        a = env.provider.launch(env.request())
        b = env.provider.launch(env.request())
        env.settle()
        views = describe(env.provider, [a.id, b.id, env.unknown_id, a.id])
        assert set(views) == {a.id, b.id, env.unknown_id}
        for inst in (a, b):
            view = views[inst.id]
            assert isinstance(view, Instance), view
            got = env.provider.get(inst.id)
            assert (view.id, view.offering_key, view.launch_token) == (got.id, got.offering_key, got.launch_token)
            assert view.state is got.state
        assert isinstance(views[env.unknown_id], NotFound)

    def test_terminate_converges(self, env: ContractEnv) -> None:
        inst = env.provider.launch(env.request())
        env.provider.terminate(inst.id)
        env.provider.terminate(inst.id)
        env.provider.terminate(env.unknown_id)
        env.settle()
        try:
            after = env.provider.get(inst.id)
        except NotFound:
            return
        assert after.state.terminal

    def test_list_only_returns_this_brokers_instances(self, env: ContractEnv) -> None:
        mine = env.provider.launch(env.request())
        foreign = env.make_foreign() if env.make_foreign else None
        env.settle()
        listed = env.provider.list_instances()
        ids = {i.id for i in listed}
        assert mine.id in ids
        assert all(i.tags.get("overspill:broker") == env.broker_id for i in listed)
        if foreign is not None:
            assert foreign not in ids

    def test_a_terminated_instance_is_released_so_the_sweep_ends_it_once(self, env: ContractEnv) -> None:
        """After `terminate`, the instance is gone or `released` wherever the broker looks (`get`, `describe`,
        `list_instances`): the orphan sweep skips released instances, so it terminates each orphan once."""
        inst = env.provider.launch(env.request())
        env.settle()
        running = env.provider.get(inst.id)
        assert not running.released and not running.lingering, "a live instance is neither released nor lingering"
        env.provider.terminate(inst.id)
        env.settle()
        try:
            after = env.provider.get(inst.id)
        except NotFound:
            after = None
        assert after is None or (after.state.terminal and after.released), after
        view = describe(env.provider, [inst.id])[inst.id]
        assert isinstance(view, NotFound) or (isinstance(view, Instance) and view.released), view
        listed = [i for i in env.provider.list_instances() if i.id == inst.id]
        assert all(i.released for i in listed), "the sweep would terminate it again on its next pass"

    def test_an_instance_that_ended_by_itself_lingers_until_terminated(self, env: ContractEnv) -> None:
        """A finished instance that still exists (a stopped VM holding its disk) is `lingering`, in `get` and in
        `list_instances` alike, so the sync step and the orphan sweep delete it; once terminated it is released.
        One that ended and holds nothing (terminated at the cloud, simulated) is released at once."""
        inst = env.provider.launch(env.request())
        env.settle()
        if env.end_by_itself is None:  # nothing can end it from inside here: it stays live and owned
            assert not env.provider.get(inst.id).state.terminal
            return
        env.end_by_itself(inst.id)
        env.settle()
        ended = env.provider.get(inst.id)
        assert ended.state.terminal, ended
        assert ended.lingering != ended.released
        listed = {i.id: i for i in env.provider.list_instances()}
        assert inst.id not in listed or listed[inst.id].lingering == ended.lingering
        if not ended.lingering:
            return
        env.provider.terminate(inst.id)
        env.settle()
        with contextlib.suppress(NotFound):
            assert env.provider.get(inst.id).released
        assert all(i.released for i in env.provider.list_instances() if i.id == inst.id)

    def test_a_launch_refused_in_the_clouds_operation_reads_back_failed_with_its_typed_error(
        self, env: ContractEnv
    ) -> None:
        """`launch` returns once the cloud accepted the request; a refusal that comes later (in the operation) is
        read back by `get` and `describe` as FAILED with `launch_error`, the typed error a synchronous refusal
        raises, so the broker fails over the same way; a refusal at once is raised."""
        if env.refuse_next_launch is None:  # the stand-in cannot refuse: a launch is never FAILED
            inst = env.provider.launch(env.request())
            env.settle()
            assert env.provider.get(inst.id).launch_error is None
            return
        env.refuse_next_launch()
        try:
            inst = env.provider.launch(env.request())
        except (InsufficientCapacity, QuotaExceeded):
            return  # refused at once: raised, as the contract says
        assert inst.state is InstanceState.PENDING and inst.launch_error is None
        env.settle()
        view = describe(env.provider, [inst.id])[inst.id]
        assert isinstance(view, Instance), view
        assert view.state is InstanceState.FAILED and isinstance(
            view.launch_error, InsufficientCapacity | QuotaExceeded
        )
        assert isinstance(view.launch_error, ProviderError) and str(view.launch_error)
        got = env.provider.get(inst.id)
        assert got.state is InstanceState.FAILED and type(got.launch_error) is type(view.launch_error)
        env.provider.terminate(inst.id)  # what the broker does next: nothing stays behind
        env.settle()
        assert all(i.released for i in env.provider.list_instances() if i.id == inst.id)
