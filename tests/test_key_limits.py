"""Keys cannot multiply a tenant's share (issue 32, Low), on SQLite and PostgreSQL: an admin holds at most
`max_keys_per_tenant` active keys (409 naming the setting beyond; revoking one makes room), and requests are limited
per tenant over all its keys as well as per key (429 naming the tenant's limit), without touching another tenant.
On PostgreSQL the buckets are the shared ones in the database, on SQLite this process's.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from tests.conftest import MovableClock

ADMIN = {"Authorization": f"Bearer {DEV_API_KEY}"}


def test_a_tenant_holds_at_most_max_keys_per_tenant_active_keys(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, max_keys_per_tenant=3)  # the bootstrap admin key is one of them
    beta_admin = create_key(rt.engine, tenant="beta", role=Role.ADMIN, name="b", now=clock())
    with TestClient(create_app(runtime=rt)) as c:
        made = [c.post("/v1/keys", json={"role": "submitter", "name": f"ci-{i}"}, headers=ADMIN) for i in range(2)]
        assert [r.status_code for r in made] == [201, 201]
        over = c.post("/v1/keys", json={"role": "submitter", "name": "one-too-many"}, headers=ADMIN)
        assert over.status_code == 409 and "OVERSPILL_MAX_KEYS_PER_TENANT=3" in over.json()["detail"]
        assert len(c.get("/v1/keys", headers=ADMIN).json()["items"]) == 3
        # another tenant's keys are its own count
        other = c.post("/v1/keys", json={"role": "submitter"}, headers={"Authorization": f"Bearer {beta_admin}"})
        assert other.status_code == 201
        # a revoked key makes room
        assert c.delete(f"/v1/keys/{made[0].json()['id']}", headers=ADMIN).status_code == 200
        assert c.post("/v1/keys", json={"role": "submitter", "name": "again"}, headers=ADMIN).status_code == 201


def test_requests_are_limited_per_tenant_over_all_its_keys(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(
        db_url,
        rate_limit_per_second=50,
        rate_limit_burst=50,
        rate_limit_unverified_per_second=50,
        rate_limit_unverified_burst=50,
        rate_limit_tenant_per_second=0.01,
        rate_limit_tenant_burst=8,
    )
    keys = [create_key(rt.engine, tenant="demo", role=Role.SUBMITTER, name=f"k{i}", now=clock()) for i in range(6)]
    beta = create_key(rt.engine, tenant="beta", role=Role.SUBMITTER, name="b", now=clock())
    with TestClient(create_app(runtime=rt)) as c:
        statuses = []
        for _ in range(3):  # 18 requests over 6 keys: 3 per key, far under each key's own limit
            for k in keys:
                statuses.append(c.get("/v1/jobs", headers={"Authorization": f"Bearer {k}"}).status_code)
        # each key's first request is unverified (no tenant known yet): the other 12 share the tenant's burst of 8
        assert statuses.count(200) == 6 + 8 and statuses.count(429) == 4, statuses
        refused = c.get("/v1/jobs", headers={"Authorization": f"Bearer {keys[0]}"})
        assert refused.status_code == 429 and "tenant demo" in refused.json()["detail"]
        assert int(refused.headers["retry-after"]) >= 1
        # another tenant is not touched
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {beta}"}).status_code == 200
        assert c.get("/v1/jobs", headers={"Authorization": f"Bearer {beta}"}).status_code == 200
