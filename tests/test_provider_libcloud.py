"""The generic libcloud adapter: the contract suite on libcloud's Dummy driver and on its EC2 driver against a
real moto server, the tag/user-data path on an OpenStack-shaped driver, state and error mapping, offerings.

moto quirk (integration tests only): moto answers EC2 with the XML namespace `http://ec2.amazonaws.com/doc/
2016-11-15` while libcloud's EC2 driver looks elements up under the same URI with a trailing slash, so every
response parses as empty (`create_node` returns `[]`, `list_nodes` returns nothing). The tests patch the public
module constant `libcloud.compute.drivers.ec2.NAMESPACE` for their duration (pytest's monkeypatch); real AWS
needs no patch. `test_moto_without_the_namespace_patch_fails_loudly` pins what happens without it. moto's error
bodies are namespaced too, so libcloud finds no `Errors/Error` in them and raises `BaseHTTPError(400, "")`:
error codes from moto are lost, which is why the adapter never relies on an error to learn an id is unknown.
"""

from __future__ import annotations

import base64
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import requests
from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, MalformedResponseError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeSize
from libcloud.compute.drivers import ec2 as libcloud_ec2
from libcloud.compute.drivers.dummy import DummyNodeDriver
from libcloud.compute.providers import get_driver
from libcloud.compute.types import NodeState, Provider

from providers.base import (
    AuthError,
    InstanceState,
    InsufficientCapacity,
    InvalidRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from providers.libcloud import TAG_OFFERING, TAG_TOKEN, GpuSpec, LibcloudProvider, map_state, node_name
from providers.model import CapacityType, Offering
from tests.moto_server import stop_threaded
from tests.provider_contract import BROKER_ID, USER_DATA, ContractEnv, ProviderContract

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
EC2_IMAGE = "ami-12c6146b"


def _dummy_provider(driver: NodeDriver) -> LibcloudProvider:
    return LibcloudProvider(
        driver,
        name="libcloud-dummy",
        broker_id=BROKER_ID,
        image_id="i2",
        require_userdata=False,  # the Dummy driver's create_node takes only name, size and image
        region="lab",
        gpus={"3": GpuSpec("a100", 1)},
        prices={"3": Decimal("2.50"), "1": Decimal("0.10")},
    )


# -- contract on the Dummy driver ----------------------------------------------------------------------------------


class TestLibcloudDummyContract(ProviderContract):
    @pytest.fixture
    def env(self) -> ContractEnv:
        driver = get_driver(Provider.DUMMY)(0)  # starts with two foreign nodes, dummy-1 and dummy-2
        provider = _dummy_provider(driver)
        offering = provider.offerings(NOW)[0]

        def foreign() -> str:
            return str(driver.create_node("foreign", None, None).id)

        def power_off(node_id: str) -> None:  # the Dummy driver cannot stop a node: its in-memory node stops
            next(n for n in driver.nl if str(n.id) == node_id).state = NodeState.STOPPED

        return ContractEnv(
            provider=provider, offering=offering, make_foreign=foreign, unknown_id="999", end_by_itself=power_off
        )


def test_dummy_offerings_come_from_priced_gpu_sizes() -> None:
    provider = _dummy_provider(get_driver(Provider.DUMMY)(0))
    [offering] = provider.offerings(NOW)  # size 1 is priced but has no GPUs; size 3 has both
    assert (offering.instance_type, offering.accelerator, offering.accelerator_count) == ("3", "A100", 1)
    assert offering.gpu_memory_gib == 40 and offering.memory_gib == Decimal(4)
    assert offering.capacity_type is CapacityType.ON_DEMAND and offering.hourly_usd == Decimal("2.50")
    assert offering.key == "libcloud-dummy/lab//3/on_demand"


def test_dummy_reissued_id_is_not_taken_for_the_older_launch() -> None:
    driver = get_driver(Provider.DUMMY)(0)
    provider = _dummy_provider(driver)
    offering = provider.offerings(NOW)[0]
    env = ContractEnv(provider=provider, offering=offering)
    first_req, second_req = env.request(), env.request()
    first = provider.launch(first_req)
    provider.terminate(first.id)
    second = provider.launch(second_req)
    assert second.id == first.id  # the Dummy driver numbers nodes len(nodes) + 1
    again = provider.launch(first_req)  # idempotent: the first launch's node, gone; never a new node
    assert again.id == first.id and again.state is InstanceState.TERMINATED
    assert again.launch_token == first_req.launch_token
    assert [(i.id, i.launch_token) for i in provider.list_instances()] == [(second.id, second_req.launch_token)]


def test_constructor_refuses_what_the_driver_cannot_do() -> None:
    driver = get_driver(Provider.DUMMY)(0)
    with pytest.raises(ValueError, match="user data"):
        LibcloudProvider(driver, name="d", broker_id=BROKER_ID, image_id="i2")
    with pytest.raises(ValueError, match="location"):
        LibcloudProvider(
            driver, name="d", broker_id=BROKER_ID, image_id="i2", require_userdata=False, location_for=lambda o: o.zone
        )


def test_from_config_builds_the_driver_by_provider_name() -> None:
    provider = LibcloudProvider.from_config(
        "dummy", "0", name="cfg", broker_id=BROKER_ID, image_id="i2", require_userdata=False
    )
    assert isinstance(provider.driver, DummyNodeDriver) and provider.name == "cfg"
    with pytest.raises(ValueError, match="unknown libcloud"):
        LibcloudProvider.from_config("no-such-cloud", "k", name="x", broker_id=BROKER_ID, image_id="i")


# -- tags, user data and zones on an OpenStack-shaped driver -------------------------------------------------------


class FakeOpenStackDriver(DummyNodeDriver):
    """Dummy storage with OpenStack's create_node keywords and its `extra["metadata"]` read-back."""

    type = Provider.OPENSTACK

    def __init__(self) -> None:
        super().__init__(0)
        self.calls: list[dict[str, Any]] = []

    def create_node(  # type: ignore[override]
        self,
        name: str,
        size: NodeSize,
        image: NodeImage,
        ex_userdata: str | None = None,
        ex_metadata: dict[str, str] | None = None,
        ex_availability_zone: str | None = None,
    ) -> Node:
        self.calls.append({"name": name, "userdata": ex_userdata, "zone": ex_availability_zone, "size": size.id})
        node = Node(
            id=uuid.uuid4().hex,
            name=name,
            state=NodeState.PENDING,
            public_ips=[],
            private_ips=[],
            driver=self,
            extra={"metadata": dict(ex_metadata or {}), "status": "BUILD"},
        )
        self.nl.append(node)
        return node

    def list_sizes(self, location: object = None) -> list[NodeSize]:
        return [
            NodeSize("gpu.a100x2", "a100x2", 131072, 100, None, None, self, extra={"pci_passthrough:alias": "a100:2"}),
            NodeSize("gpu.l4", "l4", 32768, 50, None, None, self, extra={"overspill:accelerator": "nvidia-l4"}),
            NodeSize("cpu.large", "large", 65536, 50, None, None, self, extra={"vcpus": 16}),
        ]


def test_openstack_shaped_driver_stores_tags_userdata_and_zone() -> None:
    driver = FakeOpenStackDriver()

    def make(notes_owner: str) -> LibcloudProvider:
        return LibcloudProvider(
            driver,
            name=f"os-{notes_owner}",
            broker_id=BROKER_ID,
            image_id="glance-uuid",
            size_for=lambda o: f"gpu.{o.accelerator.lower()}x{o.accelerator_count}",
            location_for=lambda o: o.zone,
            zones=("nova",),
            prices={"gpu.a100x2": Decimal("5"), "gpu.l4": Decimal("1"), "cpu.large": Decimal("1")},
        )

    provider = make("a")
    offerings = provider.offerings(NOW)
    assert [(o.instance_type, o.accelerator, o.accelerator_count, o.zone) for o in offerings] == [
        ("gpu.a100x2", "A100", 2, "nova"),
        ("gpu.l4", "L4", 1, "nova"),
    ]
    env = ContractEnv(provider=provider, offering=offerings[0])
    req = env.request()
    inst = provider.launch(req)
    [call] = driver.calls
    assert call == {
        "name": node_name(req.launch_token),
        "userdata": USER_DATA,
        "zone": "nova",
        "size": "gpu.a100x2",
    }
    assert inst.tags[TAG_TOKEN] == req.launch_token and inst.tags[TAG_OFFERING] == offerings[0].key
    assert inst.state is InstanceState.PENDING

    restarted = make("b")  # no launch notes: everything must come back from the node's metadata
    assert restarted.launch(req).id == inst.id and len(driver.calls) == 1
    [listed] = restarted.list_instances()  # dummy-1/dummy-2 carry no metadata, so they are not ours
    assert (listed.id, listed.launch_token, listed.offering_key) == (inst.id, req.launch_token, inst.offering_key)
    driver.create_node("other-broker", NodeSize("s", "s", 0, 0, None, None, driver), NodeImage("i", None, driver),
                       ex_metadata={"overspill:broker": "someone-else"})  # fmt: skip
    assert [i.id for i in restarted.list_instances()] == [inst.id]


# -- state and error mapping ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "status", "expected"),
    [
        (NodeState.PENDING, "", InstanceState.PENDING),
        (NodeState.STARTING, "", InstanceState.PENDING),
        (NodeState.REBOOTING, "", InstanceState.PENDING),
        (NodeState.UNKNOWN, "", InstanceState.PENDING),
        (NodeState.RUNNING, "", InstanceState.RUNNING),
        (NodeState.STOPPED, "", InstanceState.TERMINATED),
        (NodeState.STOPPING, "", InstanceState.TERMINATED),
        (NodeState.SUSPENDED, "", InstanceState.TERMINATED),
        (NodeState.TERMINATED, "", InstanceState.TERMINATED),
        (NodeState.ERROR, "", InstanceState.FAILED),
        (NodeState.UNKNOWN, "shutting-down", InstanceState.TERMINATED),  # EC2 maps these raw states to UNKNOWN
        (NodeState.UNKNOWN, "stopped", InstanceState.TERMINATED),
    ],
)
def test_node_state_mapping(state: NodeState, status: str, expected: InstanceState) -> None:
    node = Node("n", "n", state, [], [], DummyNodeDriver(0), extra={"status": status} if status else {})
    assert map_state(node) is expected


class FailingDriver(DummyNodeDriver):
    """A Dummy driver whose calls raise a chosen libcloud (or transport) exception."""

    def __init__(self, error: BaseException, *, on: tuple[str, ...]) -> None:
        super().__init__(0)
        self.error, self.on = error, on

    def _maybe_fail(self, call: str) -> None:
        if call in self.on:
            raise self.error

    def list_nodes(self) -> list[Node]:
        self._maybe_fail("list_nodes")
        return super().list_nodes()

    def create_node(self, name: str, size: NodeSize, image: NodeImage) -> Node:  # type: ignore[override]
        self._maybe_fail("create_node")
        return super().create_node(name, size, image)

    def destroy_node(self, node: Node) -> bool:
        self._maybe_fail("destroy_node")
        return super().destroy_node(node)


def _failing(error: BaseException, *on: str) -> LibcloudProvider:
    return LibcloudProvider(
        FailingDriver(error, on=on), name="failing", broker_id=BROKER_ID, image_id="i", require_userdata=False
    )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (InvalidCredsError(), AuthError),
        (BaseHTTPError(401, "Unauthorized"), AuthError),
        (RateLimitReachedError(), Throttled),
        (BaseHTTPError(400, "RequestLimitExceeded: Request limit exceeded."), Throttled),
        (BaseHTTPError(503, "Service Unavailable"), Throttled),
        (requests.ConnectionError("Connection refused"), Throttled),
        (BaseHTTPError(404, "Not Found"), NotFound),
        (BaseHTTPError(400, "InvalidInstanceID.NotFound: The instance ID 'i-1' does not exist"), NotFound),
        (BaseHTTPError(403, "Quota exceeded for cores: Requested 8, but already used 96 of 96 cores"), QuotaExceeded),
        (BaseHTTPError(400, "VcpuLimitExceeded: You have requested more vCPU capacity"), QuotaExceeded),
        (BaseHTTPError(400, "InsufficientInstanceCapacity: not enough g5.xlarge capacity"), InsufficientCapacity),
        (BaseHTTPError(500, "No valid host was found. Insufficient compute resources"), InsufficientCapacity),
        (BaseHTTPError(400, "InvalidParameterValue: bad size"), InvalidRequest),
        (MalformedResponseError("Failed to parse XML", body="<"), InvalidRequest),
    ],
)
def test_driver_errors_become_typed_errors_with_the_original_chained(
    error: BaseException, expected: type[ProviderError]
) -> None:
    provider = _failing(error, "list_nodes")
    with pytest.raises(expected) as caught:
        provider.list_instances()
    assert type(caught.value) is expected and caught.value.__cause__ is error
    assert caught.value.provider == "failing" and caught.value.args[0].startswith("list_nodes: ")


def test_launch_maps_create_errors_and_terminate_converges_on_404() -> None:
    offering = _dummy_provider(DummyNodeDriver(0)).offerings(NOW)[0]
    quota = BaseHTTPError(403, "Quota exceeded for instances")
    provider = _failing(quota, "create_node")
    with pytest.raises(QuotaExceeded) as caught:
        provider.launch(ContractEnv(provider=provider, offering=offering).request())
    assert caught.value.__cause__ is quota
    gone = _failing(BaseHTTPError(404, "Instance could not be found"), "destroy_node")
    gone.terminate("1")  # listed (dummy-1) but the destroy answers 404: already gone is success
    with pytest.raises(AuthError):
        _failing(InvalidCredsError(), "destroy_node").terminate("1")


# -- EC2 driver against a real moto server -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    server_module = pytest.importorskip("moto.server")
    port = _free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield port
    finally:
        stop_threaded(server)


@pytest.fixture
def moto_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's EC2 namespace lacks libcloud's trailing slash (see the module docstring)."""
    monkeypatch.setattr(libcloud_ec2, "NAMESPACE", libcloud_ec2.NAMESPACE.rstrip("/"))


def _ec2_driver(port: int) -> NodeDriver:
    return get_driver(Provider.EC2)(
        "AKIDMOTOEXAMPLE", "secret", region="us-east-1", host="127.0.0.1", port=port, secure=False,
        signature_version="4",
    )  # fmt: skip


def _ec2_provider(port: int, broker_id: str = BROKER_ID) -> LibcloudProvider:
    return LibcloudProvider(
        _ec2_driver(port),
        name="libcloud-ec2",
        broker_id=broker_id,
        image_id=EC2_IMAGE,
        location_for=lambda o: o.zone,
        region="us-east-1",
        zones=("us-east-1a",),
        gpus={"g5.xlarge": GpuSpec("A10G", 1)},
        prices={"g5.xlarge": Decimal("1.006")},
    )


def _ec2_offering(provider: LibcloudProvider) -> Offering:
    [offering] = provider.offerings(NOW)  # libcloud's EC2 size list is local data: no call to moto
    return offering


@pytest.mark.integration
class TestLibcloudEc2MotoContract(ProviderContract):
    @pytest.fixture
    def env(self, moto_port: int, moto_namespace: None) -> ContractEnv:
        provider = _ec2_provider(moto_port)
        driver = provider.driver

        def foreign() -> str:
            size, image = NodeSize("t3.micro", "t3.micro", 0, 0, None, None, driver), NodeImage(EC2_IMAGE, None, driver)
            return str(driver.create_node("foreign", size, image).id)

        def stop(node_id: str) -> None:
            driver.ex_stop_node(Node(node_id, "", NodeState.RUNNING, [], [], driver))

        return ContractEnv(
            provider=provider,
            offering=_ec2_offering(provider),
            make_foreign=foreign,
            unknown_id="i-0123456789abcdef0",
            end_by_itself=stop,  # stopped: its volume stays until the node is destroyed
        )


@pytest.mark.integration
def test_moto_launch_delivers_userdata_zone_and_survives_a_restart(moto_port: int, moto_namespace: None) -> None:
    provider = _ec2_provider(moto_port, broker_id="restart-check")
    offering = _ec2_offering(provider)
    req = ContractEnv(provider=provider, offering=offering, broker_id="restart-check").request()
    inst = provider.launch(req)
    node = provider._node(inst.id)  # the raw node, to check what EC2 recorded
    assert node is not None and node.extra["availability"] == "us-east-1a"
    assert node.extra["instance_type"] == "g5.xlarge" and node.name == node_name(req.launch_token)

    boto3 = pytest.importorskip("boto3")
    ec2 = boto3.client(
        "ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
        aws_access_key_id="AKIDMOTOEXAMPLE", aws_secret_access_key="secret",
    )  # fmt: skip
    attr = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]).decode() == USER_DATA

    restarted = _ec2_provider(moto_port, broker_id="restart-check")  # moto ignores ClientToken: tags find it
    assert restarted.launch(req).id == inst.id
    assert [i.id for i in restarted.list_instances()] == [inst.id]
    restarted.terminate(inst.id)
    assert restarted.get(inst.id).state is InstanceState.TERMINATED  # EC2 keeps terminated instances listed


@pytest.mark.integration
def test_moto_without_the_namespace_patch_fails_loudly(moto_port: int) -> None:
    zoned = _ec2_provider(moto_port, broker_id="no-namespace-patch")
    req = ContractEnv(provider=zoned, offering=_ec2_offering(zoned), broker_id="no-namespace-patch").request()
    with pytest.raises(InvalidRequest, match="no location 'us-east-1a'"):
        zoned.launch(req)  # DescribeAvailabilityZones parses as empty
    unzoned = LibcloudProvider(_ec2_driver(moto_port), name="libcloud-ec2", broker_id="no-namespace-patch",
                               image_id=EC2_IMAGE)  # fmt: skip
    with pytest.raises(InvalidRequest, match="returned 0 nodes"):
        unzoned.launch(req)  # moto ran the instance; libcloud parsed nothing out of RunInstances
    assert unzoned.list_instances() == []  # nor out of DescribeInstances


@pytest.mark.integration
def test_moto_nodes_beyond_the_first_describe_page_are_not_taken_for_gone(moto_port: int, moto_namespace: None) -> None:
    """libcloud's EC2 list_nodes reads one DescribeInstances page and moto pages at 100 reservations: the adapter
    asks by id, token and broker tag, so a node of ours after 100 others is still seen."""
    boto3 = pytest.importorskip("boto3")
    ec2 = boto3.client(
        "ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
        aws_access_key_id="AKIDMOTOEXAMPLE", aws_secret_access_key="secret",
    )  # fmt: skip
    for _ in range(101):  # one reservation each: someone else's instances filling the first page
        ec2.run_instances(ImageId=EC2_IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1)
    provider = _ec2_provider(moto_port, broker_id="beyond-page")
    assert len(provider.driver.list_nodes()) == 100, "moto still pages an unfiltered DescribeInstances at 100"
    req = ContractEnv(provider=provider, offering=_ec2_offering(provider), broker_id="beyond-page").request()
    inst = provider.launch(req)
    assert provider.get(inst.id).id == inst.id
    assert set(provider.get_many([inst.id, "i-0123456789abcdef0"])) == {inst.id}
    assert [i.id for i in provider.list_instances()] == [inst.id]
    fresh = _ec2_provider(moto_port, broker_id="beyond-page")  # no launch notes: the token lookup finds it
    assert fresh.launch(req).id == inst.id
    provider.terminate(inst.id)


def _ec2_settings(port: int, **overrides: Any) -> Any:
    from broker.config.settings import Settings

    values: dict[str, Any] = {
        "simulated": False,
        "libcloud_provider": "ec2",
        "libcloud_key": "AKIDMOTOEXAMPLE",
        "libcloud_secret": "secret",
        "libcloud_image_id": EC2_IMAGE,
        "libcloud_options": {
            "region": "us-east-1", "host": "127.0.0.1", "port": port, "secure": False, "signature_version": "4",
        },
        "libcloud_prices": {"g5.xlarge": "1.006", "g5.12xlarge": "5.672"},
        "libcloud_gpus": {"g5.xlarge": "A10G", "g5.12xlarge": "A10G:4"},
        "libcloud_region": "us-east-1",
        "libcloud_zones": ["us-east-1a", "us-east-1b"],
        **overrides,
    }  # fmt: skip
    return Settings(**values)


@pytest.mark.integration
def test_settings_build_a_libcloud_cloud_that_offers_its_priced_sizes_and_launches_in_the_zone(
    moto_port: int, moto_namespace: None
) -> None:
    from broker.config.providers import build_providers

    (provider,) = build_providers(_ec2_settings(moto_port, cloud_retry_attempts=4, broker_id="from-settings"))
    assert isinstance(provider, LibcloudProvider) and provider.name == "ec2" and provider.retry.attempts == 4
    offerings = provider.offerings(NOW)
    assert sorted((o.instance_type, o.accelerator, o.accelerator_count, o.zone, o.hourly_usd) for o in offerings) == [
        ("g5.12xlarge", "A10G", 4, "us-east-1a", Decimal("5.672")),
        ("g5.12xlarge", "A10G", 4, "us-east-1b", Decimal("5.672")),
        ("g5.xlarge", "A10G", 1, "us-east-1a", Decimal("1.006")),
        ("g5.xlarge", "A10G", 1, "us-east-1b", Decimal("1.006")),
    ]
    zone_b = next(o for o in offerings if o.zone == "us-east-1b" and o.instance_type == "g5.xlarge")
    inst = provider.launch(ContractEnv(provider=provider, offering=zone_b, broker_id="from-settings").request())
    node = provider._node(inst.id)
    assert node is not None and node.extra["availability"] == "us-east-1b"
    assert [i.id for i in provider.list_instances()] == [inst.id]
    provider.terminate(inst.id)


def test_libcloud_settings_refuse_a_malformed_gpu_spec_naming_the_variable() -> None:
    from broker.config.providers import build_providers

    with pytest.raises(ValueError, match=r"OVERSPILL_LIBCLOUD_GPUS\['g5.xlarge'\].*accelerator\[:count\]"):
        build_providers(_ec2_settings(1, libcloud_gpus={"g5.xlarge": "A10G:many"}))


def test_libcloud_calls_time_out_and_are_retried_a_bounded_number_of_times(silent_endpoint: str) -> None:
    from broker.config.providers import build_providers

    port = int(silent_endpoint.rsplit(":", 1)[1])
    (hung,) = build_providers(_ec2_settings(port, cloud_retry_attempts=2, cloud_timeout_seconds=0.3))
    assert isinstance(hung, LibcloudProvider)
    started = time.monotonic()
    with pytest.raises(Throttled):
        hung.list_instances()
    assert time.monotonic() - started < 5 and hung.retry.attempts_made == 2


# -- retries -------------------------------------------------------------------------------------------------------


class FlakyOpenStackDriver(FakeOpenStackDriver):
    """OpenStack-shaped, with the next calls of a name failing with queued errors; `lose_create` makes the next
    create_node carry out the create and then lose its answer (a read timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[str, list[BaseException]] = {}
        self.lose_create = False
        self.list_calls = 0

    def _next_failure(self, call: str) -> None:
        queued = self.failures.get(call)
        if queued:
            raise queued.pop(0)

    def list_nodes(self) -> list[Node]:
        self.list_calls += 1
        self._next_failure("list_nodes")
        return super().list_nodes()

    def create_node(self, name: str, size: NodeSize, image: NodeImage, **kwargs: Any) -> Node:  # type: ignore[override]
        self._next_failure("create_node")
        node = super().create_node(name, size, image, **kwargs)
        if self.lose_create:
            self.lose_create = False
            raise requests.ReadTimeout("HTTPConnectionPool(host='nova', port=8774): Read timed out. (read timeout=1)")
        return node


def _flaky(attempts: int = 3) -> tuple[LibcloudProvider, FlakyOpenStackDriver, list[float]]:
    from providers.retry import RetryPolicy

    driver = FlakyOpenStackDriver()
    slept: list[float] = []
    provider = LibcloudProvider(
        driver,
        name="os",
        broker_id=BROKER_ID,
        image_id="glance-uuid",
        location_for=lambda o: o.zone,
        zones=("nova",),
        prices={"gpu.l4": Decimal("1")},
        retry=RetryPolicy(attempts=attempts, sleep=slept.append),
    )
    return provider, driver, slept


def test_transient_failures_are_retried_with_backoff_and_a_definitive_answer_is_not() -> None:
    provider, driver, slept = _flaky()
    driver.failures["list_nodes"] = [BaseHTTPError(503, "Service Unavailable"), requests.ConnectionError("reset")]
    assert provider.list_instances() == []
    assert driver.list_calls == 3 and len(slept) == 2 and provider.retry.retries_made == 2
    assert all(0 <= pause <= provider.retry.cap_seconds for pause in slept)

    offering = provider.offerings(NOW)[0]
    driver.failures["create_node"] = [BaseHTTPError(500, "No valid host was found. Insufficient compute resources")]
    calls_before = driver.list_calls
    with pytest.raises(InsufficientCapacity):
        provider.launch(ContractEnv(provider=provider, offering=offering).request())
    assert driver.calls == [] and driver.list_calls == calls_before + 1  # one look, one create, no retry

    driver.failures["list_nodes"] = [BaseHTTPError(503, "busy")] * 3
    with pytest.raises(Throttled):  # attempts are bounded: the third failure is the caller's
        provider.list_instances()


def test_a_create_whose_answer_was_lost_is_found_by_its_token_on_the_retry() -> None:
    provider, driver, slept = _flaky()
    offering = provider.offerings(NOW)[0]
    request = ContractEnv(provider=provider, offering=offering).request()
    driver.lose_create = True
    inst = provider.launch(request)
    assert len(driver.calls) == 1, "the retry found the node the lost call made instead of creating another"
    assert inst.launch_token == request.launch_token and len(slept) == 1
    assert [i.id for i in provider.list_instances()] == [inst.id]


def test_a_429_retry_after_is_honoured_within_the_cap_and_handed_back_beyond_it() -> None:
    provider, driver, slept = _flaky()
    soon = RateLimitReachedError(headers={"retry-after": "1"})
    driver.failures["list_nodes"] = [soon]
    provider.list_instances()
    assert slept and slept[0] >= 1.0
    later = RateLimitReachedError(headers={"retry-after": "60"})
    driver.failures["list_nodes"] = [later]
    with pytest.raises(Throttled):
        provider.list_instances()
    assert provider.retry.deferred == 1 and len(slept) == 1
