"""Azure provider tests: `providers.azure.AzureProvider` through the real `ComputeManagementClient` (bearer auth
over plain http, `retry_total=0`) against the in-memory ARM in `tests.azure_compute_fake`.

Covers the provider contract suite, the spot fields, custom data, identity, OS disk and tags on the wire,
idempotent create across a lost answer, launches that return as soon as ARM accepted the PUT (the create's outcome
read back from the VM's provisioning state: FAILED with the typed `launch_error`), the typed error mapping
(synchronous and in the long-running operation, policy denials included), the adapter's bounded retries (transient
failures only, Retry-After honoured), spot eviction end to end under both eviction policies, with relayed Scheduled
Events, stopped and deallocated VMs reported lingering until deleted, and the batched read the sync step makes every
tick (`get_many`: the view `get` gives, from the group's VM list joined with the subscription's
status-only list, counted on the fake's recorded requests; retries; races between the two reads; VMs just launched).
"""

from __future__ import annotations

import base64
import dataclasses
import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError
from azure.core.pipeline import PipelineRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

from providers.azure import NETWORK_API_VERSION, OFFERING_TAG, TOKEN_TAG, AzureProvider, vm_name
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
from providers.model import CapacityType, Offering, Price, Tags
from providers.retry import RetryPolicy
from tests.azure_compute_fake import AzureComputeFake
from tests.provider_contract import BROKER_ID, USER_DATA, ContractEnv, ProviderContract, contract_spec

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
SUB = "00000000-0000-0000-0000-000000000001"
SCOPE = "https://management.azure.com/.default"
RG = "overspill-burst"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/virtualNetworks/burst/subnets/gpu"
IMAGE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOverspillTestKeyOnly overspill@test"


class FakeCredential:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("fake-arm-token", int(time.time()) + 3600)


class PlainHttpBearerPolicy(ARMChallengeAuthenticationPolicy):
    """ARM bearer auth over plain http: azure-core refuses a bearer token on http unless `enforce_https` is off."""

    def on_request(self, request: PipelineRequest[Any]) -> None:
        request.context["enforce_https"] = False
        super().on_request(request)


def offering(capacity: CapacityType = CapacityType.SPOT) -> Offering:
    return Offering(
        provider="azure",
        region="eastus",
        zone="eastus",
        instance_type="Standard_NC24ads_A100_v4",
        accelerator="A100-80GB",
        accelerator_count=1,
        gpu_memory_gib=80,
        vcpus=24,
        memory_gib=Decimal(220),
        capacity_type=capacity,
        price=Price(Decimal("0.67877"), "test", NOW),
    )


def make_client(fake: AzureComputeFake) -> ComputeManagementClient:
    cred = FakeCredential()
    return ComputeManagementClient(
        cred,
        SUB,
        base_url=fake.url,
        credential_scopes=[SCOPE],
        retry_total=0,
        authentication_policy=PlainHttpBearerPolicy(cred, SCOPE),
    )


def make_provider(fake: AzureComputeFake, **kwargs: Any) -> AzureProvider:
    return AzureProvider(
        make_client(fake),
        resource_group=RG,
        location="eastus",
        broker_id=BROKER_ID,
        subnet_id=SUBNET,
        image_reference=IMAGE,
        ssh_public_key=SSH_KEY,
        **kwargs,
    )


def no_retries() -> RetryPolicy:
    return RetryPolicy(attempts=1)


def recorded_retries(attempts: int = 3) -> tuple[RetryPolicy, list[float]]:
    """A retry policy that records its pauses instead of sleeping them."""
    slept: list[float] = []
    return RetryPolicy(attempts=attempts, sleep=slept.append, rng=random.Random(7)), slept


@pytest.fixture
def fake() -> Iterator[AzureComputeFake]:
    with AzureComputeFake(SUB) as server:
        yield server


@pytest.fixture
def provider(fake: AzureComputeFake) -> AzureProvider:
    return make_provider(fake)


@pytest.fixture
def env(provider: AzureProvider) -> ContractEnv:
    return ContractEnv(provider=provider, offering=offering(), unknown_id="ovs-never-issued-0")


class TestAzureContract(ProviderContract):
    @pytest.fixture
    def env(self, fake: AzureComputeFake, provider: AzureProvider) -> ContractEnv:
        def make_foreign() -> str:
            fake.add_vm(RG, "someone-elses", "eastus", {"overspill:broker": "another-broker"})
            return fake.add_vm(RG, "untagged-vm", "eastus")

        return ContractEnv(
            provider=provider,
            offering=offering(),
            make_foreign=make_foreign,
            unknown_id="ovs-never-issued-0",
            end_by_itself=lambda name: fake.guest_shutdown(RG, name),  # `shutdown -h now`: stopped, not deallocated
            refuse_next_launch=lambda: fake.fail_async("AllocationFailed", "Allocation failed."),
        )


def test_is_a_compute_provider_and_an_interruption_source(provider: AzureProvider) -> None:
    assert isinstance(provider, ComputeProvider) and isinstance(provider, InterruptionSource)
    assert provider.name == "azure"


def test_spot_vm_body_carries_spot_fields_custom_data_managed_nic_and_tags(
    fake: AzureComputeFake, provider: AzureProvider, env: ContractEnv
) -> None:
    req = env.request()
    inst = provider.launch(req)

    (put,) = fake.recorded("PUT")
    name = vm_name(req.launch_token)
    assert put.path == f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"
    assert put.headers["authorization"] == "Bearer fake-arm-token" and put.query["api-version"]
    body = put.body
    props = body["properties"]
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]) == ("Spot", "Delete", {"maxPrice": -1})
    assert "identity" not in body, "no managed identity configured: none attached"
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC24ads_A100_v4"}
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == req.user_data == USER_DATA
    assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert props["storageProfile"]["imageReference"] == IMAGE
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    network = props["networkProfile"]
    assert network["networkApiVersion"] == NETWORK_API_VERSION
    (nic,) = network["networkInterfaceConfigurations"]
    assert nic["properties"]["deleteOption"] == "Delete"
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"] == {"id": SUBNET}
    assert body["tags"] == {
        **req.tags.as_dict(),
        TOKEN_TAG: req.launch_token,
        OFFERING_TAG: "azure/eastus/eastus/Standard_NC24ads_A100_v4/spot",
    }

    assert inst.id == name and inst.state is InstanceState.PENDING  # accepted (Creating), not waited for
    assert not fake.recorded("GET", "/operations/"), "the create's operation is never polled"
    assert provider.get(inst.id).state is InstanceState.RUNNING
    assert inst.tags == req.tags.as_dict()  # bookkeeping tags stay hidden
    assert inst.offering_key == offering().key
    stored = fake.vm(RG, name)
    assert stored is not None and "customData" not in stored["properties"]["osProfile"]


def test_max_price_is_the_jobs_hourly_cap_and_on_demand_has_no_spot_fields(
    fake: AzureComputeFake, provider: AzureProvider, env: ContractEnv
) -> None:
    spec = dataclasses.replace(contract_spec(), max_hourly_usd=Decimal("1.2345678"))
    capped = dataclasses.replace(env.request(), spec=spec)
    provider.launch(capped)
    assert fake.recorded("PUT")[0].body["properties"]["billingProfile"] == {"maxPrice": 1.23456}

    on_demand = ContractEnv(provider=provider, offering=offering(CapacityType.ON_DEMAND))
    inst = provider.launch(on_demand.request())
    props = fake.recorded("PUT")[1].body["properties"]
    assert not {"priority", "evictionPolicy", "billingProfile"} & props.keys()
    assert provider.get(inst.id).offering_key == "azure/eastus/eastus/Standard_NC24ads_A100_v4/on_demand"


def test_the_vm_runs_as_the_managed_identity_with_the_sites_tags_and_os_disk(fake: AzureComputeFake) -> None:
    identity = (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/jobs"
    )
    provider = make_provider(
        fake,
        managed_identity_id=identity,
        os_disk_gb=256,
        os_disk_type="Premium_LRS",
        extra_tags={"cost-center": "ml-research", "overspill:broker": "ignored"},
    )
    req = ContractEnv(provider=provider, offering=offering()).request()
    inst = provider.launch(req)
    (put,) = fake.recorded("PUT")
    assert put.body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {identity: {}}}
    os_disk = put.body["properties"]["storageProfile"]["osDisk"]
    assert (os_disk["diskSizeGB"], os_disk["managedDisk"], os_disk["deleteOption"]) == (
        256,
        {"storageAccountType": "Premium_LRS"},
        "Delete",
    )
    assert put.body["tags"]["cost-center"] == "ml-research"
    assert put.body["tags"]["overspill:broker"] == BROKER_ID, "the broker's own tag wins"
    assert provider.get(inst.id).tags["cost-center"] == "ml-research"


def test_tag_names_are_sanitised_and_tags_round_trip(fake: AzureComputeFake, provider: AzureProvider) -> None:
    env = ContractEnv(provider=provider, offering=offering())
    tags = Tags(BROKER_ID, "job-1", "plc-1", extra={"cost/center?": "R&D <ML>", "note": "n" * 300})
    req = dataclasses.replace(env.request(), tags=tags)
    inst = provider.launch(req)
    expected = {**tags.as_dict(), "cost_center_": "R&D <ML>", "note": "n" * 256}
    del expected["cost/center?"]
    assert inst.tags == expected == provider.get(inst.id).tags
    assert [i.tags for i in provider.list_instances()] == [expected]


def test_create_is_idempotent_across_a_lost_answer(fake: AzureComputeFake) -> None:
    fake.op_seconds = 0.05  # the create runs a little: launch polls the Azure-AsyncOperation
    env = ContractEnv(provider=make_provider(fake), offering=offering())
    req = env.request()

    fake.drop_response("put")  # the PUT is carried out, but the broker crashes before it hears back (no retry)
    with pytest.raises(Throttled):
        make_provider(fake, retry=no_retries()).launch(req)

    again = make_provider(fake).launch(req)  # a fresh process finds the VM by name and token: no second PUT
    assert again.id == vm_name(req.launch_token) and again.launch_token == req.launch_token
    assert len(fake.recorded("PUT")) == 1
    time.sleep(0.06)
    assert [i.id for i in make_provider(fake).list_instances()] == [again.id]
    assert make_provider(fake).launch(req).state is InstanceState.RUNNING


def test_a_name_taken_by_another_token_is_refused(fake: AzureComputeFake, provider: AzureProvider) -> None:
    req = ContractEnv(provider=provider, offering=offering()).request()
    fake.add_vm(RG, vm_name(req.launch_token), "eastus", {TOKEN_TAG: "someone-else"})
    with pytest.raises(InvalidRequest, match="another launch token"):
        provider.launch(req)


QUOTA_MESSAGE = (
    "Operation could not be completed as it results in exceeding approved Low Priority Cores quota. Additional "
    "details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0, Current Usage: 0, Additional "
    "Required: 24, (Minimum) New Limit Required: 24."
)
SYNC_ERRORS = [
    (
        409,
        "SkuNotAvailable",
        "The requested size for resource '...' is currently not available in location 'eastus' zones ''.",
        InsufficientCapacity,
    ),
    (409, "OperationNotAllowed", QUOTA_MESSAGE, QuotaExceeded),
    (409, "QuotaExceeded", "Operation results in exceeding quota limits of Core.", QuotaExceeded),
    (429, "TooManyRequests", "The request is being throttled.", Throttled),
    (403, "AuthorizationFailed", "The client does not have authorization to perform action 'write'.", AuthError),
    (
        403,
        "RequestDisallowedByPolicy",
        'Resource \'ovs-x\' was disallowed by policy. Policy identifiers: \'[{"policyAssignment":{"name":'
        '"Require a cost-center tag"}}]\'.',
        PolicyDenied,
    ),
    (401, "InvalidAuthenticationToken", "The access token is invalid.", AuthError),
    (400, "InvalidParameter", "The value of parameter imageReference.sku is invalid.", InvalidRequest),
    (500, "InternalServerError", "An internal execution error occurred.", Throttled),
]


@pytest.mark.parametrize(("status", "code", "message", "expected"), SYNC_ERRORS)
def test_synchronous_errors_are_typed(
    fake: AzureComputeFake, env: ContractEnv, status: int, code: str, message: str, expected: type[ProviderError]
) -> None:
    fake.fail("put", status, code, message)
    with pytest.raises(expected) as caught:
        make_provider(fake, retry=no_retries()).launch(env.request())
    assert type(caught.value) is expected and caught.value.detail == code and message in str(caught.value)
    assert not fake.vms


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        ("AllocationFailed", "Allocation failed. We do not have sufficient capacity for the requested VM size.", None),
        ("ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity in this zone.", None),
        (
            "OverconstrainedAllocationRequest",
            "Allocation failed. VM(s) with the following constraints cannot be met.",
            None,
        ),
        ("SkuNotAvailable", "The requested VM size is currently not available in location 'eastus'.", None),
        ("RequestDisallowedByPolicy", "Resource 'ovs-x' was disallowed by policy.", PolicyDenied),
        ("QuotaExceeded", "Operation results in exceeding quota limits of Core.", QuotaExceeded),
    ],
)
def test_a_create_refused_in_its_operation_reads_back_failed_with_the_typed_error(
    fake: AzureComputeFake, env: ContractEnv, code: str, message: str, expected: type[ProviderError] | None
) -> None:
    """The PUT is accepted and launch returns PENDING at once; the operation then fails, leaving the VM in
    provisioning state Failed: `get` and `get_many` read it FAILED with `launch_error` the typed error, and the VM
    lingers (it exists) until the broker deletes it."""
    expected = expected or InsufficientCapacity
    fake.fail_async(code, message)
    inst = env.provider.launch(env.request())
    assert inst.state is InstanceState.PENDING and inst.launch_error is None
    assert not fake.recorded("GET", "/operations/"), "launch did not poll the operation"
    for view in (env.provider.get(inst.id), env.provider.get_many([inst.id])[inst.id]):
        assert isinstance(view, Instance) and view.state is InstanceState.FAILED and view.lingering
        assert type(view.launch_error) is expected and view.launch_error.detail == code
        assert message in str(view.launch_error) and view.launch_error.scope is expected.scope
    env.provider.terminate(inst.id)  # what the broker does with it
    assert fake.vm(RG, inst.id) is None


def test_a_lost_put_answer_is_retried_at_once_as_an_update_of_the_same_vm(fake: AzureComputeFake) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    req = ContractEnv(provider=provider, offering=offering()).request()
    fake.drop_response("put")  # carried out, answer lost: the PUT is repeated, and a PUT of that name is an update

    inst = provider.launch(req)

    name = vm_name(req.launch_token)
    assert len(fake.recorded("PUT")) == 2 and fake.created == {name: 1} and fake.updated == {name: 1}
    assert inst.id == name and inst.launch_token == req.launch_token and inst.state is InstanceState.PENDING
    assert retry.retries_made == 1 and len(slept) == 1


TRANSIENT = [
    (500, "InternalExecutionError", "An internal execution error occurred. Please retry later."),
    (504, "GatewayTimeout", "The gateway did not receive a response from 'Microsoft.Compute'."),
]


@pytest.mark.parametrize(("status", "code", "message"), TRANSIENT)
def test_transient_failures_are_retried_with_backoff_and_bounded(
    fake: AzureComputeFake, status: int, code: str, message: str
) -> None:
    retry, slept = recorded_retries(attempts=3)
    provider = make_provider(fake, retry=retry)
    fake.fail("put", status, code, message, count=2)
    assert provider.launch(ContractEnv(provider=provider, offering=offering()).request()).state is InstanceState.PENDING
    assert len(fake.recorded("PUT")) == 3 and retry.retries_made == 2 and len(slept) == 2

    fake.fail("put", status, code, message, count=3)  # one more than the policy allows: the broker gets it, typed
    with pytest.raises(Throttled):
        provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert len(fake.recorded("PUT")) == 6


def test_a_429_waits_at_least_its_retry_after(fake: AzureComputeFake) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    fake.fail("put", 429, "SubscriptionRequestsThrottled", "Please try again after '1' seconds.")  # Retry-After: 1
    provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert slept and slept[0] >= 1.0, "ARM's Retry-After is the floor of the pause"


def test_definitive_answers_are_never_retried(fake: AzureComputeFake, env: ContractEnv) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    fake.fail("put", 409, "SkuNotAvailable", "The requested size is currently not available in location 'eastus'.")
    with pytest.raises(InsufficientCapacity):
        provider.launch(env.request())
    fake.fail("put", 409, "QuotaExceeded", "Operation results in exceeding quota limits of Core.")
    with pytest.raises(QuotaExceeded):
        provider.launch(env.request())
    fake.fail_async("AllocationFailed", "Allocation failed.")
    refused = provider.launch(env.request())  # accepted; refused in the operation, read back later
    assert isinstance(provider.get(refused.id).launch_error, InsufficientCapacity)
    assert len(fake.recorded("PUT")) == 3 and retry.retries_made == 0 and not slept


def test_launch_never_waits_for_the_create_operation(fake: AzureComputeFake) -> None:
    """However long the create runs, launch answers once ARM accepted the PUT, and never polls the operation: the
    VM's own provisioning state is what `get` follows."""
    fake.op_seconds = 600.0  # the operation ends only when the test says so
    provider = make_provider(fake, retry=no_retries())
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert inst.state is InstanceState.PENDING
    assert provider.get(inst.id).state is InstanceState.PENDING  # still Creating
    fake.finish_operations()
    assert provider.get(inst.id).state is InstanceState.RUNNING
    assert not fake.recorded("GET", "/operations/"), "no poll of the long-running operation"


def test_an_allocation_failure_learnt_late_is_still_a_capacity_answer(fake: AzureComputeFake) -> None:
    """The broker never heard of the create (its answer was lost) and the operation failed with AllocationFailed:
    the next launch of the token finds the VM Failed for lack of capacity, deletes it and raises that answer, without
    a PUT into a region that has just said no."""
    provider = make_provider(fake, retry=no_retries())
    req = ContractEnv(provider=provider, offering=offering()).request()
    fake.fail_async("AllocationFailed", "Allocation failed. We do not have sufficient capacity in this region.")
    fake.drop_response("put")
    with pytest.raises(Throttled):
        provider.launch(req)
    with pytest.raises(InsufficientCapacity) as later:
        make_provider(fake).launch(req)  # the next tick: the token's VM is there, Failed for lack of capacity
    assert later.value.detail == "AllocationFailed" and later.value.scope is Scope.ZONE
    assert len(fake.recorded("PUT")) == 1, "no PUT again into a region that has just said no"
    assert len(fake.recorded("DELETE")) == 1


def test_eviction_with_deallocate_policy_end_to_end(fake: AzureComputeFake) -> None:
    provider = make_provider(fake, eviction_policy="Deallocate")
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert fake.recorded("PUT")[0].body["properties"]["evictionPolicy"] == "Deallocate"

    fake.evict(RG, inst.id)

    got = provider.get(inst.id)
    assert got.state is InstanceState.PREEMPTED and "evicted" in got.detail
    assert got.lingering, "a deallocated VM keeps its disk: not gone until deleted"
    assert [(i.id, i.state) for i in provider.list_instances()] == [(inst.id, InstanceState.PREEMPTED)]
    provider.terminate(inst.id)
    with pytest.raises(NotFound):
        provider.get(inst.id)
    assert fake.vm(RG, inst.id) is None


def scheduled_events(
    name: str, event_type: str = "Preempt", event_id: str = "A123BC45-1234-5678-AB90-ABCDEF123456"
) -> dict[str, Any]:
    """A Scheduled Events document as the instance metadata service serves it (api-version 2020-07-01)."""
    return {
        "DocumentIncarnation": 2,
        "Events": [
            {
                "EventId": event_id,
                "EventType": event_type,
                "ResourceType": "VirtualMachine",
                "Resources": [name],
                "EventStatus": "Scheduled",
                "NotBefore": "Mon, 02 Nov 2026 08:00:30 GMT",
                "Description": "",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }


def test_eviction_with_delete_policy_through_relayed_scheduled_events(
    fake: AzureComputeFake, provider: AzureProvider, env: ContractEnv
) -> None:
    inst = provider.launch(env.request())
    assert provider.poll_interruptions() == []
    assert provider.relay_scheduled_event(inst.id, scheduled_events(inst.id, "Freeze")) is None
    assert provider.relay_scheduled_event(inst.id, scheduled_events("some-other-vm")) is None

    notice = provider.relay_scheduled_event(inst.id, scheduled_events(inst.id))
    assert notice is not None
    provider.relay_scheduled_event(inst.id, scheduled_events(inst.id)["Events"][0])  # relayed again: same EventId
    (polled,) = provider.poll_interruptions()
    assert (polled.instance_id, polled.provider, polled.kind) == (inst.id, "azure", "interruption")
    assert polled.action_at == datetime(2026, 11, 2, 8, 0, 30, tzinfo=UTC)
    assert provider.poll_interruptions() == []
    assert provider.get(inst.id).state is InstanceState.RUNNING  # warned, not yet reclaimed

    fake.evict(RG, inst.id)  # evictionPolicy Delete: the VM is gone

    got = provider.get(inst.id)
    assert got.state is InstanceState.PREEMPTED and got.ended_at == polled.action_at
    provider.terminate(inst.id)
    with pytest.raises(NotFound):
        provider.get(inst.id)


def test_a_guest_shutdown_is_terminated_not_preempted_and_lingers_until_deleted(
    fake: AzureComputeFake, provider: AzureProvider
) -> None:
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    fake.guest_shutdown(RG, inst.id)
    got = provider.get(inst.id)
    assert got.state is InstanceState.TERMINATED
    assert got.lingering, "stopped without deallocation: it keeps billing full compute until deleted"
    assert [(i.id, i.lingering) for i in make_provider(fake).list_instances()] == [(inst.id, True)]
    fake.op_seconds = 30.0  # the delete takes a while: provisioning state Deleting meanwhile
    provider.terminate(inst.id)
    assert provider.get(inst.id).released and [i.released for i in provider.list_instances()] == [True]


# ------------------------------------------------------------------------------------ batched reads (get_many)

GROUP_LIST = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines"
SUBSCRIPTION_LIST = f"/subscriptions/{SUB}/providers/Microsoft.Compute/virtualMachines"


def launch(provider: AzureProvider, capacity: CapacityType = CapacityType.SPOT) -> str:
    return provider.launch(ContractEnv(provider=provider, offering=offering(capacity)).request()).id


def requests_since(fake: AzureComputeFake, before: int) -> list[tuple[str, str]]:
    """(method, path) of every request the fake answered since it had answered `before` (all calls have returned)."""
    return [(r.method, r.path) for r in fake.requests[before:]]


def fail_provisioning(fake: AzureComputeFake, name: str, code: str, message: str) -> None:
    """Leave VM `name` in provisioning state Failed with that code and no power state (as a failed create does)."""
    with fake._lock:
        key = (RG.lower(), name.lower())
        fake.vms[key]["properties"]["provisioningState"] = "Failed"
        fake.vms[key]["_failure"] = {"code": code, "message": message}
        fake.power.pop(key, None)


def test_get_many_answers_as_get_does_in_every_state(fake: AzureComputeFake, provider: AzureProvider) -> None:
    assert isinstance(provider, BatchDescriber)
    running = launch(provider)
    deallocated = launch(make_provider(fake, eviction_policy="Deallocate"))
    shut_down = launch(provider)
    on_demand = launch(provider, CapacityType.ON_DEMAND)
    failed = launch(provider)
    evicted = launch(provider)  # evictionPolicy Delete, its Preempt event relayed: PREEMPTED after it is gone
    vanished = launch(provider)  # evictionPolicy Delete, no event relayed: gone
    deleting = launch(provider)
    deleted = launch(provider)
    fake.evict(RG, deallocated)
    fake.guest_shutdown(RG, shut_down)
    fail_provisioning(
        fake, failed, "VMExtensionProvisioningError", "VM has reported a failure when processing extension."
    )
    provider.relay_scheduled_event(evicted, scheduled_events(evicted))
    fake.evict(RG, evicted)
    fake.evict(RG, vanished)
    provider.terminate(deleted)
    fake.op_seconds = 60.0  # this delete runs on: the VM shows provisioning state Deleting
    provider.terminate(deleting)
    foreign = fake.add_vm(RG, "someone-elses", "eastus", {"overspill:broker": "another-broker"})
    untagged = fake.add_vm(RG, "untagged-vm", "eastus")
    present = [running, deallocated, shut_down, on_demand, failed, evicted, deleting]
    unknown = [vanished, deleted, foreign, untagged, "ovs-never-issued-0"]

    many = provider.get_many([*present, *unknown, running])

    assert set(many) == set(present), "gone, foreign and unknown ids are absent"
    for iid in present:
        assert many[iid] == provider.get(iid)  # the very same view: state, tags, offering, token, timestamps
    assert {iid: many[iid].state for iid in present} == {
        running: InstanceState.RUNNING,
        deallocated: InstanceState.PREEMPTED,
        shut_down: InstanceState.TERMINATED,
        on_demand: InstanceState.RUNNING,
        failed: InstanceState.FAILED,
        evicted: InstanceState.PREEMPTED,
        deleting: InstanceState.TERMINATED,
    }
    assert "VMExtensionProvisioningError" in many[failed].detail and "evicted" in many[deallocated].detail
    assert many[evicted].ended_at == datetime(2026, 11, 2, 8, 0, 30, tzinfo=UTC)
    assert many[running].tags == provider.get(running).tags and TOKEN_TAG not in many[running].tags
    assert provider.get(foreign).tags.get("overspill:broker") == "another-broker"  # get reads any VM; get_many ours

    views = describe(provider, [*present, *unknown])
    assert {iid: v for iid, v in views.items() if iid in present} == many
    assert all(isinstance(views[iid], NotFound) for iid in unknown)


def test_get_many_costs_one_request_per_page_of_the_two_lists(fake: AzureComputeFake) -> None:
    fake.page_size = 5
    provider = make_provider(fake)
    ids = [launch(provider) for _ in range(12)]
    for n in range(4):  # VMs in another resource group of the subscription: the status-only list pages them too
        fake.add_vm("someone-elses-group", f"vm-{n}", "eastus")

    before = len(fake.requests)
    many = provider.get_many(ids)
    calls = requests_since(fake, before)
    assert [many[i].state for i in ids] == [InstanceState.RUNNING] * 12
    assert calls == [("GET", GROUP_LIST)] * 3 + [("GET", SUBSCRIPTION_LIST)] * 4, "12 + 4 VMs, 5 a page"
    recorded = fake.requests[before:]
    assert all(r.query.get("statusOnly") == ["true"] for r in recorded[3:])
    assert not any("$expand" in r.query for r in recorded)
    assert [bool(r.query.get("$skiptoken")) for r in recorded] == [False, True, True, False, True, True, True]

    before = len(fake.requests)
    assert provider.get_many(["ovs-never-issued-0"]) == {}
    assert requests_since(fake, before) == [("GET", GROUP_LIST)] * 3, "nothing asked for is listed: no status list"

    before = len(fake.requests)
    for iid in ids:  # what the sync step cost before get_many: one GET per VM
        provider.get(iid)
    assert len(fake.requests) - before == 12


def test_the_status_only_list_carries_no_tags_and_expand_needs_a_filter(fake: AzureComputeFake) -> None:
    """The fake answers in ARM's shapes, so what the adapter must not rely on is not there: a status-only item has
    no tags, no priority, an empty hardware profile; a model has no instance view; `$expand=instanceView` needs a
    `$filter` (and the only one, a scale set's id, matches no standalone VM)."""
    name = launch(make_provider(fake))
    vms = make_client(fake).virtual_machines
    (status_only,) = list(vms.list_all(status_only="true"))
    assert (status_only.name, status_only.tags, status_only.priority) == (name, None, None)
    assert status_only.hardware_profile is not None and status_only.hardware_profile.vm_size is None
    codes = [s.code for s in status_only.instance_view.statuses]
    assert codes == ["ProvisioningState/succeeded", "PowerState/running"]
    (model,) = list(vms.list(RG))
    assert model.tags and model.priority == "Spot" and model.instance_view is None
    with pytest.raises(HttpResponseError, match="can only be specified if a valid \\$filter") as refused:
        list(vms.list(RG, expand="instanceView"))
    assert refused.value.status_code == 400
    scale_set = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/ss"
    assert list(vms.list(RG, filter=f"'virtualMachineScaleSet/id' eq '{scale_set}'", expand="instanceView")) == []


def test_get_many_retries_transient_failures_and_raises_a_definitive_one_for_the_whole_batch(
    fake: AzureComputeFake,
) -> None:
    retry, slept = recorded_retries()
    provider = make_provider(fake, retry=retry)
    ids = [launch(provider) for _ in range(3)]

    fake.fail("list", 500, "InternalExecutionError", "An internal execution error occurred. Please retry later.")
    assert set(provider.get_many(ids)) == set(ids)
    assert retry.retries_made == 1
    fake.fail("list_all", 429, "SubscriptionRequestsThrottled", "Please try again after '1' seconds.")
    assert set(provider.get_many(ids)) == set(ids)
    assert retry.retries_made == 2 and slept[-1] >= 1.0, "ARM's Retry-After is the floor of the pause"

    fake.fail("list_all", 504, "GatewayTimeout", count=3)  # one more than the policy allows
    with pytest.raises(Throttled):
        provider.get_many(ids)

    retries = retry.retries_made
    fake.fail("list_all", 403, "AuthorizationFailed", "The client does not have authorization to perform action.")
    with pytest.raises(AuthError):
        provider.get_many(ids)
    assert retry.retries_made == retries, "a definitive answer is not retried"
    fake.fail("list", 403, "AuthorizationFailed", "The client does not have authorization to perform action.")
    views = describe(provider, ids)
    assert all(isinstance(v, AuthError) for v in views.values()), "the sync step learns nothing, loses nothing"

    fake.fail("list", 404, "ResourceGroupNotFound", f"Resource group '{RG}' could not be found.")
    with pytest.raises(ProviderError) as caught:
        provider.get_many(ids)
    assert not isinstance(caught.value, NotFound), "a missing resource group is not every VM gone"


def test_a_vm_deleted_between_the_two_lists_is_read_alone_and_gone(fake: AzureComputeFake) -> None:
    launcher = make_provider(fake)
    kept, removed = launch(launcher), launch(launcher)
    provider = make_provider(fake)  # a fresh process: nothing launched moments ago to fall back on

    def delete_removed() -> None:
        fake.vms.pop((RG.lower(), removed.lower()))
        fake.power.pop((RG.lower(), removed.lower()), None)

    fake.then("list", delete_removed)
    before = len(fake.requests)
    many = provider.get_many([kept, removed])
    assert requests_since(fake, before) == [
        ("GET", GROUP_LIST),
        ("GET", SUBSCRIPTION_LIST),
        ("GET", f"{GROUP_LIST}/{removed}/instanceView"),  # listed, but no status: asked alone, 404
    ]
    assert set(many) == {kept} and many[kept] == provider.get(kept)


def test_a_vm_just_launched_that_the_list_does_not_show_yet_is_not_reported_gone(fake: AzureComputeFake) -> None:
    now = [NOW]
    provider = make_provider(fake, clock=lambda: now[0])
    fake.list_lag = 60.0  # list reads lag behind the PUT; a GET does not
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    assert provider.list_instances() == []

    before = len(fake.requests)
    many = provider.get_many([inst.id])
    assert requests_since(fake, before) == [("GET", GROUP_LIST), ("GET", f"{GROUP_LIST}/{inst.id}")]
    assert many == {inst.id: provider.get(inst.id)}

    fake.fail("get", 500, "InternalExecutionError", count=3)  # the one VM's read fails too: its launch-time view
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


def test_an_evicted_and_deleted_vm_with_a_relayed_preempt_event_stays_preempted_after_the_grace(
    fake: AzureComputeFake,
) -> None:
    now = [NOW]
    provider = make_provider(fake, clock=lambda: now[0])
    inst = provider.launch(ContractEnv(provider=provider, offering=offering()).request())
    provider.relay_scheduled_event(inst.id, scheduled_events(inst.id))
    fake.evict(RG, inst.id)
    now[0] += timedelta(seconds=61)
    many = provider.get_many([inst.id])
    assert many == {inst.id: provider.get(inst.id)} and many[inst.id].state is InstanceState.PREEMPTED
    provider.terminate(inst.id)
    assert provider.get_many([inst.id]) == {}
