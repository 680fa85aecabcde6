"""Every request field that names a location, found from the served route table, refuses what escapes its tenant.

A location is anything the broker will later read, write, pull, resolve or call on a tenant's behalf: a checkpoint
URI, a container image, a secret reference, a report destination (a bucket and prefix, a directory, a webhook URL,
e-mail addresses), a budget's webhook. The attacks found by the security review each had their own test (in the
files named after them beside this one); this test makes the rule structural: it walks the OpenAPI spec the broker
serves, descends into nested models and lists, and collects every body or query field whose name says "location".
Each must be registered in `ATTACKS` below with a valid request and the hostile values to try, so a route or field
added later without confinement fails here until someone decides how it is attacked. Every hostile value must be a
4xx whose message names the field, and the same request with the field's valid value must succeed, so the refusal
is the field's and not some other part of the body.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import broker
from broker.runtime import Runtime
from tests.attacks.finance_parts import finance_client
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.scripted import admin_api

# whole words of a field's snake_case name (`max_hourly_usd` holds "url" only inside a word)
LOCATION_NAME = re.compile(
    r"(^|_)(uri|url|path|dir|destination|image|webhook|bucket|store|prefix|ref|email|host|endpoint)s?(_|$)", re.I
)

SECRET_PREFIX = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/demo/"
OTHER_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:overspill/jobs/other/db"


@dataclass(frozen=True)
class Attack:
    """How to attack one field: a valid body for the route (`body(api)` may create what the route needs, and returns
    the path to call with its `{id}` filled), the field's valid value, the hostile values, and the name the refusal
    must mention."""

    body: Callable[[TestClient], tuple[str, dict[str, Any]]]
    put: Callable[[dict[str, Any], Any], dict[str, Any]]
    valid: Any
    hostile: Callable[[Path], list[Any]]
    names: str
    finance: bool = False
    expect_ok: tuple[int, ...] = (200, 201, 202)


def _set(key: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    return lambda body, value: {**body, key: value}


def _secret_at(key: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    if key == "secrets":
        return lambda body, ref: {**body, "secrets": [{"env": "TOKEN", "source": "aws-secretsmanager", "ref": ref}]}
    return lambda body, ref: {**body, key: {"source": "aws-secretsmanager", "ref": ref}}


def _checkpoints(root: Path) -> list[str]:
    area = f"file://{root}/tenants/demo"
    return [
        f"file://{root}/../../etc/passwd",
        f"{area}/runs/../../../x",
        f"{area}/%2e%2e/%2e%2e/etc/passwd",
        f"file://{root}/",  # every tenant's checkpoints
        f"file://{root}/tenants/other/jobs/job_1/checkpoint/",
        f"{area}/mailbox/report.json",  # reserved for instance reports
        f"{area}/runs/a%00b",
        "file:///etc/passwd",
        f"file://{Path(broker.__file__).parent}/app.py",
        "s3://someone-elses-bucket/x",
        "https://evil.example.com/tenants/demo/x",
    ]


def _images(_: Path) -> list[str]:
    return [
        "--privileged",
        "-v",
        "img --privileged",
        "img;id",
        "$(id)",
        "ghcr.io/../x",
        "a b",
        "img\x00",
        "-",
        "x" * 400,
    ]


def _secret_refs(_: Path) -> list[str]:
    return [OTHER_SECRET, SECRET_PREFIX, SECRET_PREFIX + "x/../../other/db", "arn:aws:secretsmanager:x:1:secret:root"]


def _webhooks(_: Path) -> list[str]:
    return [
        "http://127.0.0.1:8080/admin",
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://[::1]/",
        "http://10.0.0.7/",
        "http://0x7f000001/",
        "http://user:pw@127.0.0.1/",
        "file:///etc/passwd",
        "gopher://example.com/",
        "https://example.com/\r\nX-Injected: 1",
    ]


def _emails(_: Path) -> list[list[str]]:
    return [["ops@example.com\r\nBcc: thief@example.net"], ["not an address"], ["a@b\x00.example.com"]]


def _destinations(_: Path) -> list[dict[str, Any]]:
    return [
        {"type": "s3", "bucket": "ckpt-use1", "prefix": "overspill/job_victim"},  # a checkpoint bucket
        {"type": "s3", "bucket": "finance-reports", "prefix": "acme/monthly"},  # another tenant's reports
        {"type": "s3", "bucket": "finance-reports", "prefix": ""},
        {"type": "s3", "bucket": "finance-reports", "prefix": "demonstration"},
        {"type": "s3", "bucket": "finance-reports", "prefix": "demo/../acme"},
        {"type": "directory", "path": "../../etc"},
        {"type": "directory", "path": "/etc"},
        {"type": "directory", "path": "a\x00b"},
        {"type": "webhook", "url": "http://127.0.0.1:9/"},
        {"type": "webhook", "url": "http://169.254.169.254/latest/"},
        {"type": "email", "to": ["a@example.com\r\nBcc: b@example.net"]},
        {"type": "ftp", "url": "ftp://example.com/"},
    ]


VALID_DESTINATION = {"type": "s3", "bucket": "finance-reports", "prefix": "demo/monthly"}
SCHEDULE = {"name": "monthly", "cron": "0 6 1 * *", "format": "csv"}
RUN = {"period": "2026-10", "format": "csv"}
BUDGET = {"scope": "team", "name": "vision", "amount_usd": "1000"}


def _fixed(path: str, body: dict[str, Any]) -> Callable[[TestClient], tuple[str, dict[str, Any]]]:
    return lambda api: (path, body)


def _created(collection: str, body: dict[str, Any], patch: dict[str, Any]) -> Callable[[TestClient], tuple[str, Any]]:
    def make(api: TestClient) -> tuple[str, dict[str, Any]]:
        made = api.post(collection, json=body)
        assert made.status_code in (200, 201), made.text
        return f"{collection}/{made.json()['id']}", patch

    return make


def _job_attacks(method: str, path: str) -> dict[tuple[str, str, str], Attack]:
    job = job_body()
    return {
        (method, path, "checkpoint_uri"): Attack(
            _fixed(path, job), _set("checkpoint_uri"), "{root}/tenants/demo/runs/r1/", _checkpoints, "checkpoint_uri"
        ),
        (method, path, "image"): Attack(_fixed(path, job), _set("image"), "ghcr.io/acme/train:1.4", _images, "image"),
        (method, path, "secrets[].ref"): Attack(
            _fixed(path, job), _secret_at("secrets"), SECRET_PREFIX + "wandb", _secret_refs, "secrets[0].ref"
        ),
        (method, path, "registry_secret.ref"): Attack(
            _fixed(path, job), _secret_at("registry_secret"), SECRET_PREFIX + "reg", _secret_refs, "registry_secret.ref"
        ),
    }


ATTACKS: dict[tuple[str, str, str], Attack] = {
    **_job_attacks("post", "/v1/jobs"),
    **_job_attacks("post", "/v1/quotes"),
    ("post", "/v1/budgets", "webhook_url"): Attack(
        _fixed("/v1/budgets", BUDGET),
        _set("webhook_url"),
        "https://hooks.example.com/b",
        _webhooks,
        "webhook_url",
        finance=True,
    ),
    ("post", "/v1/budgets", "email_to"): Attack(
        _fixed("/v1/budgets", BUDGET), _set("email_to"), ["finops@example.com"], _emails, "email_to", finance=True
    ),
    ("patch", "/v1/budgets/{budget_id}", "webhook_url"): Attack(
        _created("/v1/budgets", BUDGET, {}),
        _set("webhook_url"),
        "https://hooks.example.com/b",
        _webhooks,
        "webhook_url",
        finance=True,
    ),
    ("patch", "/v1/budgets/{budget_id}", "email_to"): Attack(
        _created("/v1/budgets", BUDGET, {}),
        _set("email_to"),
        ["finops@example.com"],
        _emails,
        "email_to",
        finance=True,
    ),
    ("post", "/v1/report-schedules", "destination"): Attack(
        _fixed("/v1/report-schedules", SCHEDULE),
        _set("destination"),
        VALID_DESTINATION,
        _destinations,
        "destination",
        finance=True,
    ),
    ("patch", "/v1/report-schedules/{schedule_id}", "destination"): Attack(
        _created("/v1/report-schedules", SCHEDULE, {}),
        _set("destination"),
        VALID_DESTINATION,
        _destinations,
        "destination",
        finance=True,
    ),
    ("post", "/v1/report-runs", "destination"): Attack(
        _fixed("/v1/report-runs", RUN),
        _set("destination"),
        VALID_DESTINATION,
        _destinations,
        "destination",
        finance=True,
    ),
}


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return _resolve(spec, spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]) if ref else schema


def _location_fields(spec: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted names (`[]` for a list's items) of every property under `schema` whose name says location."""
    schema = _resolve(spec, schema)
    for branch in schema.get("anyOf", []) + schema.get("allOf", []) + schema.get("oneOf", []):
        yield from _location_fields(spec, branch, prefix)
    if "items" in schema:
        yield from _location_fields(spec, schema["items"], prefix + "[]")
    for name, sub in schema.get("properties", {}).items():
        dotted = f"{prefix}.{name}" if prefix else name
        if LOCATION_NAME.search(name):
            yield dotted
        yield from _location_fields(spec, sub, dotted)


def _inputs(spec: dict[str, Any]) -> set[tuple[str, str, str]]:
    found = set()
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                found |= {(method, path, f) for f in _location_fields(spec, body)}
            for param in op.get("parameters", []):
                if param.get("in") == "query" and LOCATION_NAME.search(param["name"]):
                    found.add((method, path, f"?{param['name']}"))
    return found


@pytest.fixture
def apis(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, tmp_path: Path
) -> tuple[TestClient, TestClient, Path]:
    """(admin client, finance client, the local checkpoint store's root) of a broker configured as an operator
    would: a checkpoint store, the tenant's secret prefix and its report destination."""
    root = tmp_path.parent / f"{tmp_path.name}-stores" / "use1"  # apart from the data dir (tmp_path)
    root.mkdir(parents=True)
    rt = make_runtime(
        db_url,
        checkpoint_stores={"aws/us-east-1": f"file://{root}/"},
        tenant_secret_prefixes={"demo": [SECRET_PREFIX]},
        report_destinations={"demo": ["s3://finance-reports/demo/"], "acme": ["s3://finance-reports/acme/"]},
    )
    return admin_api(rt), finance_client(rt, clock()), root


def _message(answer: Any) -> str:
    body = answer.json()
    return str(body.get("message") or body.get("detail") or body)


def test_every_location_input_in_the_route_table_is_registered_here(apis: tuple[TestClient, TestClient, Path]) -> None:
    spec = apis[0].get("/openapi.json").json()
    found = _inputs(spec)
    assert ("post", "/v1/jobs", "checkpoint_uri") in found and ("post", "/v1/jobs", "secrets[].ref") in found
    missing = sorted(found - set(ATTACKS))
    assert not missing, f"fields naming a location with no attack registered in ATTACKS: {missing}"
    stale = sorted(set(ATTACKS) - found)
    assert not stale, f"ATTACKS names fields the route table no longer has: {stale}"


@pytest.mark.parametrize("key", sorted(ATTACKS), ids=lambda k: f"{k[0]} {k[1]} {k[2]}")
def test_each_location_input_refuses_what_escapes_its_tenant(
    apis: tuple[TestClient, TestClient, Path], key: tuple[str, str, str]
) -> None:
    admin, finance, root = apis
    api = finance if ATTACKS[key].finance else admin
    attack = ATTACKS[key]
    method = key[0].upper()
    path, body = attack.body(api)
    valid = attack.valid.replace("{root}", f"file://{root}") if isinstance(attack.valid, str) else attack.valid
    accepted = api.request(method, path, json=attack.put(body, valid))
    assert accepted.status_code in attack.expect_ok, (key, "the valid value is refused", accepted.text)
    for value in attack.hostile(root):
        answer = api.request(method, path, json=attack.put(body, value))
        assert 400 <= answer.status_code < 500, (key, value, answer.status_code, answer.text)
        assert answer.status_code != 404 and answer.status_code != 401, (key, value, answer.text)
        message = _message(answer)
        leaf = attack.names.rsplit(".", 1)[-1]
        assert attack.names.split("[")[0] in message or leaf in message, (key, value, message)
