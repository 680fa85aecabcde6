"""A generic ON-DEMAND compute provider over any Apache Libcloud `NodeDriver`, so a site can add an OpenStack
private cloud (or another libcloud-supported cloud) by configuration instead of code.

Role: implement the `ComputeProvider` contract of `providers/base.py` (and, optionally, `OfferingSource`) with
nothing but libcloud's small shared API: `create_node`, `list_nodes`, `destroy_node`, `list_sizes`,
`list_locations`. Driver-specific `ex_` keywords are confined to one table of `DriverTraits` (which keyword carries
tags, user data, a zone or an idempotency token) plus `create_args`, a site's verbatim pass-through (key pair,
networks, security groups...). Spot/preemptible capacity is out of scope: libcloud's support is thin.

Contract, and how it is met:
- `launch` is idempotent on the launch token. The node is named `ovs-` + `token[:20]`; before creating, the adapter
  looks in its launch notes, then lists the driver's nodes for that name (and, where tags are stored, the
  `overspill:launch-token` tag; EC2 filters by that tag server-side). EC2 also gets the token as `ClientToken`.
  Launches in one process are serialised by a lock.
- `terminate` converges: an unknown, vanished or already-terminated node (or a 404 from `destroy_node`) is success.
- `get` returns the driver's view or raises `NotFound` when `list_nodes` no longer shows the id; `get_many` answers
  for many ids from one `list_nodes` (on EC2, one id-filtered call per 100 ids).
- `list_instances` returns only nodes attributed to this broker: by their stored tags where the driver stores
  them, otherwise by the adapter's launch notes.

What `list_instances` can verify, per driver (see `traits_for`):
- OpenStack (Nova `metadata`) and EC2 (instance tags): the broker tags travel with the node, so attribution,
  the launch token and the offering key survive a broker restart.
- Any other driver (GCE, Azure ARM, the Dummy driver...): tags cannot be stored safely through the shared API
  (GCE metadata keys reject `:`, Azure needs resource groups), so attribution comes from the launch notes, an
  in-memory `MutableMapping[token, LaunchNote]` by default. Pass a persistent mapping as `notes` to survive
  restarts; without one, nodes launched before a restart are invisible to `list_instances` (still reachable by
  id through `get`, with empty tags). Names still help `launch` find its node where the driver honours names.
  The Dummy driver ignores names entirely (`dummy-N`) and reissues ids (`len(nodes) + 1`), so for it the notes
  are the only record; a reissued id retires the older note.

User data: `request.user_data` (the agent's start-up script) goes where the driver takes it (`ex_userdata` for
OpenStack and EC2). A driver without such a keyword cannot run the job, so the constructor refuses it unless
`require_userdata=False` (tests with the Dummy driver).

States: PENDING/STARTING/REBOOTING/RECONFIGURING/UNKNOWN -> PENDING, RUNNING -> RUNNING,
STOPPED/STOPPING/SUSPENDED/PAUSED/TERMINATED -> TERMINATED, ERROR -> FAILED. UNKNOWN is refined from the raw
status in `node.extra` when present (EC2 maps `shutting-down`, `stopping` and `stopped` to UNKNOWN). A node that
ended but still exists (stopped, suspended, paused, shut off, in error) holds its disk and quota: its view is
`lingering`, so `terminate` (and the orphan sweep) destroys it; a terminated, deleted or shutting-down node is not.
A job's exit code is not visible through libcloud, so a job that powers its VM off shows as TERMINATED, never
SUCCEEDED.
`started_at` is the node's creation time (or the launch call's) once the node is RUNNING.

Errors: every libcloud or transport exception becomes one of the typed errors of `providers.base` with the
original chained (`map_error`). Retries: each public call runs under a `RetryPolicy` (providers/retry.py): a
transient failure (`Throttled`: 429, 5xx, timeouts, dropped connections) is retried with bounded jittered backoff,
honouring a 429's `Retry-After`; libcloud's own retries stay off (its default), so the layers do not multiply. A
launch is retried whole, lookup included, so a create whose answer was lost is found by its token, not repeated.

Offerings (optional): `offerings(now, prices)` builds ON_DEMAND offerings from `driver.list_sizes()` for sizes
that have both a price (`prices[size_id]`, USD/hour) and known GPUs: from the `gpus` map given to the
constructor, else from the size's `extra` (flavor extra specs `overspill:accelerator` + `overspill:gpu_count`,
or OpenStack's `pci_passthrough:alias` = `alias:count`). libcloud's EC2 size data carries a GPU count but not
the model, so EC2 sizes need the `gpus` map.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar, TypeVar

import requests
from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.providers import get_driver
from libcloud.compute.types import NodeState, Provider

from providers.accelerators import canonical, memory_gib
from providers.base import (
    AuthError,
    Instance,
    InstanceState,
    InsufficientCapacity,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from providers.model import BROKER_TAG, LAUNCH_TOKEN_TAG, OFFERING_TAG, CapacityType, Offering, Price
from providers.retry import RetryPolicy

T = TypeVar("T")

NAME_PREFIX = "ovs-"
TAG_BROKER = BROKER_TAG
TAG_TOKEN = LAUNCH_TOKEN_TAG
TAG_OFFERING = OFFERING_TAG

STATE_MAP: dict[str, InstanceState] = {
    NodeState.PENDING.value: InstanceState.PENDING,
    NodeState.STARTING.value: InstanceState.PENDING,
    NodeState.REBOOTING.value: InstanceState.PENDING,
    NodeState.RECONFIGURING.value: InstanceState.PENDING,
    NodeState.UNKNOWN.value: InstanceState.PENDING,
    NodeState.RUNNING.value: InstanceState.RUNNING,
    NodeState.STOPPED.value: InstanceState.TERMINATED,
    NodeState.STOPPING.value: InstanceState.TERMINATED,
    NodeState.SUSPENDED.value: InstanceState.TERMINATED,
    NodeState.PAUSED.value: InstanceState.TERMINATED,
    NodeState.TERMINATED.value: InstanceState.TERMINATED,
    NodeState.ERROR.value: InstanceState.FAILED,
}

# Raw provider statuses (node.extra["status"] / ["vm_state"]) that refine a driver's UNKNOWN.
_RAW_STATUS_MAP: dict[str, InstanceState] = {
    "shutting-down": InstanceState.TERMINATED,
    "stopping": InstanceState.TERMINATED,
    "stopped": InstanceState.TERMINATED,
    "shutoff": InstanceState.TERMINATED,
    "deleted": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
    "error": InstanceState.FAILED,
    "failed": InstanceState.FAILED,
}


def node_name(launch_token: str) -> str:
    """The deterministic node name for a launch token."""
    return NAME_PREFIX + launch_token[:20]


# Node states (and raw statuses) of a node that ended and is gone or going: nothing left to destroy.
_RELEASED_STATES = frozenset({NodeState.TERMINATED.value})
_RELEASED_RAW = frozenset({"shutting-down", "terminated", "deleted"})


def lingers(node: Node) -> bool:
    """An ended node that still exists at the cloud (stopped, suspended, in error...): see the module docstring."""
    if not map_state(node).terminal:
        return False
    extra = node.extra or {}
    raw = str(extra.get("status") or extra.get("vm_state") or "").lower()
    return str(node.state) not in _RELEASED_STATES and raw not in _RELEASED_RAW


def map_state(node: Node) -> InstanceState:
    """The broker's state for a libcloud node (see the module docstring for the table)."""
    state = STATE_MAP.get(str(node.state), InstanceState.PENDING)
    if str(node.state) == NodeState.UNKNOWN.value:
        extra = node.extra or {}
        raw = str(extra.get("status") or extra.get("vm_state") or "").lower()
        state = _RAW_STATUS_MAP.get(raw, state)
    return state


# -- errors -------------------------------------------------------------------------------------------------------

_THROTTLE_WORDS = ("requestlimitexceeded", "rate limit", "ratelimit", "throttl", "too many requests")
_QUOTA_WORDS = ("quota", "exceeded")
_CAPACITY_WORDS = ("capacity", "insufficient")
DRIVER_ERRORS: tuple[type[BaseException], ...] = (LibcloudError, BaseHTTPError, requests.RequestException, OSError)


def _http_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None) if isinstance(exc, BaseHTTPError) else getattr(exc, "http_code", None)
    try:
        return int(code) if code is not None else None
    except (TypeError, ValueError):
        return None


def map_error(exc: BaseException, *, provider: str = "", action: str = "") -> ProviderError:
    """The typed error for a libcloud (or transport) exception; the caller chains `exc` with `raise ... from`.

    InvalidCredsError -> AuthError; RateLimitReachedError, HTTP 429 and throttling messages -> Throttled;
    "quota"/"exceeded" -> QuotaExceeded; "capacity"/"insufficient" -> InsufficientCapacity; HTTP 404 (or EC2's
    InvalidInstanceID.NotFound) -> NotFound; HTTP 401/403 -> AuthError; HTTP 5xx and transport failures
    (connection refused, timeouts) -> Throttled, the retryable request-scoped error; anything else ->
    InvalidRequest. Messages are checked before the 401/403 rule because OpenStack reports quota as 403.
    """
    message = str(getattr(exc, "message", "") or getattr(exc, "value", "") or exc)
    text = message.lower()
    code = _http_code(exc)
    prefix = f"{action}: " if action else ""
    detail = f"{type(exc).__name__}" + (f" HTTP {code}" if code is not None else "")
    kind: type[ProviderError]
    if isinstance(exc, InvalidCredsError):
        kind = AuthError
    elif isinstance(exc, RateLimitReachedError) or code == 429 or any(w in text for w in _THROTTLE_WORDS):
        kind = Throttled
    elif any(w in text for w in _QUOTA_WORDS):
        kind = QuotaExceeded
    elif any(w in text for w in _CAPACITY_WORDS):
        kind = InsufficientCapacity
    elif code == 404 or "instanceid.notfound" in text:
        kind = NotFound
    elif code in (401, 403):
        kind = AuthError
    elif (code is not None and code >= 500) or isinstance(exc, requests.RequestException | OSError):
        kind = Throttled
    else:
        kind = InvalidRequest
    return kind(f"{prefix}{message or type(exc).__name__}", provider=provider, detail=detail)


def transient(exc: BaseException) -> bool:
    """Whether a mapped error is worth retrying at once: throttling, 5xx, timeouts, dropped connections."""
    return isinstance(exc, Throttled)


def retry_after_hint(exc: BaseException) -> float | None:
    """The wait a 429 asked for (libcloud's `RateLimitReachedError.retry_after`, from `Retry-After`), if any."""
    cause = exc.__cause__
    value = getattr(cause, "retry_after", None) if isinstance(cause, RateLimitReachedError) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


# -- per-driver traits --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverTraits:
    """Which `create_node` keywords a driver takes for what, and where it reads stored tags back.

    `tags_kwarg`/`tags_extra_key`: where broker tags are written and read back from `node.extra` (both or
    neither). `zone_kwarg` takes the zone named by `location_for`: a `NodeLocation` found by id or name in
    `list_locations()` when `zone_is_location`, else the plain string. `token_kwarg` gets the launch token as a
    provider-side idempotency token. `token_lookup(token)` gives `list_nodes` keywords that make the cloud filter
    its nodes down to the token's (EC2's tag filter): a launch's look for an earlier node then reads one node, not
    every node of the account. `ids_lookup(ids)` does the same for up to `ids_per_lookup` node ids (`get`,
    `get_many`), `broker_lookup(broker_id)` for the nodes tagged for this broker (`list_instances`). EC2 needs them
    for more than speed: libcloud's `list_nodes` reads one DescribeInstances page and never follows `NextToken`, so
    where the service pages an unfiltered listing (moto: 100 reservations) a node beyond the first page would look
    gone.
    """

    tags_kwarg: str | None = None
    tags_extra_key: str | None = None
    userdata_kwarg: str | None = None
    zone_kwarg: str | None = None
    zone_is_location: bool = True
    token_kwarg: str | None = None
    token_lookup: Callable[[str], Mapping[str, Any]] | None = None
    ids_lookup: Callable[[list[str]], Mapping[str, Any]] | None = None
    ids_per_lookup: int = 100
    broker_lookup: Callable[[str], Mapping[str, Any]] | None = None


KNOWN_TRAITS: dict[str, DriverTraits] = {
    Provider.OPENSTACK.value: DriverTraits(
        tags_kwarg="ex_metadata",
        tags_extra_key="metadata",
        userdata_kwarg="ex_userdata",
        zone_kwarg="ex_availability_zone",
        zone_is_location=False,
    ),
    Provider.EC2.value: DriverTraits(
        tags_kwarg="ex_metadata",
        tags_extra_key="tags",
        userdata_kwarg="ex_userdata",
        zone_kwarg="location",
        token_kwarg="ex_clienttoken",
        token_lookup=lambda token: {"ex_filters": {f"tag:{LAUNCH_TOKEN_TAG}": token}},
        ids_lookup=lambda ids: {"ex_filters": {"instance-id": ids}},  # unknown ids are absent, never an error
        broker_lookup=lambda broker_id: {"ex_filters": {f"tag:{BROKER_TAG}": broker_id}},
    ),
}


def traits_for(driver: NodeDriver) -> DriverTraits:
    """Known traits for OpenStack and EC2; for other drivers only what `create_node`'s signature shows
    (`ex_userdata`, `location`), never tags."""
    known = KNOWN_TRAITS.get(str(getattr(driver, "type", "")))
    if known is not None:
        return known
    params = inspect.signature(driver.create_node).parameters
    return DriverTraits(
        userdata_kwarg="ex_userdata" if "ex_userdata" in params else None,
        zone_kwarg="location" if "location" in params else None,
    )


# -- the provider -------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class LaunchNote:
    """What the adapter remembers about a node it launched (the only record for drivers without tags).

    `retired` is set when the node is known gone: we terminated it and it vanished, or the driver reissued its
    id to a newer node.
    """

    launch_token: str
    node_id: str
    offering_key: str
    tags: dict[str, str]
    launched_at: datetime
    retired: bool = False


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """The GPUs of one size; `memory_gib` per GPU, 0 to take it from the accelerator catalog."""

    accelerator: str
    count: int
    memory_gib: int = 0

    @classmethod
    def parse(cls, text: str) -> GpuSpec:
        """`A100:8` (or `A100`, one GPU); ValueError naming the text when it is not that shape."""
        name, _, count = text.strip().partition(":")
        if not name or (count and (not count.isdigit() or int(count) < 1)):
            raise ValueError(f"GPUs {text!r}: expected accelerator[:count], e.g. A100:8")
        return cls(name, int(count or 1))


@dataclass
class _Cache:
    locations: list[NodeLocation] | None = None


def _utc(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class LibcloudProvider:
    """ON-DEMAND instances on any libcloud compute driver. See the module docstring for the contract."""

    boots_agent: ClassVar[bool] = True  # its instances run the instance agent (broker.agent_side.attempt_spec)
    notice_source: ClassVar[str] = "none"  # the interruption notice the agent watches there

    def __init__(
        self,
        driver: NodeDriver,
        *,
        name: str,
        broker_id: str,
        image_id: str,
        size_for: Callable[[Offering], str] | None = None,
        location_for: Callable[[Offering], str | None] | None = None,
        create_args: Mapping[str, Any] | None = None,
        traits: DriverTraits | None = None,
        require_userdata: bool = True,
        notes: MutableMapping[str, LaunchNote] | None = None,
        region: str = "",
        zones: tuple[str, ...] = ("",),
        gpus: Mapping[str, GpuSpec] | None = None,
        prices: Mapping[str, Decimal] | None = None,
        clock: Callable[[], datetime] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`size_for` maps an offering to a size id (default: its instance type); `location_for` to a zone/location
        name or None (default: the driver's default). `create_args` go verbatim to `create_node`. `region`,
        `zones`, `gpus` and `prices` only feed `offerings`. `retry` governs transient failures (default: one
        attempt, no retry)."""
        self.driver = driver
        self.name = name
        self.broker_id = broker_id
        self.image_id = image_id
        self.traits = traits or traits_for(driver)
        if require_userdata and self.traits.userdata_kwarg is None:
            raise ValueError(
                f"{type(driver).__name__} takes no user data through create_node, so the job's start-up script "
                "cannot run; use a dedicated adapter or pass require_userdata=False"
            )
        if location_for is not None and self.traits.zone_kwarg is None:
            raise ValueError(f"{type(driver).__name__}.create_node takes no location, but location_for was given")
        self._size_for = size_for or (lambda offering: offering.instance_type)
        self._location_for = location_for
        self._create_args = dict(create_args or {})
        self._notes: MutableMapping[str, LaunchNote] = notes if notes is not None else {}
        self._region = region
        self._zones = zones
        self._gpus = dict(gpus or {})
        self._prices = dict(prices or {})
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._cache = _Cache()
        self.retry = retry or RetryPolicy(attempts=1)

    @classmethod
    def from_config(
        cls,
        provider: str,
        key: str,
        secret: str | None = None,
        *,
        name: str,
        broker_id: str,
        image_id: str,
        size_for: Callable[[Offering], str] | None = None,
        location_for: Callable[[Offering], str | None] | None = None,
        create_args: Mapping[str, Any] | None = None,
        require_userdata: bool = True,
        region: str = "",
        zones: tuple[str, ...] = ("",),
        gpus: Mapping[str, GpuSpec] | None = None,
        prices: Mapping[str, Decimal] | None = None,
        retry: RetryPolicy | None = None,
        driver_options: Mapping[str, Any] | None = None,
        **driver_kwargs: Any,
    ) -> LibcloudProvider:
        """Build the driver with `get_driver(Provider.X)(key, secret, **driver_options, **driver_kwargs)` and wrap
        it. `driver_options` carries keywords whose names clash with this method's own (a driver's `region`).

        `provider` is a libcloud provider value or constant name ("openstack", "ec2", "DUMMY"). For OpenStack,
        e.g. `ex_force_auth_url=..., ex_force_auth_version="3.x_password", ex_tenant_name=..., api_version="2.0"`.
        """
        driver_cls = get_driver(_provider_constant(provider))
        args = (key,) if secret is None else (key, secret)
        driver = driver_cls(*args, **{**(driver_options or {}), **driver_kwargs})
        return cls(
            driver,
            name=name,
            broker_id=broker_id,
            image_id=image_id,
            size_for=size_for,
            location_for=location_for,
            create_args=create_args,
            require_userdata=require_userdata,
            region=region,
            zones=zones,
            gpus=gpus,
            prices=prices,
            retry=retry,
        )

    # -- ComputeProvider ------------------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance:
        return self._retried(lambda: self._launch_once(request))

    def _launch_once(self, request: LaunchRequest) -> Instance:
        with self._lock:
            found = self._find_launched(request.launch_token)
            if found is not None:
                return found
            tags = {
                **request.tags.as_dict(),
                TAG_TOKEN: request.launch_token,
                TAG_OFFERING: request.offering.key,
            }
            kwargs = self._create_kwargs(request, tags)
            with self._errors("create_node"):
                created = self.driver.create_node(**kwargs)
            node = self._one_node(created)
            node_id = str(node.id)
            for other in self._notes.values():  # the driver reissued this id: the older node is gone
                if other.node_id == node_id and not other.retired:
                    other.retired = True
            launched_at = _utc(node.created_at) or self._clock()
            self._notes[request.launch_token] = LaunchNote(
                request.launch_token, node_id, request.offering.key, tags, launched_at
            )
            return self._view(node)

    def terminate(self, instance_id: str) -> None:
        self._retried(lambda: self._terminate_once(instance_id))

    def _terminate_once(self, instance_id: str) -> None:
        node = self._node(instance_id)
        if node is None:  # vanished (or never ours): retire the note so a reissued id is not taken for ours
            note = self._note_for(instance_id)
            if note is not None:
                note.retired = True
            return
        if str(node.state) == NodeState.TERMINATED.value:
            return
        with suppress(NotFound), self._errors("destroy_node"):
            self.driver.destroy_node(node)

    def get(self, instance_id: str) -> Instance:
        node = self._retried(lambda: self._node(instance_id))
        if node is None:
            raise NotFound(f"no node {instance_id!r}", provider=self.name)
        return self._view(node)

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        """The nodes among `instance_ids` that the driver lists (one `list_nodes` for all, or one per
        `ids_per_lookup` ids where the driver filters by id); a missing id is gone."""
        return {str(n.id): self._view(n) for n in self._retried(lambda: self._nodes_by_id(list(instance_ids)))}

    def list_instances(self) -> list[Instance]:
        lookup = self.traits.broker_lookup
        nodes = self._retried(lambda: self._nodes(**lookup(self.broker_id)) if lookup else self._nodes())
        views = [self._view(node) for node in nodes]
        return [view for view in views if view.tags.get(TAG_BROKER) == self.broker_id]

    # -- OfferingSource -------------------------------------------------------------------------------------------

    def offerings(self, now: datetime, prices: Mapping[str, Decimal] | None = None) -> list[Offering]:
        """ON_DEMAND offerings for every size with a price and known GPUs, in every configured zone."""
        prices = prices if prices is not None else self._prices
        sizes = self._retried(self._sizes)
        out: list[Offering] = []
        for size in sizes:
            size_id = str(size.id)
            gpu = self._gpus.get(size_id) or _gpu_from_extra(size.extra or {})
            price = prices.get(size_id)
            if gpu is None or price is None:
                continue
            accelerator = canonical(gpu.accelerator)
            for zone in self._zones:
                out.append(
                    Offering(
                        provider=self.name,
                        region=self._region,
                        zone=zone,
                        instance_type=size_id,
                        accelerator=accelerator,
                        accelerator_count=gpu.count,
                        gpu_memory_gib=gpu.memory_gib or memory_gib(accelerator),
                        vcpus=_vcpus(size),
                        memory_gib=Decimal(int(size.ram or 0)) / 1024,
                        capacity_type=CapacityType.ON_DEMAND,
                        price=Price(Decimal(price), source=f"config:{self.name}", observed_at=now),
                    )
                )
        return out

    # -- internals ------------------------------------------------------------------------------------------------

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except ProviderError:
            raise
        except DRIVER_ERRORS as exc:
            raise map_error(exc, provider=self.name, action=action) from exc

    def _retried(self, fn: Callable[[], T]) -> T:
        return self.retry.call(fn, transient, retry_after_hint)

    def _sizes(self) -> list[NodeSize]:
        with self._errors("list_sizes"):
            return list(self.driver.list_sizes())

    def _nodes(self, **filters: Any) -> list[Node]:
        with self._errors("list_nodes"):
            return list(self.driver.list_nodes(**filters))

    def _node(self, instance_id: str) -> Node | None:
        return next(iter(self._nodes_by_id([instance_id])), None)

    def _nodes_by_id(self, ids: list[str]) -> list[Node]:
        wanted = set(ids)
        lookup, size = self.traits.ids_lookup, self.traits.ids_per_lookup
        if lookup is None:
            return [n for n in self._nodes() if str(n.id) in wanted]
        unique = sorted(wanted)
        chunks = [unique[i : i + size] for i in range(0, len(unique), size)]
        return [n for chunk in chunks for n in self._nodes(**lookup(chunk)) if str(n.id) in wanted]

    def _note_for(self, node_id: str) -> LaunchNote | None:
        return next((n for n in self._notes.values() if n.node_id == node_id and not n.retired), None)

    def _find_launched(self, token: str) -> Instance | None:
        note = self._notes.get(token)
        if note is not None:
            node = None if note.retired else self._node(note.node_id)
            return self._view(node) if node is not None else self._gone(note)
        name = node_name(token)
        key = self.traits.tags_extra_key
        lookup = self.traits.token_lookup
        for node in self._nodes(**lookup(token)) if lookup else self._nodes():
            stored = _stored_tags(node, key)
            if key is not None and stored.get(TAG_TOKEN) == token and stored.get(TAG_BROKER) == self.broker_id:
                return self._view(node)
            if key is None and node.name == name:
                return self._view(node)
        return None

    def _create_kwargs(self, request: LaunchRequest, tags: dict[str, str]) -> dict[str, Any]:
        offering = request.offering
        size_id = self._size_for(offering)
        kwargs: dict[str, Any] = {
            **self._create_args,
            "name": node_name(request.launch_token),
            "size": NodeSize(size_id, size_id, 0, 0, None, None, self.driver),
            "image": NodeImage(self.image_id, None, self.driver),
        }
        traits = self.traits
        if traits.tags_kwarg:
            kwargs[traits.tags_kwarg] = {**kwargs.get(traits.tags_kwarg, {}), **tags}
        if traits.userdata_kwarg and request.user_data is not None:
            kwargs[traits.userdata_kwarg] = request.user_data
        if traits.token_kwarg:
            kwargs[traits.token_kwarg] = request.launch_token[:64]
        zone = self._location_for(offering) if self._location_for else None
        if zone and traits.zone_kwarg:
            kwargs[traits.zone_kwarg] = self._location(zone) if traits.zone_is_location else zone
        return kwargs

    def _location(self, zone: str) -> NodeLocation:
        if self._cache.locations is None:
            with self._errors("list_locations"):
                self._cache.locations = list(self.driver.list_locations())
        for loc in self._cache.locations:
            if zone in (str(loc.id), loc.name):
                return loc
        raise InvalidRequest(f"no location {zone!r} at {self.name}", provider=self.name)

    def _one_node(self, created: object) -> Node:
        if isinstance(created, Node):
            return created
        if isinstance(created, list) and len(created) == 1 and isinstance(created[0], Node):
            return created[0]
        count = len(created) if isinstance(created, list) else "no"
        raise InvalidRequest(
            f"create_node returned {count} nodes for one launch: the driver could not parse the response "
            "(an XML namespace mismatch does this for EC2-compatible endpoints); a node may exist unrecorded",
            provider=self.name,
            detail=repr(created),
        )

    def _view(self, node: Node) -> Instance:
        node_id = str(node.id)
        note = self._note_for(node_id)
        tags = {**(note.tags if note else {}), **_stored_tags(node, self.traits.tags_extra_key)}
        launched_at = _utc(node.created_at) or (note.launched_at if note else None) or self._clock()
        state = map_state(node)
        return Instance(
            id=node_id,
            provider=self.name,
            offering_key=tags.get(TAG_OFFERING, ""),
            launch_token=tags.get(TAG_TOKEN, ""),
            state=state,
            tags=tags,
            launched_at=launched_at,
            started_at=launched_at if state is InstanceState.RUNNING else None,
            detail=f"libcloud node {node.name!r} is {node.state}",
            lingering=lingers(node),
        )

    def _gone(self, note: LaunchNote) -> Instance:
        return Instance(
            id=note.node_id,
            provider=self.name,
            offering_key=note.offering_key,
            launch_token=note.launch_token,
            state=InstanceState.TERMINATED,
            tags=dict(note.tags),
            launched_at=note.launched_at,
            detail="the node is gone from the driver's listing",
        )


def _stored_tags(node: Node, key: str | None) -> dict[str, str]:
    if key is None:
        return {}
    raw = (node.extra or {}).get(key)
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _provider_constant(provider: str) -> Provider:
    try:
        return Provider(provider.lower())
    except ValueError:
        pass
    constant = getattr(Provider, provider.upper(), None)
    if not isinstance(constant, Provider):
        raise ValueError(f"unknown libcloud compute provider {provider!r}")
    return constant


def _gpu_from_extra(extra: Mapping[str, Any]) -> GpuSpec | None:
    accelerator = extra.get("overspill:accelerator")
    if accelerator:
        return GpuSpec(str(accelerator), int(extra.get("overspill:gpu_count", 1)))
    alias = str(extra.get("pci_passthrough:alias") or "")
    if alias:
        first = alias.split(",")[0]
        name, _, count = first.partition(":")
        return GpuSpec(name, int(count or 1))
    return None


def _vcpus(size: NodeSize) -> int:
    value = getattr(size, "vcpus", None) or (size.extra or {}).get("vcpu") or (size.extra or {}).get("vcpus")
    try:
        return int(value) if value else 0
    except (TypeError, ValueError):
        return 0
