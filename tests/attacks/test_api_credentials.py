"""Attacks on how a request presents its key.

- Two credentials in one request: the rate limiter read the last `X-API-Key` header while authentication read the
  first, so a guess sent next to a verified key was hashed without drawing on the address's bucket. Now one
  function reads the key for both, and `Authorization` or `X-API-Key` twice, or both with different keys, is a 400
  naming the header, before any key is hashed.
- Telling keys apart by the answer: unknown, wrong, revoked and malformed keys used to get different messages.
  They now all get the same 401.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from broker.api.auth import Role, create_key
from broker.app import create_app
from broker.config.settings import DEV_API_KEY
from broker.runtime import Runtime
from tests.conftest import MovableClock


@pytest.fixture
def limited(db_url: str, make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(
        db_url,
        rate_limit_per_second=1,
        rate_limit_burst=5,
        rate_limit_unverified_per_second=0.1,
        rate_limit_unverified_burst=3,
    )


@pytest.fixture
def api(limited: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=limited)) as c:
        yield c


def _guess(real: str) -> str:
    return f"ovs_{real.split('_')[1]}_{'g' * 32}"  # the real key's id, a wrong secret


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ([("Authorization", "Bearer {guess}"), ("Authorization", "Bearer {real}")], "Authorization"),
        ([("X-API-Key", "{guess}"), ("X-API-Key", "{real}")], "X-API-Key"),
        ([("X-API-Key", "{guess}"), ("Authorization", "Bearer {real}")], "X-API-Key"),
        ([("Authorization", "Bearer {real}"), ("X-API-Key", "{guess}")], "X-API-Key"),
    ],
)
def test_a_guess_smuggled_next_to_a_verified_key_is_a_400_naming_the_header(
    api: TestClient, limited: Runtime, clock: MovableClock, headers: list[tuple[str, str]], named: str
) -> None:
    real = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="real", now=clock())
    assert api.get("/v1/whoami", headers={"Authorization": f"Bearer {real}"}).status_code == 200  # verified, cached
    sent = [(name, value.format(real=real, guess=_guess(real))) for name, value in headers]
    for _ in range(6):  # more than the address's unverified-key burst: none of them reaches the hash
        answer = api.post("/v1/keys", json={"role": "admin"}, headers=sent)
        assert answer.status_code == 400, answer.text
        assert answer.json()["message"].startswith(f"{named}:"), answer.json()["message"]
    # the guess was never checked: the address's unverified-key bucket (3) had only the real key's first check
    # taken from it, so these two still fit
    other = create_key(limited.engine, tenant="acme", role=Role.ADMIN, name="other", now=clock())
    assert api.get("/v1/whoami", headers={"X-API-Key": other}).status_code == 200
    assert api.get("/v1/whoami", headers={"X-API-Key": _guess(other)}).status_code == 401


def test_the_same_key_in_both_headers_is_accepted(api: TestClient) -> None:
    both = {"Authorization": f"Bearer {DEV_API_KEY}", "X-API-Key": DEV_API_KEY}
    assert api.get("/v1/whoami", headers=both).status_code == 200


def test_duplicate_headers_are_refused_by_authentication_too(db_url: str, make_runtime: Callable[..., Runtime]) -> None:
    """Without the rate limiter in front (it can be turned off), authentication reads the key the same way."""
    rt = make_runtime(db_url, rate_limit_per_second=0)
    with TestClient(create_app(runtime=rt)) as c:
        answer = c.get("/v1/whoami", headers=[("X-API-Key", DEV_API_KEY), ("X-API-Key", DEV_API_KEY)])
    assert answer.status_code == 400 and answer.json()["message"].startswith("X-API-Key:"), answer.text


def test_unknown_wrong_revoked_and_malformed_keys_get_one_answer(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock
) -> None:
    rt = make_runtime(db_url, rate_limit_per_second=0)  # only the answers are compared here
    real = create_key(rt.engine, tenant="acme", role=Role.ADMIN, name="real", now=clock())
    revoked = create_key(rt.engine, tenant="acme", role=Role.ADMIN, name="gone", now=clock())
    with TestClient(create_app(runtime=rt)) as api:
        admin = {"Authorization": f"Bearer {real}"}
        assert api.get("/v1/whoami", headers={"Authorization": f"Bearer {revoked}"}).status_code == 200
        assert api.delete(f"/v1/keys/{revoked.split('_')[1]}", headers=admin).status_code == 200
        answers = []
        for key in (_guess(real), "ovs_nosuchid_" + "s" * 32, revoked, "ovs_x", "not-a-key"):
            r = api.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
            answers.append((r.status_code, r.json()["message"], r.headers.get("WWW-Authenticate")))
    assert len(set(answers)) == 1, answers
    assert answers[0] == (401, "invalid API key", "Bearer")


def test_refused_credentials_are_counted_not_attributed(api: TestClient, limited: Runtime) -> None:
    from sqlmodel import Session, select

    from broker.store.tables import AuditRefused

    api.post("/v1/jobs", json={}, headers={"Authorization": "Bearer ovs_devadmin_" + "w" * 30})
    with Session(limited.engine) as s:
        rows = s.exec(select(AuditRefused)).all()
    assert [(r.route, r.status, r.count) for r in rows] == [("/v1/jobs", 401, 1)]
