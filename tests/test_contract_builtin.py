"""The provider contract suite run against the built-in simulated providers and the scripted test cloud.

Their instances end by themselves when their work runs out (`end_by_itself` moves the clock past it) and leave
nothing behind: an ended simulated instance is released, so the orphan sweep never terminates it again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from providers.model import CapacityType
from providers.simulated.market import SimulatedCloud
from providers.simulated.onprem import SimulatedOnPremCluster
from providers.simulated.store import InMemorySimStore
from tests.conftest import MovableClock
from tests.provider_contract import BROKER_ID, ContractEnv, ProviderContract
from tests.scripted import ScriptedCloud

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


class TestSimulatedCloudContract(ProviderContract):
    @pytest.fixture
    def env(self) -> ContractEnv:
        clock = MovableClock(NOW)
        cloud = SimulatedCloud("sim-aws", seed=7, clock=clock, store=InMemorySimStore(), broker_id=BROKER_ID)
        offering = next(
            o for o in cloud.offerings(NOW) if o.capacity_type is CapacityType.ON_DEMAND and o.accelerator == "A100"
        )
        return ContractEnv(
            provider=cloud,
            offering=offering,
            unknown_id="i-0000000000000000f",
            end_by_itself=lambda _: clock.advance(hours=3),  # the contract's 2 h of work are done
        )


class TestSimulatedOnPremContract(ProviderContract):
    @pytest.fixture
    def env(self) -> ContractEnv:
        clock = MovableClock(NOW)
        onprem = SimulatedOnPremCluster(seed=7, clock=clock, store=InMemorySimStore(), broker_id=BROKER_ID)
        offering = next(o for o in onprem.offerings(NOW) if o.accelerator == "A100" and o.accelerator_count == 1)
        return ContractEnv(
            provider=onprem,
            offering=offering,
            unknown_id="job-00000000000000000",
            end_by_itself=lambda _: clock.advance(hours=3),
        )


class TestScriptedCloudContract(ProviderContract):
    @pytest.fixture
    def env(self) -> ContractEnv:
        clock = MovableClock(NOW)
        cloud = ScriptedCloud("scripted", clock)
        offering = cloud.offerings(NOW)[0]
        return ContractEnv(
            provider=cloud,
            offering=offering,
            unknown_id="vm-999",
            end_by_itself=lambda _: clock.advance(hours=3),
            refuse_next_launch=lambda: cloud.no_capacity.add(offering.zone),
        )
