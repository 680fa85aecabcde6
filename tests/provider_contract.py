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

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import pytest

from providers.base import ComputeProvider, Instance, InstanceState, LaunchRequest, NotFound, describe
from providers.model import JobSpec, Offering, Tags

BROKER_ID = "overspill-contract"


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
    """

    provider: ComputeProvider
    offering: Offering
    broker_id: str = BROKER_ID
    make_foreign: Callable[[], str] | None = None
    settle: Callable[[], None] = field(default=lambda: None)
    unknown_id: str = "does-not-exist-0"  # an id shaped like the provider's that it never issued

    def request(self, token: str | None = None) -> LaunchRequest:
        token = token or uuid.uuid4().hex
        return LaunchRequest(
            offering=self.offering,
            launch_token=token,
            tags=Tags(self.broker_id, f"job-{token[:8]}", f"plc-{token[:8]}"),
            spec=contract_spec(),
            remaining_work_hours=Decimal("2"),
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
