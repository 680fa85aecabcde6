"""Secrets: from the environment or AWS Secrets Manager (a moto server), refused in production when default or
empty, never in `repr(settings)`, API keys stored only as slow hashes and never logged."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlmodel import Session, select

from broker.api import auth
from broker.api.auth import KeyVerifier, Role, create_key
from broker.app import create_app
from broker.config.secrets import SecretError, fetch_secret, fetch_secret_json
from broker.config.settings import DEV_API_KEY, Settings
from broker.runtime import Runtime
from broker.store.tables import ApiKey, AuditEntry
from tests.builders import job_body
from tests.moto_server import CREDS, moto_client, running_moto_server

ROOT = Path(__file__).resolve().parent.parent
PROD_KEY = "ovs_prodadm_" + "k" * 40
CALLBACK = "c" * 40
METRICS = "m" * 40


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture
def aws_creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDS["aws_secret_access_key"])


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"bootstrap_api_key": DEV_API_KEY}, "development key is public"),
        ({"bootstrap_api_key": ""}, "OVERSPILL_BOOTSTRAP_API_KEY"),
        ({"bootstrap_api_key": "ovs_short_" + "x" * 16}, "at least 32"),
        ({"callback_secret": ""}, "OVERSPILL_CALLBACK_SECRET must be set"),
        ({"callback_secret": "tooshort"}, "at least 32"),
        ({"callback_secret": "changeme"}, "well-known default"),
        ({"libcloud_provider": "openstack", "libcloud_secret": ""}, "OVERSPILL_LIBCLOUD_SECRET"),
        ({"metrics_token": ""}, "OVERSPILL_METRICS_TOKEN must be set"),  # /metrics spans every tenant
        ({"metrics_token": "short"}, "OVERSPILL_METRICS_TOKEN must be at least 32"),
    ],
)
def test_production_refuses_default_or_empty_secrets(overrides: dict[str, str], says: str) -> None:
    values = {
        "env": "production",
        "bootstrap_api_key": PROD_KEY,
        "callback_secret": CALLBACK,
        "metrics_token": METRICS,
        **overrides,
    }
    with pytest.raises(ValidationError, match=says):
        Settings(**values)
    assert Settings(env="development", **{k: v for k, v in values.items() if k != "env"}).env == "development"


def test_production_starts_with_proper_secrets_and_hides_them() -> None:
    s = Settings(
        env="production",
        bootstrap_api_key=PROD_KEY,
        callback_secret=CALLBACK,
        metrics_token=METRICS,
        database_url="sqlite://",
    )
    text = repr(s) + str(s)
    assert PROD_KEY not in text and CALLBACK not in text and "k" * 40 not in text


def test_serve_refuses_to_start_in_production_with_the_development_key(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "OVERSPILL_ENV": "production", "OVERSPILL_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("overspill")), "tick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "refusing to start in production" in done.stderr and DEV_API_KEY not in done.stderr


def test_a_production_broker_does_not_start_with_an_open_metrics_endpoint(tmp_path: Path) -> None:
    """Everything else right, but no metrics token: /metrics would show every tenant to anyone reaching the port."""
    env = {
        "PATH": "/usr/bin:/bin",
        "OVERSPILL_ENV": "production",
        "OVERSPILL_DATA_DIR": str(tmp_path),
        "OVERSPILL_BOOTSTRAP_API_KEY": PROD_KEY,
        "OVERSPILL_CALLBACK_SECRET": CALLBACK,
        "COLUMNS": "400",  # the error's lines unwrapped
    }
    overspill = str(Path(sys.executable).with_name("overspill"))
    done = subprocess.run([overspill, "tick"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "refusing to start in production" in done.stderr and "OVERSPILL_METRICS_TOKEN must be set" in done.stderr


@pytest.mark.integration
def test_secrets_come_from_secrets_manager(moto_url: str, aws_creds: None) -> None:
    sm = moto_client("secretsmanager", "eu-west-1", moto_url)
    key_arn = sm.create_secret(Name="ovs-bootstrap", SecretString=PROD_KEY)["ARN"]
    doc_arn = sm.create_secret(Name="ovs-app", SecretString=json.dumps({"callback": CALLBACK, "n": 3}))["ARN"]
    s = Settings(
        env="production",
        bootstrap_api_key="",
        bootstrap_api_key_arn=key_arn,
        callback_secret_arn=f"{doc_arn}#callback",
        metrics_token=METRICS,
        secrets_endpoint_url=moto_url,
    )
    assert s.bootstrap_api_key == PROD_KEY and s.callback_secret == CALLBACK
    # the metrics token too (terraform/ generates it and passes OVERSPILL_METRICS_TOKEN_ARN), kept out of repr
    token_arn = sm.create_secret(Name="ovs-metrics", SecretString="m" * 48)["ARN"]
    scraped = Settings(metrics_token_arn=token_arn, secrets_endpoint_url=moto_url)
    assert scraped.metrics_token == "m" * 48 and "m" * 48 not in repr(scraped)
    # a value given directly wins over the ARN
    direct = Settings(
        callback_secret="d" * 40, callback_secret_arn=f"{doc_arn}#callback", secrets_endpoint_url=moto_url
    )
    assert direct.callback_secret == "d" * 40
    with pytest.raises(ValidationError, match=r"OVERSPILL_CALLBACK_SECRET_ARN: .*no JSON field 'nope'"):
        Settings(callback_secret_arn=f"{doc_arn}#nope", secrets_endpoint_url=moto_url)
    with pytest.raises(ValidationError, match=r"OVERSPILL_CALLBACK_SECRET_ARN: .*is not a string"):
        Settings(callback_secret_arn=f"{doc_arn}#n", secrets_endpoint_url=moto_url)
    missing = key_arn.replace("ovs-bootstrap", "ovs-missing")
    with pytest.raises(ValidationError, match=r"cannot read secret .*ResourceNotFoundException") as caught:
        Settings(callback_secret_arn=missing, secrets_endpoint_url=moto_url)
    assert CALLBACK not in str(caught.value)
    with pytest.raises(SecretError, match="not a Secrets Manager ARN"):
        fetch_secret("arn:aws:s3:::bucket", endpoint_url=moto_url)
    # the Lambda's database secret goes through the same reader (broker/serverless.py)
    assert fetch_secret_json(doc_arn, endpoint_url=moto_url) == {"callback": CALLBACK, "n": 3}
    with pytest.raises(SecretError, match="does not hold JSON") as caught:
        fetch_secret_json(key_arn, endpoint_url=moto_url)
    assert PROD_KEY not in str(caught.value)


def test_keys_are_stored_as_slow_salted_hashes_and_never_logged(rt: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    key = create_key(rt.engine, tenant="acme", role=Role.SUBMITTER, name="ci", now=rt.clock())
    key_id, secret = auth.parse_key(key)
    with Session(rt.engine) as s:
        row = s.get(ApiKey, key_id)
    assert row is not None and secret not in row.secret_hash and key not in row.secret_hash
    assert row.secret_hash == hashlib.scrypt(secret.encode(), salt=bytes.fromhex(row.salt), **auth._SCRYPT).hex()
    assert auth._SCRYPT["n"] >= 2**14, "scrypt cost of at least N=16384"
    with TestClient(create_app(runtime=rt)) as api:
        assert api.post("/v1/jobs", json=job_body(), headers={"Authorization": f"Bearer {key}"}).status_code == 202
        assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {key}x"}).status_code == 401
    with Session(rt.engine) as s:
        audit = s.exec(select(AuditEntry)).all()
    assert audit and all(secret not in repr(a) for a in audit)
    assert secret not in caplog.text and key not in caplog.text


def test_verification_compares_in_constant_time(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash comparison goes through hmac.compare_digest, and an unknown key id costs the same slow hash as a
    known one (no timing hint that an id exists)."""
    key = create_key(rt.engine, tenant="acme", role=Role.ADMIN, name="ct", now=rt.clock())
    compared: list[tuple[str, str]] = []
    hashed: list[str] = []
    real_compare, real_hash = auth.hmac.compare_digest, auth._hash

    def spy_compare(a: str, b: str) -> bool:
        compared.append((a, b))
        return real_compare(a, b)

    def spy_hash(secret: str, salt: str) -> str:
        hashed.append(salt)
        return real_hash(secret, salt)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy_compare)
    monkeypatch.setattr(auth, "_hash", spy_hash)
    verifier = KeyVerifier(rt.engine)
    wrong = key[:-1] + ("a" if key[-1] != "a" else "b")
    with pytest.raises(auth.InvalidKey):
        verifier.verify(wrong)
    assert len(compared) == 1 and len(hashed) == 1
    with pytest.raises(auth.InvalidKey):
        verifier.verify("ovs_nosuchid_" + "z" * 30)
    assert len(hashed) == 2, "an unknown id still pays the slow hash"
    assert verifier.verify(key).tenant == "acme"
