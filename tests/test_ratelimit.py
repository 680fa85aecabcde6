"""Per-key rate limiting: a token bucket per presented key, 429 with Retry-After, health checks exempt, a guessed
key cannot drain a real one's bucket, and unverified keys are also limited per client address."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.app import create_app
from broker.auth import Role, create_key
from broker.loop.tick import tick
from broker.ratelimit import TokenBuckets
from broker.runtime import Runtime
from tests.conftest import MovableClock


def test_token_bucket_refills_at_its_rate() -> None:
    now = [100.0]
    buckets = TokenBuckets(rate=2.0, burst=3, clock=lambda: now[0])
    assert [buckets.take(b"k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take(b"k") == pytest.approx(0.5)  # one token comes back every 0.5 s
    assert buckets.take(b"other") == 0.0, "buckets are per key"
    now[0] += 0.5
    assert buckets.take(b"k") == 0.0
    now[0] += 60
    assert [buckets.take(b"k") for _ in range(4)][-1] > 0, "refill stops at the burst size"


def test_bucket_memory_is_bounded() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1, max_buckets=3, clock=lambda: 0.0)
    for i in range(10):
        buckets.take(str(i).encode())
    assert len(buckets._buckets) == 3


@pytest.fixture
def limited(tmp_path: Path, make_runtime: Callable[..., Runtime], clock: MovableClock) -> Runtime:
    rt = make_runtime(f"sqlite:///{tmp_path / 'rl.db'}", rate_limit_per_second=0.5, rate_limit_burst=3)
    tick(rt, clock())
    return rt


def test_a_key_over_its_limit_gets_429_with_retry_after(limited: Runtime, clock: MovableClock) -> None:
    key = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    other = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="b", now=clock())
    with TestClient(create_app(runtime=limited)) as api:
        auth = {"Authorization": f"Bearer {key}"}
        assert [api.get("/v1/jobs", headers=auth).status_code for _ in range(3)] == [200, 200, 200]
        refused = api.get("/v1/jobs", headers=auth)
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "2"  # 0.5 tokens/s: a token in 2 s
        assert "rate limit" in refused.json()["message"] and "this API key" in refused.json()["message"]
        assert api.get("/v1/jobs", headers={"X-API-Key": other}).status_code == 200, "another key is unaffected"
        assert all(api.get("/healthz").status_code == 200 for _ in range(10)), "health checks are exempt"


def test_guessing_keys_is_limited_per_address_and_cannot_drain_a_real_key(
    limited: Runtime, clock: MovableClock
) -> None:
    key = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="a", now=clock())
    key_id = key.split("_")[1]
    with TestClient(create_app(runtime=limited)) as api:
        assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200  # now verified
        guesses = [
            api.get("/v1/jobs", headers={"Authorization": f"Bearer ovs_{key_id}_{n:032d}"}).status_code
            for n in range(5)
        ]
        assert guesses[:2] == [401, 401] and guesses[-1] == 429, guesses  # the address's bucket ran dry
        assert "client address" in api.get("/v1/jobs").json()["message"]  # no key at all: same address bucket
        # the real key (verified, so not charged to the address) still has its own tokens
        assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200
