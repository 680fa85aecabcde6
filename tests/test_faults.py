"""Cloud faults: each cloud failing 20% of its API calls (capacity, throttling, 5xx, timeouts, lost answers) still
places every job exactly once, with bounded jittered retries and the capacity blocklist in use (tests/fault_scenario.py,
for AWS, GCP, Azure and the generic libcloud adapter); and the rules underneath: which failures each adapter retries,
and how the retry policy spaces, bounds and defers them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransportResponse
from azure.mgmt.core.exceptions import ARMErrorFormat
from botocore.exceptions import ClientError, ReadTimeoutError
from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth_exceptions

from broker.loop.place import MAX_LAUNCH_ATTEMPTS
from providers import azure, gcp
from providers.aws import transient
from providers.retry import RetryPolicy, retry_after_seconds
from tests.fault_scenario import CLOUDS, fault_cloud, run_fault_scenario
from tests.moto_server import running_moto_server

SEEDS = {"aws": 3, "gcp": 4, "azure": 2, "libcloud": 3}  # each sends capacity errors to launches with 30 jobs


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "RunInstances"
    )


def _response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp._content = json.dumps(body).encode()
    resp.headers.update({"Content-Type": "application/json", **(headers or {})})
    resp.url = "http://127.0.0.1/compute/v1/projects/p/zones/z/instances"
    resp.request = requests.Request("POST", resp.url).prepare()
    return resp


def _google(status: int, reason: str, message: str = "x") -> gexc.GoogleAPICallError:
    body = {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}
    return gexc.from_http_response(_response(status, body))


def _arm(status: int, code: str, headers: dict[str, str] | None = None, **kw: Any) -> HttpResponseError:
    body: dict[str, Any] = {"error": {"code": code, "message": kw.get("message", "x")}}
    if "details" in kw:
        body["error"]["details"] = kw["details"]
    response = RequestsTransportResponse(None, _response(status, body, headers))  # type: ignore[arg-type]
    return HttpResponseError(response=response, error_format=ARMErrorFormat)


def test_only_transient_failures_are_retried() -> None:
    assert transient(_client_error("RequestLimitExceeded", 503))
    assert transient(_client_error("InternalError", 500))
    assert transient(_client_error("SomethingNew", 502))
    assert transient(ReadTimeoutError(endpoint_url="http://x"))
    # EC2 sends a capacity error as HTTP 500: an answer to fail over on, not to repeat in the same zone
    assert not transient(_client_error("InsufficientInstanceCapacity", 500))
    assert not transient(_client_error("VcpuLimitExceeded", 400))
    assert not transient(_client_error("UnauthorizedOperation", 403))
    assert not transient(ValueError("not a cloud error"))


def test_gcp_retries_throttling_5xx_and_dropped_connections_never_a_stockout() -> None:
    assert gcp.transient(_google(429, "rateLimitExceeded"))
    assert gcp.transient(_google(503, "backendError"))
    assert gcp.transient(_google(500, "backendError"))
    assert gcp.transient(requests.exceptions.ReadTimeout("read timed out"))
    assert gcp.transient(requests.exceptions.ConnectionError("connection reset"))
    assert gcp.transient(gauth_exceptions.TransportError("token endpoint unreachable"))
    # Google reports a stockout with HTTP 503: still an answer (fail over), never a hiccup to repeat
    assert not gcp.transient(_google(503, "ZONE_RESOURCE_POOL_EXHAUSTED"))
    assert not gcp.transient(_google(403, "quotaExceeded"))
    assert not gcp.transient(_google(403, "forbidden"))
    assert not gcp.transient(_google(400, "invalid"))
    assert not gcp.transient(_google(409, "alreadyExists"))
    assert not gcp.transient(gauth_exceptions.RefreshError("invalid_grant"))


def test_azure_retries_throttling_5xx_and_dropped_connections_never_an_allocation_failure() -> None:
    assert azure.transient(_arm(429, "SubscriptionRequestsThrottled", {"Retry-After": "5"}))
    assert azure.transient(
        _arm(
            429,
            "OperationNotAllowed",
            message="The server rejected the request because too many requests have been received.",
            details=[{"code": "TooManyRequests", "target": "PutVM3Min", "message": "{}"}],
        )
    )
    assert azure.transient(_arm(500, "InternalExecutionError"))
    assert azure.transient(_arm(504, "GatewayTimeout"))
    assert azure.transient(ServiceRequestError("connection refused"))
    assert azure.transient(ServiceResponseError("read timed out"))
    assert not azure.transient(_arm(409, "SkuNotAvailable"))
    assert not azure.transient(_arm(500, "AllocationFailed"))  # a capacity code decides, whatever the status
    assert not azure.transient(
        _arm(409, "OperationNotAllowed", message="exceeding approved Total Regional Cores quota")
    )
    assert not azure.transient(_arm(403, "AuthorizationFailed"))
    assert not azure.transient(_arm(404, "ResourceNotFound"))
    assert not azure.transient(ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token"))


def test_retry_policy_is_bounded_and_jittered() -> None:
    slept: list[float] = []
    policy = RetryPolicy(attempts=4, base_seconds=0.5, cap_seconds=1.5, sleep=slept.append, rng=random.Random(4))
    calls = 0

    def always_throttled() -> None:
        nonlocal calls
        calls += 1
        raise _client_error("RequestLimitExceeded", 503)

    with pytest.raises(ClientError):
        policy.call(always_throttled, transient)
    assert calls == 4 and len(slept) == 3
    for n, pause in enumerate(slept, 1):
        assert 0 <= pause <= min(1.5, 0.5 * 2 ** (n - 1))
    assert len(set(slept)) == 3, "full jitter: pauses differ"
    assert policy.attempts_made == 4 and policy.retries_made == 3 and policy.slept_seconds == pytest.approx(sum(slept))

    calls = 0

    def no_capacity() -> None:
        nonlocal calls
        calls += 1
        raise _client_error("InsufficientInstanceCapacity", 500)

    with pytest.raises(ClientError):
        policy.call(no_capacity, transient)
    assert calls == 1 and len(slept) == 3, "a capacity answer is not retried"

    results = iter([_client_error("Unavailable", 503), "ok"])

    def flaky() -> str:
        item = next(results)
        if isinstance(item, Exception):
            raise item
        return item

    assert policy.call(flaky, transient) == "ok"


class _Throttled(Exception):
    def __init__(self, retry_after: float | None) -> None:
        self.retry_after = retry_after


def test_a_retry_after_within_the_cap_is_waited_out_and_a_longer_one_is_handed_back() -> None:
    slept: list[float] = []
    policy = RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=2.0, sleep=slept.append, rng=random.Random(1))
    hints = iter([_Throttled(1.5), _Throttled(None)])

    def answers() -> str:
        item = next(hints, None)
        if item is not None:
            raise item
        return "ok"

    def hint(exc: BaseException) -> float | None:
        return exc.retry_after if isinstance(exc, _Throttled) else None

    assert policy.call(answers, lambda e: isinstance(e, _Throttled), hint) == "ok"
    assert slept[0] == pytest.approx(1.5), "the server's Retry-After is the floor of the pause"
    assert slept[1] <= 0.02, "without a hint: the jittered backoff"
    calls = 0

    def asks_for_half_a_minute() -> None:
        nonlocal calls
        calls += 1
        raise _Throttled(30.0)

    with pytest.raises(_Throttled):
        policy.call(asks_for_half_a_minute, lambda e: isinstance(e, _Throttled), hint)
    assert calls == 1 and len(slept) == 2, "longer than the cap: no wait in this call, the next tick tries again"
    assert policy.deferred == 1 and policy.retries_made == 2


def test_retry_after_values_are_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
    assert retry_after_seconds("17", now=now) == 17.0
    assert retry_after_seconds(" 0.5 ", now=now) == 0.5
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0.0
    assert retry_after_seconds("-4", now=now) == 0.0
    assert retry_after_seconds("soon", now=now) is None
    assert retry_after_seconds(None) is None and retry_after_seconds("") is None


def test_adapters_read_the_retry_after_of_an_error_answer() -> None:
    assert azure._retry_after(_arm(429, "SubscriptionRequestsThrottled", {"Retry-After": "5"})) == 5.0
    assert azure._retry_after(_arm(500, "InternalExecutionError")) is None
    throttled = gexc.from_http_response(_response(429, {"error": {"code": 429, "message": "x"}}, {"Retry-After": "2"}))
    assert gcp._retry_after(throttled) == 2.0
    assert gcp._retry_after(requests.exceptions.ReadTimeout()) is None


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_job_placed_exactly_once_under_20_percent_cloud_faults(
    cloud: str, postgres: object, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moto = request.getfixturevalue("moto_url") if cloud in ("aws", "libcloud") else None
    with fault_cloud(cloud, rate=0.2, seed=SEEDS[cloud], workdir=tmp_path, moto_url=moto) as env:
        report = run_fault_scenario(
            env,
            db_url=postgres.create_database(),  # type: ignore[attr-defined]
            workdir=tmp_path,
            jobs=30,
        )
        proxy = env.proxy
    with capsys.disabled():
        print(f"\n{cloud}\n{report.table()}")
    assert not report.violations, report.violations
    assert report.placed == report.jobs
    assert sum(report.faults.values()) >= 10, "the proxy really failed calls"
    capacity_on_launch = proxy.stats.faults_of("capacity", proxy.dialect.launch_action)
    assert capacity_on_launch > 0, f"seed {SEEDS[cloud]} sends capacity errors to {report.launch_label}"
    # every capacity answer reached the broker un-retried and blocklisted its zone
    assert report.capacity_failures_seen == capacity_on_launch == report.blocklist_entries
    # no hot loop: one launch token is tried at most (adapter attempts) x (ticks that retry an unanswered launch)
    assert report.max_attempts_one_launch <= 3 * MAX_LAUNCH_ATTEMPTS
    assert report.attempts_per_placement < 2.0
    assert report.adapter_retries > 0 and report.backoff_seconds > 0, "retries were spaced by backoff"
