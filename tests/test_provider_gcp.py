"""GCP provider tests: `providers.gcp.GcpProvider` through the real `google.cloud.compute_v1` clients (REST transport,
anonymous credentials) against the in-memory Compute Engine in `tests.gcp_compute_fake`.

Covers the provider contract suite, the spot fields, identity, image, disk and labels on the wire, idempotent
insert across a lost answer, launches that return as soon as the insert is accepted (the insert operation's outcome
read back by `get`/`get_many`, also after a restart), the typed error mapping (synchronous and in the insert
operation, organisation policy denials included), the adapter's bounded retries (transient failures only, the client
library's own retries off, a timeout on every call), a spot preemption end to end, stopped VMs reported lingering
until deleted, and the batched read the sync step makes every tick (`get_many`: the view `get` gives, from one paged
aggregated list and at most one preemption query per zone, counted on the fake's recorded requests; retries; VMs
just launched).
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from providers.base import (
    AuthError,
    BatchDescriber,
    ComputeProvider,
    Instance,
    InstanceState,
    InsufficientCapacity,
    InterruptionSource,
    InvalidRequest,
    NotFound,
    PolicyDenied,
    ProviderError,
    QuotaExceeded,
    Scope,
    Throttled,
    describe,
)
from providers.gcp import (
    BROKER_LABEL,
    CLOUD_PLATFORM_SCOPE,
    GcpProvider,
    instance_name,
    label_key,
    label_value,
    region_of,
    request_id,
)
from providers.model import CapacityType, Offering, Price, Tags
from providers.retry import RetryPolicy
from tests.gcp_compute_fake import GcpComputeFake
from tests.provider_contract import BROKER_ID, USER_DATA, ContractEnv, ProviderContract

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
ZONE = "us-central1-a"
IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def offering(
    instance_type: str = "n1-standard-8+2xnvidia-tesla-t4", capacity: CapacityType = CapacityType.SPOT
) -> Offering:
    gpus = 2 if "+" in instance_type else 1
    return Offering(
        provider="gcp",
        region="us-central1",
        zone=ZONE,
        instance_type=instance_type,
        accelerator="T4" if "t4" in instance_type else "A100",
        accelerator_count=gpus,
        gpu_memory_gib=16 if "t4" in instance_type else 40,
        vcpus=8,
        memory_gib=Decimal(30),
        capacity_type=capacity,
        price=Price(Decimal("0.42"), "test", NOW),
    )


def fake_link(instance_id: str) -> str:
    zone, name = instance_id.split("/")
    return f"https://www.googleapis.com/compute/v1/projects/proj/zones/{zone}/instances/{name}"


def make_provider(fake: GcpComputeFake, *, endpoint: str | None = None, **kwargs: Any) -> GcpProvider:
    options = ClientOptions(api_endpoint=endpoint or fake.endpoint)
    creds = AnonymousCredentials()
    return GcpProvider(
        compute_v1.InstancesClient(transport="rest", client_options=options, credentials=creds),
        compute_v1.ZoneOperationsClient(transport="rest", client_options=options, credentials=creds),
        project=fake.project,
        broker_id=BROKER_ID,
        **{"image": IMAGE, **kwargs},
    )


def no_retries() -> RetryPolicy:
    return RetryPolicy(attempts=1)


def recorded_retries(attempts: int = 3) -> tuple[RetryPolicy, list[float]]:
    """A retry policy that records its pauses instead of sleeping them."""
    slept: list[float] = []
    return RetryPolicy(attempts=attempts, sleep=slept.append, rng=random.Random(7)), slept


@pytest.fixture
def fake() -> Iterator[GcpComputeFake]:
    with GcpComputeFake() as server:
        yield server


@pytest.fixture
def provider(fake: GcpComputeFake) -> GcpProvider:
    return make_provider(fake)


@pytest.fixture
def env(fake: GcpComputeFake, provider: GcpProvider) -> ContractEnv:
    return ContractEnv(provider=provider, offering=offering(), unknown_id=f"{ZONE}/ovs-never-issued-0")


STOCKOUT = "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available."


class TestGcpContract(ProviderContract):
    @pytest.fixture
    def env(self, fake: GcpComputeFake, provider: GcpProvider) -> ContractEnv:
        def make_foreign() -> str:
            fake.add_instance("us-central1-b", "someone-elses", {BROKER_LABEL: "another-broker"})
            return fake.add_instance(ZONE, "unlabelled-vm")

        def refuse_next_launch() -> None:
            fake.op_seconds = 0.05  # the insert is accepted; its operation fails a moment later
            fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", STOCKOUT, 503)

        return ContractEnv(
            provider=provider,
            offering=offering(),
            make_foreign=make_foreign,
            unknown_id=f"{ZONE}/ovs-never-issued-0",
            settle=lambda: time.sleep(fake.op_seconds + 0.02 if fake.op_seconds else 0),
            end_by_itself=fake.guest_shutdown,  # the start-up script's `shutdown -h now`: stopped, not deleted
            refuse_next_launch=refuse_next_launch,
        )


def test_is_a_compute_provider_and_an_interruption_source(provider: GcpProvider) -> None:
    assert isinstance(provider, ComputeProvider) and isinstance(provider, InterruptionSource)
    assert provider.name == "gcp"


def test_spot_n1_insert_carries_spot_scheduling_gpus_startup_script_and_request_id(
    fake: GcpComputeFake, provider: GcpProvider, env: ContractEnv
) -> None:
    req = env.request()
    inst = provider.launch(req)

    (call,) = fake.recorded("POST", "/instances")
    assert call.path == f"/compute/v1/projects/proj/zones/{ZONE}/instances"
    assert call.query["requestId"] == [request_id(req.launch_token)]
    body = call.body
    assert body["name"] == instance_name(req.launch_token) and inst.id == f"{ZONE}/{body['name']}"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}
    ]
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["startup-script"] == req.user_data == USER_DATA
    assert body["disks"][0]["initializeParams"] == {
        "sourceImage": IMAGE,
        "diskSizeGb": "200",
        "diskType": f"zones/{ZONE}/diskTypes/pd-balanced",
    }
    assert body["labels"][BROKER_LABEL] == label_value(BROKER_ID)
    assert "serviceAccounts" not in body, "no service account configured: none attached"

    assert inst.offering_key == "gcp/us-central1/us-central1-a/n1-standard-8+2xnvidia-tesla-t4/spot"
    assert inst.launch_token == req.launch_token and inst.state is InstanceState.PENDING  # accepted, not waited for
    assert provider.get(inst.id).state is InstanceState.RUNNING
    stored = fake.instance(inst.id)
    assert stored is not None and stored["guestAccelerators"][0]["acceleratorType"].startswith("https://")


def test_the_vm_runs_as_the_service_account_from_its_regions_image_with_the_sites_labels_and_disk(
    fake: GcpComputeFake,
) -> None:
    account = "overspill-jobs@proj.iam.gserviceaccount.com"
    regional = "projects/proj/global/images/train-usc1-2026"
    provider = make_provider(
        fake,
        images={"us-central1": regional},
        service_account=account,
        extra_labels={"cost-center": "ml-research", "overspill-broker": "ignored"},
        boot_disk_gb=300,
        boot_disk_type="pd-ssd",
    )
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    body = fake.recorded("POST", "/instances")[0].body
    assert body["serviceAccounts"] == [{"email": account, "scopes": [CLOUD_PLATFORM_SCOPE]}]
    assert body["disks"][0]["initializeParams"] == {
        "sourceImage": regional,
        "diskSizeGb": "300",
        "diskType": f"zones/{ZONE}/diskTypes/pd-ssd",
    }
    assert body["disks"][0]["autoDelete"] is True
    assert body["labels"]["cost-center"] == "ml-research"
    assert body["labels"][BROKER_LABEL] == label_value(BROKER_ID), "the broker's own label wins"
    assert provider.get(inst.id).tags.get("cost-center") is None  # labels are for billing, not the broker's tags

    elsewhere = make_provider(fake, image="", images={"us-central1": regional})
    east = dataclasses.replace(offering(), region="us-east1", zone="us-east1-b")
    with pytest.raises(InvalidRequest, match="us-east1"):
        elsewhere.launch(ContractEnv(provider=elsewhere, offering=east).request())


def test_bundled_gpu_machine_on_demand_has_no_guest_accelerators(fake: GcpComputeFake) -> None:
    provider = make_provider(fake)
    env = ContractEnv(provider=provider, offering=offering("a2-highgpu-1g", CapacityType.ON_DEMAND))
    inst = provider.launch(env.request())
    body = fake.recorded("POST", "/instances")[0].body
    assert "guestAccelerators" not in body
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/a2-highgpu-1g"
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    assert provider.get(inst.id).offering_key == "gcp/us-central1/us-central1-a/a2-highgpu-1g/on_demand"


def test_labels_are_sanitised_and_tags_round_trip_exactly(fake: GcpComputeFake, provider: GcpProvider) -> None:
    env = ContractEnv(provider=provider, offering=offering(), broker_id=BROKER_ID)
    base = env.request()
    tags = Tags(BROKER_ID, "Job_42.A", "plc:7", extra={"Cost Center": "R&D/ML", "9lives": "x" * 80})
    req = dataclasses.replace(base, tags=tags)
    inst = provider.launch(req)

    labels = fake.recorded("POST", "/instances")[0].body["labels"]
    assert labels == {
        "overspill-broker": "overspill-contract",
        "overspill-job": "job_42_a",
        "overspill-placement": "plc_7",
        "cost_center": "r_d_ml",
        "k-9lives": "x" * 63,
        "overspill-token": req.launch_token,
    }
    assert label_key("overspill:broker") == BROKER_LABEL
    assert provider.get(inst.id).tags == tags.as_dict()
    assert [i.tags for i in provider.list_instances()] == [tags.as_dict()]


@pytest.mark.parametrize(
    "token",
    ["0f3c2a9e8b7d4c6a9e1f2b3c4d5e6f70", "Mixed_Case.Token/with:odd chars", "-", "A" * 200, "plc-123"],
)
def test_instance_names_are_rfc1035_deterministic_and_distinct(token: str) -> None:
    name = instance_name(token)
    assert _RFC1035.match(name) and len(name) <= 63
    assert name == instance_name(token) and name != instance_name(token + "x")
    assert name.startswith("ovs-")


def test_insert_is_idempotent_across_a_lost_answer(fake: GcpComputeFake) -> None:
    fake.op_seconds = 0.05  # the insert operation runs a little: launch does not wait for it
    env = ContractEnv(provider=make_provider(fake), offering=offering())
    req = env.request()

    fake.drop_response("insert")  # the VM is made, but the broker crashes before it hears back (no retry)
    with pytest.raises(Throttled):
        make_provider(fake, retry=no_retries()).launch(req)

    again = make_provider(fake).launch(req)  # a fresh process: same requestId -> Google answers the same operation
    inserts = fake.recorded("POST", "/instances")
    assert [c.query["requestId"] for c in inserts] == [[request_id(req.launch_token)]] * 2
    assert again.state is InstanceState.PENDING
    assert not fake.recorded("POST", "/wait") and not fake.recorded("GET", "/operations"), "no wait on the insert"

    fake.forget_request_ids()  # past Google's idempotency window: the name is what protects us now (409)
    third = make_provider(fake).launch(req)
    assert again.id == third.id == f"{ZONE}/{instance_name(req.launch_token)}"
    assert [i.id for i in make_provider(fake).list_instances()] == [again.id]


def test_a_name_taken_by_another_token_is_refused(fake: GcpComputeFake, provider: GcpProvider) -> None:
    env = ContractEnv(provider=provider, offering=offering())
    req = env.request()
    provider.launch(req)
    stored = fake.instance(f"{ZONE}/{instance_name(req.launch_token)}")
    assert stored is not None
    for item in stored["metadata"]["items"]:
        if item["key"] == "overspill-launch-token":
            item["value"] = "someone-else"
    fake.instances[(ZONE, stored["name"])] = stored
    fake.forget_request_ids()  # a new insert of the name (not a replay of ours): 409, and the VM is read
    with pytest.raises(InvalidRequest, match="another launch token"):
        provider.launch(req)


SYNC_ERRORS = [
    (403, "quotaExceeded", "Quota exceeded for quota metric 'Queries'", QuotaExceeded),
    (429, "rateLimitExceeded", "Rate Limit Exceeded", Throttled),
    (403, "forbidden", "Required 'compute.instances.create' permission for 'projects/proj'", AuthError),
    (
        412,
        "conditionNotMet",
        "Constraint constraints/compute.vmExternalIpAccess violated for project 1234567890. Add instance "
        "projects/proj/zones/us-central1-a/instances/ovs-x to the constraint to use external IP with it.",
        PolicyDenied,
    ),
    (403, "orgpolicy", "Request denied by the organization policy constraints/gcp.resourceLocations.", PolicyDenied),
    (401, "authError", "Request had invalid authentication credentials.", AuthError),
    (400, "invalid", "Invalid value for field 'resource.machineType'", InvalidRequest),
    (503, "backendError", "Backend Error", Throttled),
]


@pytest.mark.parametrize(("status", "reason", "message", "expected"), SYNC_ERRORS)
def test_synchronous_errors_are_typed(
    fake: GcpComputeFake,
    env: ContractEnv,
    status: int,
    reason: str,
    message: str,
    expected: type[ProviderError],
) -> None:
    fake.fail("insert", status, reason, message)
    with pytest.raises(expected) as caught:
        make_provider(fake, retry=no_retries()).launch(env.request())
    assert type(caught.value) is expected and caught.value.provider == "gcp"
    if status == 401:  # google-auth refreshes the credential on a 401 first; that failure is what surfaces
        assert caught.value.detail == "InvalidOperation"
    else:
        assert message in str(caught.value)


def test_a_lost_insert_answer_is_retried_at_once_with_the_same_request_id(fake: GcpComputeFake) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    req = ContractEnv(provider=provider, offering=offering()).request()
    fake.drop_response("insert")  # carried out, answer lost: the adapter retries, Google answers from the requestId

    inst = provider.launch(req)

    inserts = fake.recorded("POST", "/instances")
    assert [c.query["requestId"] for c in inserts] == [[request_id(req.launch_token)]] * 2
    assert fake.created == {instance_name(req.launch_token): 1} and fake.replayed == 1
    assert inst.launch_token == req.launch_token and inst.state is InstanceState.PENDING
    assert retry.retries_made == 1 and len(slept) == 1


TRANSIENT = [(429, "rateLimitExceeded"), (503, "backendError"), (500, "backendError")]


@pytest.mark.parametrize(("status", "reason"), TRANSIENT)
def test_transient_failures_are_retried_with_backoff_and_bounded(
    fake: GcpComputeFake, status: int, reason: str
) -> None:
    retry, slept = recorded_retries(attempts=3)
    provider = make_provider(fake, retry=retry)
    fake.fail("insert", status, reason, count=2)
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert inst.state is InstanceState.PENDING
    assert len(fake.recorded("POST", "/instances")) == 3 and retry.retries_made == 2
    assert len(slept) == 2 and all(
        0 <= p <= min(retry.cap_seconds, retry.base_seconds * 2**n) for n, p in enumerate(slept)
    )

    fake.fail("insert", status, reason, count=3)  # one more than the policy allows: the broker gets it, typed
    with pytest.raises(Throttled):
        provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert len(fake.recorded("POST", "/instances")) == 6


def test_definitive_answers_are_never_retried(fake: GcpComputeFake) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    env = ContractEnv(provider=provider, offering=offering())
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources.", 503)
    with pytest.raises(InsufficientCapacity):
        provider.launch(env.request())
    fake.fail("insert", 403, "quotaExceeded", "Quota 'NVIDIA_T4_GPUS' exceeded.")
    with pytest.raises(QuotaExceeded):
        provider.launch(env.request())
    fake.fail("insert", 403, "forbidden", "Required 'compute.instances.create' permission")
    with pytest.raises(AuthError):
        provider.launch(env.request())
    assert len(fake.recorded("POST", "/instances")) == 3 and retry.retries_made == 0 and not slept


def test_the_client_librarys_own_retries_are_off(fake: GcpComputeFake) -> None:
    """The generated `instances.get` retries a 503 for up to 600 s by default; the adapter passes retry=None, so
    one policy attempt is one request."""
    provider = make_provider(fake, retry=no_retries())
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    fake.fail("get", 503, "backendError", count=5)
    before = len(fake.recorded("GET", "/instances/" + inst.id.split("/")[1]))
    with pytest.raises(Throttled):
        provider.get(inst.id)
    assert len(fake.recorded("GET", "/instances/" + inst.id.split("/")[1])) == before + 1


def test_every_call_has_a_timeout(fake: GcpComputeFake, silent_endpoint: str) -> None:
    """An endpoint that accepts the connection and never answers costs `timeout` per attempt, not forever."""
    retry, _ = recorded_retries(attempts=2)
    provider = make_provider(fake, endpoint=silent_endpoint, timeout=0.3, retry=retry)
    started = time.monotonic()
    with pytest.raises(Throttled):
        provider.get(f"{ZONE}/ovs-anything")
    assert time.monotonic() - started < 5
    assert retry.attempts_made == 2


OPERATION_ERRORS = [
    (
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available to fulfill the "
        "request. Try a different zone, or try again later.",
        503,
        InsufficientCapacity,
    ),
    (
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "The zone 'projects/proj/zones/us-central1-a' does not have enough resources available to fulfill the "
        "request. '(resource type:compute)'.",
        503,
        InsufficientCapacity,
    ),
    ("QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' exceeded. Limit: 0.0 in region us-central1.", 403, QuotaExceeded),
    (
        "CONDITION_NOT_MET",
        "Constraint constraints/compute.requireShieldedVm violated for project 1234567890. Secure Boot is not "
        "enabled in the 'shielded_instance_config' field.",
        412,
        PolicyDenied,
    ),
]
_SCOPES = {InsufficientCapacity: Scope.ZONE, QuotaExceeded: Scope.REGION, PolicyDenied: Scope.REQUEST}


@pytest.mark.parametrize(("code", "message", "http_status", "expected"), OPERATION_ERRORS)
def test_errors_in_an_insert_operation_already_done_are_raised_typed(
    fake: GcpComputeFake, env: ContractEnv, code: str, message: str, http_status: int, expected: type[ProviderError]
) -> None:
    fake.fail_operation(code, message, http_status)  # op_seconds 0: the insert's own answer is the failed operation
    req = env.request()
    with pytest.raises(expected) as caught:
        env.provider.launch(req)
    assert caught.value.detail == code and message in str(caught.value)
    assert caught.value.scope is _SCOPES[expected]
    later = env.provider.get(f"{ZONE}/{instance_name(req.launch_token)}")  # no VM: its insert operation answers
    assert later.state is InstanceState.FAILED and type(later.launch_error) is expected and later.released


@pytest.mark.parametrize(("code", "message", "http_status", "expected"), OPERATION_ERRORS)
def test_an_insert_refused_in_its_operation_after_launch_returned_reads_back_failed_with_the_typed_error(
    fake: GcpComputeFake, code: str, message: str, http_status: int, expected: type[ProviderError]
) -> None:
    """The insert is accepted and launch returns PENDING at once; the operation fails a moment later. `get` and
    `get_many` read it: FAILED with `launch_error` the typed error, so the broker fails over (and blocklists the
    right scope) as for a synchronous refusal; a restarted process learns it from the zone's operations."""
    fake.op_seconds = 600.0  # the operation ends only when the test says so: launch cannot have waited for it
    provider = make_provider(fake)
    req = ContractEnv(provider=provider, offering=offering()).request()
    fake.fail_operation(code, message, http_status)
    inst = provider.launch(req)
    assert inst.state is InstanceState.PENDING and inst.launch_error is None
    assert provider.get_many([inst.id])[inst.id].state is InstanceState.PENDING  # still running
    fake.finish_operations()

    for view in (provider.get(inst.id), provider.get_many([inst.id])[inst.id], make_provider(fake).get(inst.id)):
        assert isinstance(view, Instance) and view.state is InstanceState.FAILED and view.ended_at is not None
        assert type(view.launch_error) is expected and view.launch_error.detail == code
        assert message in str(view.launch_error) and view.launch_error.scope is _SCOPES[expected]
    restarted = make_provider(fake)  # no memory of the insert: its zone's insert operation for that VM is found
    before = len(fake.requests)
    (view,) = restarted.get_many([inst.id]).values()
    assert isinstance(view, Instance) and type(view.launch_error) is expected
    assert [r.query.get("filter") for r in fake.requests[before:] if r.path.endswith("/operations")] == [
        [f'(operationType = "insert") AND (targetLink = "{fake_link(inst.id)}")']
    ]
    assert view.released and not view.lingering, "a refused insert left no VM to delete"
    restarted.terminate(inst.id)  # converges: there is no VM


def test_a_failed_operation_read_is_unknown_for_that_vm_only(fake: GcpComputeFake) -> None:
    launcher = make_provider(fake)
    refused = launcher.launch(ContractEnv(provider=launcher, offering=offering()).request())
    ok = launcher.launch(ContractEnv(provider=launcher, offering=offering()).request())
    provider = make_provider(fake, retry=no_retries())
    with fake._lock:  # the first VM never came to be (its insert failed), the other one runs
        fake.instances.pop(tuple(refused.id.split("/")))  # type: ignore[arg-type]
    fake.fail("operations", 403, "forbidden", "Required 'compute.zoneOperations.list' permission")
    many = provider.get_many([refused.id, ok.id])
    assert isinstance(many[refused.id], AuthError), "what could not be learnt is unknown, not gone"
    assert isinstance(many[ok.id], Instance) and many[ok.id].state is InstanceState.RUNNING
    fake.fail("operations", 403, "forbidden", "Required 'compute.zoneOperations.list' permission")
    views = describe(provider, [refused.id, ok.id])
    assert isinstance(views[refused.id], AuthError) and isinstance(views[ok.id], Instance)
    assert provider.get_many([refused.id, ok.id]).keys() == {ok.id}, "once the read answers: that VM is gone"


def test_spot_preemption_end_to_end(fake: GcpComputeFake, provider: GcpProvider, env: ContractEnv) -> None:
    inst = provider.launch(env.request())
    other = provider.launch(env.request())
    assert provider.poll_interruptions() == []

    fake.preempt(inst.id)

    got = provider.get(inst.id)
    assert got.state is InstanceState.PREEMPTED and got.ended_at is not None
    listed = {i.id: i.state for i in provider.list_instances()}
    assert listed == {inst.id: InstanceState.PREEMPTED, other.id: InstanceState.RUNNING}
    filters = [c.query["filter"][0] for c in fake.recorded("GET", "/operations")]
    assert f'(operationType = "compute.instances.preempted") AND (targetLink = "{fake_link(inst.id)}")' in filters

    (notice,) = provider.poll_interruptions()
    assert (notice.instance_id, notice.provider, notice.kind) == (inst.id, "gcp", "interruption")
    assert notice.action_at is not None and notice.raw["operationType"] == "compute.instances.preempted"
    assert provider.poll_interruptions() == []  # acknowledged
    assert [n.instance_id for n in make_provider(fake).poll_interruptions()] == [inst.id]  # at-least-once on restart
    assert [n.instance_id for n in provider.preempted_since(ZONE, notice.at)] == [inst.id]

    provider.terminate(inst.id)
    with pytest.raises(NotFound):
        provider.get(inst.id)
    assert fake.instance(inst.id) is None and fake.instance(other.id) is not None


def test_a_guest_shutdown_is_terminated_not_preempted_and_lingers_until_deleted(
    fake: GcpComputeFake, provider: GcpProvider
) -> None:
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    fake.guest_shutdown(inst.id)
    got = provider.get(inst.id)
    assert got.state is InstanceState.TERMINATED and got.ended_at is not None
    assert got.lingering and not got.released, "a stopped VM keeps its boot disk: not gone until deleted"
    assert [(i.id, i.lingering) for i in make_provider(fake).list_instances()] == [(inst.id, True)]
    assert provider.poll_interruptions() == []
    fake.op_seconds = 30.0  # the delete takes a while: the VM shows STOPPING, being deleted
    provider.terminate(inst.id)
    assert provider.get(inst.id).released and [i.released for i in provider.list_instances()] == [True]


def test_termination_action_delete_reports_through_interruptions(fake: GcpComputeFake) -> None:
    provider = make_provider(fake, termination_action="DELETE")
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert fake.recorded("POST", "/instances")[0].body["scheduling"]["instanceTerminationAction"] == "DELETE"
    fake.preempt(inst.id)
    with pytest.raises(NotFound):
        provider.get(inst.id)
    assert [n.instance_id for n in provider.poll_interruptions()] == [inst.id]
    provider.terminate(inst.id)  # already gone: converges


def test_malformed_ids_are_not_found_and_terminate_converges(provider: GcpProvider) -> None:
    with pytest.raises(NotFound):
        provider.get("no-zone-here")
    provider.terminate("no-zone-here")


# ------------------------------------------------------------------------------------ batched reads (get_many)

AGGREGATED = "/compute/v1/projects/proj/aggregated/instances"
ZONE_B = "us-central1-b"


def offering_in(
    zone: str, instance_type: str = "n1-standard-8+2xnvidia-tesla-t4", capacity: CapacityType = CapacityType.SPOT
) -> Offering:
    return dataclasses.replace(offering(instance_type, capacity), zone=zone, region=region_of(zone))


def launch_in(provider: GcpProvider, zone: str = ZONE, **kwargs: Any) -> str:
    return provider.launch(ContractEnv(provider=provider, offering=offering_in(zone, **kwargs)).request()).id


def requests_since(fake: GcpComputeFake, before: int) -> list[tuple[str, str]]:
    """(method, path) of every request the fake answered since it had answered `before` (all calls have returned)."""
    return [(r.method, r.path) for r in fake.requests[before:]]


def test_get_many_answers_as_get_does_in_every_state(fake: GcpComputeFake, provider: GcpProvider) -> None:
    assert isinstance(provider, BatchDescriber)
    running = launch_in(provider)
    preempted = launch_in(provider)
    shut_down = launch_in(provider)
    on_demand = launch_in(provider, ZONE_B, instance_type="a2-highgpu-1g", capacity=CapacityType.ON_DEMAND)
    deleted = launch_in(provider)
    fake.preempt(preempted)
    fake.guest_shutdown(shut_down)
    provider.terminate(deleted)
    foreign = fake.add_instance(ZONE_B, "someone-elses", {BROKER_LABEL: "another-broker"})
    unlabelled = fake.add_instance(ZONE, "unlabelled-vm")
    present = [running, preempted, shut_down, on_demand]
    unknown = [deleted, foreign, unlabelled, f"{ZONE}/ovs-never-issued-0", "no-zone-here"]

    many = provider.get_many([*present, *unknown, running])

    assert set(many) == set(present), "gone, foreign, unknown and malformed ids are absent"
    for iid in present:
        assert many[iid] == provider.get(iid)  # the very same view: state, tags, offering, token, timestamps
    states = {iid: many[iid].state for iid in present}
    assert states == {
        running: InstanceState.RUNNING,
        preempted: InstanceState.PREEMPTED,
        shut_down: InstanceState.TERMINATED,
        on_demand: InstanceState.RUNNING,
    }
    assert many[preempted].ended_at is not None and many[on_demand].offering_key.endswith("/on_demand")
    with pytest.raises(NotFound):
        provider.get(deleted)
    assert provider.get(foreign).tags.get("overspill:broker") != BROKER_ID  # get reads any VM; get_many only ours

    views = describe(provider, [*present, *unknown])
    assert {iid: v for iid, v in views.items() if iid in present} == many
    assert all(isinstance(views[iid], NotFound) for iid in unknown)


def test_get_many_costs_one_request_per_list_page_and_one_preemption_query_per_zone_that_needs_it(
    fake: GcpComputeFake,
) -> None:
    fake.page_size = 5
    provider = make_provider(fake)
    ids = [launch_in(provider, (ZONE, ZONE_B)[n % 2]) for n in range(12)]

    before = len(fake.requests)
    many = provider.get_many(ids)
    calls = requests_since(fake, before)
    assert [many[i].state for i in ids] == [InstanceState.RUNNING] * 12
    assert calls == [("GET", AGGREGATED)] * 3, "12 VMs, 5 a page: 3 list requests, no per-VM GET, no operations"
    tokens = [r.query.get("pageToken") for r in fake.requests[before:]]
    assert tokens[0] is None and all(tokens[1:])
    assert all(
        r.query["filter"] == [f'labels.{BROKER_LABEL} = "{label_value(BROKER_ID)}"'] for r in fake.requests[before:]
    )

    fake.preempt(ids[0])  # zone a
    fake.preempt(ids[2])  # zone a
    fake.preempt(ids[1])  # zone b
    fake.guest_shutdown(ids[3])  # zone b, stopped spot VM: answered by zone b's query too
    before = len(fake.requests)
    many = provider.get_many(ids)
    calls = requests_since(fake, before)
    operations = [path for method, path in calls if path.endswith("/operations")]
    assert sorted(operations) == [
        f"/compute/v1/projects/proj/zones/{ZONE}/operations",
        f"/compute/v1/projects/proj/zones/{ZONE_B}/operations",
    ]
    assert len(calls) == 3 + 2
    assert [many[i].state for i in ids[:4]] == [InstanceState.PREEMPTED] * 3 + [InstanceState.TERMINATED]
    assert all(many[i] == provider.get(i) for i in ids[:4])

    before = len(fake.requests)
    for iid in ids:  # what the sync step cost before get_many: one GET per VM, and a query per stopped spot VM
        provider.get(iid)
    assert len(fake.requests) - before == 12 + 4


def test_get_many_retries_transient_failures_and_raises_a_definitive_one_for_the_whole_batch(
    fake: GcpComputeFake,
) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    ids = [launch_in(provider) for _ in range(3)]
    fake.page_size = 2

    fake.fail("list", 503, "backendError")
    assert set(provider.get_many(ids)) == set(ids)
    assert retry.retries_made == 1 and len(slept) == 1

    fake.fail("list", 503, "backendError", count=3)  # one more than the policy allows
    with pytest.raises(Throttled):
        provider.get_many(ids)

    retries = retry.retries_made
    fake.fail("list", 403, "forbidden", "Required 'compute.instances.list' permission for 'projects/proj'")
    with pytest.raises(AuthError):
        provider.get_many(ids)
    assert retry.retries_made == retries, "a definitive answer is not retried"
    fake.fail("list", 403, "forbidden", "Required 'compute.instances.list' permission for 'projects/proj'")
    views = describe(provider, ids)
    assert all(isinstance(v, AuthError) for v in views.values()), "the sync step learns nothing, loses nothing"

    fake.fail("list", 404, "notFound", "The resource 'projects/proj' was not found")
    with pytest.raises(ProviderError) as caught:
        provider.get_many(ids)
    assert not isinstance(caught.value, NotFound), "a missing project is not every VM gone"

    fake.unreachable = {ZONE}  # the list answers, but could not see the zone our VMs are in
    with pytest.raises(Throttled, match=ZONE):
        provider.get_many(ids)
    fake.unreachable = {ZONE_B}  # another zone: what we asked about is all there
    assert set(provider.get_many(ids)) == set(ids)
    fake.unreachable = set()

    fake.preempt(ids[0])
    fake.fail("operations", 429, "rateLimitExceeded")
    assert provider.get_many(ids)[ids[0]].state is InstanceState.PREEMPTED
    fake.fail("operations", 403, "forbidden", "Required 'compute.zoneOperations.list' permission")
    with pytest.raises(AuthError):
        provider.get_many(ids)


def test_a_vm_just_launched_that_the_list_does_not_show_yet_is_not_reported_gone(fake: GcpComputeFake) -> None:
    now = [NOW]
    provider = make_provider(fake, clock=lambda: now[0])
    fake.list_lag = 60.0  # list reads lag behind the insert; instances.get does not
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert provider.list_instances() == []

    before = len(fake.requests)
    many = provider.get_many([inst.id])
    zone, name = inst.id.split("/")
    assert requests_since(fake, before) == [
        ("GET", AGGREGATED),
        ("GET", f"/compute/v1/projects/proj/zones/{zone}/instances/{name}"),  # the one unlisted VM, read alone
    ]
    assert many == {inst.id: provider.get(inst.id)}

    fake.fail("get", 503, "backendError", count=3)  # the one VM's read fails too: its launch-time view answers
    assert provider.get_many([inst.id]) == {inst.id: inst}

    now[0] += timedelta(seconds=61)  # past the grace, absent from the list is gone
    assert provider.get_many([inst.id]) == {}
    fake.list_lag = 0.0
    assert provider.get_many([inst.id]) == {inst.id: provider.get(inst.id)}

    fake.list_lag = 60.0
    second = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert set(provider.get_many([second.id])) == {second.id}
    provider.terminate(second.id)  # ends the grace at once
    assert provider.get_many([second.id]) == {}


def test_a_spot_vm_reclaimed_with_termination_action_delete_is_gone_even_within_the_grace(
    fake: GcpComputeFake,
) -> None:
    provider = make_provider(fake, termination_action="DELETE")
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    fake.preempt(inst.id)
    assert provider.get_many([inst.id]) == {}
    with pytest.raises(NotFound):
        provider.get(inst.id)
