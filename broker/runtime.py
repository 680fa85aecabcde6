"""Wiring: one `Runtime` holds the settings, engine, providers and caches a process uses.

`build_runtime(settings)` migrates the database, installs the bootstrap admin key and builds the providers the
settings enable (the simulated market and on-prem cluster by default; the local pool of real machines when
`local_pool` is on, with its default checkpoint store: `broker.config.local_pool`), with what each launching
cloud's instances bill beside compute (`extras`: boot disk, public IPv4; `broker.config.launch.instance_extras`).
Nothing is built at import time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine

from broker.agent_side.publish import AgentPublisher
from broker.api.auth import KeyVerifier, ensure_bootstrap_key
from broker.config.checkpoint_stores import CheckpointStores
from broker.config.feeds import build_price_feeds
from broker.config.launch import instance_extras
from broker.config.local_pool import build_local_pool, local_pool_enabled, with_local_store
from broker.config.providers import build_providers
from broker.config.settings import Settings
from broker.loop.waitmemo import WaitMemo
from broker.market.catalog import CatalogCache
from broker.observe.metrics import LoopMetrics
from broker.store import migrate
from broker.store.db import make_engine, utcnow
from broker.store.shards import ShardScope, new_replica_id
from broker.store.simstore import DbSimStore
from federation.placement import PlacementParams
from federation.policies import build_deadline_policy
from federation.strategies import Strategy
from pricing.availability import Runs, load_trace_runs
from pricing.extras import InstanceExtras
from pricing.risk import RiskEstimate, load_trace
from providers.base import ComputeProvider, OfferingSource, QueuePressureSource

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


@dataclass
class TickCache:
    """What one tick's steps share, for their unlocked screens only (anything decided under row locks is read
    afresh): the instances read this tick by instance id, and sync's snapshot of the live placements it left
    alone (`settled`: placement id -> (placement, job) as read before it acted) with the ids it did act on."""

    instances: dict[str, Any] = field(default_factory=dict)
    settled: dict[str, tuple[Any, Any]] | None = None
    touched: list[str] = field(default_factory=list)


class Wakeup:
    """Jobs whose agent report calls for the loop at once (a final report, a preempt notice): the API marks them
    (`wake`), the interval loop (`broker.loop.runner.run_forever`) waits on it between ticks and runs the report
    steps as soon as one is marked, instead of at its next tick. Thread-safe; a process without a loop ignores it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._jobs: set[str] = set()

    def wake(self, job_id: str) -> None:
        with self._lock:
            self._jobs.add(job_id)
            self._event.set()

    def wait(self, timeout: float) -> set[str]:
        """The jobs marked since the last call, waiting up to `timeout` seconds for one (an empty set: none)."""
        self._event.wait(max(0.0, timeout))
        with self._lock:
            jobs, self._jobs = self._jobs, set()
            self._event.clear()
        return jobs


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    clock: Clock
    providers: dict[str, ComputeProvider]
    offering_sources: list[OfferingSource]
    pressure_sources: list[QueuePressureSource]
    catalog: CatalogCache
    verifier: KeyVerifier
    params: PlacementParams = field(default_factory=PlacementParams)
    marks: dict[str, datetime] = field(default_factory=dict)  # when periodic steps last ran in this process
    trace_priors: dict[str, RiskEstimate] = field(default_factory=dict)  # interruption priors from traces
    trace_runs: dict[str, Runs] = field(default_factory=dict)  # the same traces' up/down runs, as prior history
    checkpoint_stores: CheckpointStores = field(default_factory=lambda: CheckpointStores(Settings()))
    metrics: LoopMetrics = field(default_factory=LoopMetrics)  # this process's loop events, for GET /metrics
    last_tick_seconds: float = 0.0  # how long this process's last full tick took (the ceiling guard's horizon)
    extras: dict[str, InstanceExtras] = field(default_factory=dict)  # what a launched instance bills beside compute
    replica_id: str = field(default_factory=new_replica_id)  # this process's name on shard leases
    shares_work: bool = False  # a long-running tick replica: claims shard leases (`run_forever` sets it)
    shards: ShardScope | None = None  # the shards this tick works on (set by `tick`); None: every placement
    tick_cache: TickCache | None = None  # what this tick's steps share (set by `tick`)
    # return-on-prem's verdicts "stays in the cloud" by placement id, with the inputs they were taken on
    # (`broker.loop.return_onprem`): a placement whose inputs did not move is not screened again
    return_memo: dict[str, Any] = field(default_factory=dict)
    # when the move step last asked the deadline policy about a running placement and it stayed, by placement id
    # (`broker.loop.move`): asked again after `move_check_seconds`
    move_checked: dict[str, datetime] = field(default_factory=dict)
    # the pending jobs the placement round found no pool for, skipped while nothing they depend on changed
    wait_memo: WaitMemo = field(default_factory=WaitMemo)
    _publisher: AgentPublisher | None = field(default=None, repr=False)
    # the deadline policy, built from the settings on first use (an embedding or a test may set its own)
    deadline_policy: Strategy | None = field(default=None, repr=False)
    # one decision at a time per process: the DP policies fill their table caches while deciding
    deadline_policy_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # jobs whose reports wake the interval loop at once (a final report, a preempt notice)
    wakeup: Wakeup = field(default_factory=Wakeup, repr=False)

    def deadline_strategy(self) -> Strategy:
        """This process's deadline policy (`settings.deadline_policy`), built once so that a DP policy's solved
        tables and fitted chains last from one tick to the next."""
        if self.deadline_policy is None:
            self.deadline_policy = build_deadline_policy(self.settings.deadline_policy, self.settings.restart_hours)
        return self.deadline_policy

    def provider(self, name: str) -> ComputeProvider | None:
        return self.providers.get(name)

    def agent_publisher(self) -> AgentPublisher:
        """Publishes the instance agent's wheel to the checkpoint stores (built on first use)."""
        if self._publisher is None:
            self._publisher = AgentPublisher(self.checkpoint_stores, self.settings)
        return self._publisher


def build_runtime(settings: Settings, *, clock: Clock | None = None, engine: Engine | None = None) -> Runtime:
    clock = clock or utcnow
    settings = with_local_store(settings)
    engine = engine or make_engine(settings)
    migrate.upgrade(engine)
    if settings.bootstrap_api_key and ensure_bootstrap_key(
        engine, tenant=settings.bootstrap_tenant, key=settings.bootstrap_api_key, now=clock()
    ):
        log.info("installed the bootstrap admin key for tenant %s", settings.bootstrap_tenant)
    providers: dict[str, ComputeProvider] = {}
    offering_sources: list[OfferingSource] = []
    pressure_sources: list[QueuePressureSource] = []
    if settings.simulated:
        from providers.simulated.market import default_clouds
        from providers.simulated.onprem import SimulatedOnPremCluster

        store = DbSimStore(engine)
        for cloud in default_clouds(settings.seed, clock, store, settings.broker_id):
            providers[cloud.name] = cloud
            offering_sources.append(cloud)
        onprem = SimulatedOnPremCluster(
            seed=settings.seed,
            clock=clock,
            store=store,
            broker_id=settings.broker_id,
            gpus=settings.onprem_gpus,
            rate_usd_per_gpu_hour=settings.onprem_rate_usd_per_gpu_hour,
            background_jobs_per_hour=settings.onprem_background_jobs_per_hour,
        )
        providers[onprem.name] = onprem
        offering_sources.append(onprem)
        pressure_sources.append(onprem)
    if local_pool_enabled(settings):
        pool = build_local_pool(settings)
        providers[pool.name] = pool
        offering_sources.append(pool)
    offering_sources.extend(build_price_feeds(settings, engine))
    for provider in build_providers(settings):
        providers[provider.name] = provider
        if isinstance(provider, OfferingSource) and provider not in offering_sources:
            offering_sources.append(provider)
        if isinstance(provider, QueuePressureSource):
            pressure_sources.append(provider)
    params = PlacementParams(
        checkpoint_interval_hours=settings.checkpoint_interval_hours,
        restart_hours=settings.restart_hours,
        wait_value_usd_per_gpu_hour=settings.wait_value_usd_per_gpu_hour,
    )
    return Runtime(
        settings=settings,
        engine=engine,
        clock=clock,
        providers=providers,
        offering_sources=offering_sources,
        pressure_sources=pressure_sources,
        catalog=CatalogCache(engine),
        verifier=KeyVerifier(engine),
        params=params,
        trace_priors={prefix: load_trace(path) for prefix, path in settings.interruption_traces.items()},
        trace_runs={prefix: load_trace_runs(path) for prefix, path in settings.interruption_traces.items()},
        checkpoint_stores=CheckpointStores.from_settings(settings),
        extras=instance_extras(settings),
    )
