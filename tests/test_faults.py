"""Cloud faults: EC2 failing 20% of calls (capacity, throttling, 5xx, timeouts) still places every job exactly once,
with bounded jittered retries and the capacity blocklist in use (tests/fault_scenario.py); and the retry policy's
own rules."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from broker.loop.place import MAX_LAUNCH_ATTEMPTS
from providers.aws import transient
from providers.retry import RetryPolicy
from tests.fault_proxy import running_fault_proxy
from tests.fault_scenario import run_fault_scenario
from tests.moto_server import running_moto_server


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "RunInstances"
    )


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


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_every_job_placed_exactly_once_under_20_percent_cloud_faults(
    postgres: object, moto_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_fault_proxy(moto_url, rate=0.2, seed=3) as proxy:
        report = run_fault_scenario(
            db_url=postgres.create_database(),  # type: ignore[attr-defined]
            moto_url=moto_url,
            proxy=proxy,
            workdir=tmp_path,
            jobs=30,
        )
    with capsys.disabled():
        print("\n" + report.table())
    assert not report.violations, report.violations
    assert report.placed == report.jobs
    assert sum(report.faults.values()) >= 10, "the proxy really failed calls"
    capacity_on_launch = proxy.stats.faults_of("capacity", "RunInstances")
    assert capacity_on_launch > 0, "seed 3 sends capacity errors to RunInstances"
    # every capacity answer reached the broker un-retried and blocklisted its zone
    assert report.capacity_failures_seen == capacity_on_launch == report.blocklist_entries
    # no hot loop: one launch token is tried at most (adapter attempts) x (ticks that retry an unanswered launch)
    assert report.max_attempts_one_launch <= 3 * MAX_LAUNCH_ATTEMPTS
    assert report.attempts_per_placement < 2.0
    assert report.adapter_retries > 0 and report.backoff_seconds > 0, "retries were spaced by backoff"
