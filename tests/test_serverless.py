"""The Lambda entry point (broker.serverless) in-process, with the events AWS delivers: API Gateway HTTP API v2,
EventBridge Scheduler inputs, and SQS batches carrying EventBridge spot warnings; the database credentials from
Secrets Manager (moto); and concurrent cold starts migrating one real PostgreSQL database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from broker import serverless
from broker.config import secrets as serverless_secrets
from broker.config.settings import DEV_API_KEY
from broker.store.migrate import alembic_config
from tests.builders import job_body
from tests.moto_server import moto_client, running_moto_server
from tests.serverless_events import http_event, schedule_event, spot_warning, sqs_event, sqs_record

AUTH = {"Authorization": f"Bearer {DEV_API_KEY}"}
REGION = "us-east-1"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_container() -> Iterator[None]:
    serverless.reset()
    yield
    serverless.reset()


@pytest.fixture
def sqlite_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("OVERSPILL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OVERSPILL_DATABASE_URL", f"sqlite:///{tmp_path / 'lambda.db'}")
    monkeypatch.setenv("OVERSPILL_DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


def call(event: dict[str, Any]) -> dict[str, Any]:
    return serverless.handler(event, None)


def body_of(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


# -- API Gateway ------------------------------------------------------------------------------------------------------


def test_http_api_events_reach_the_app_with_auth_and_validation(sqlite_env: Path) -> None:
    health = call(http_event("GET", "/healthz"))
    assert health["statusCode"] == 200

    assert call(http_event("POST", "/v1/jobs", body=job_body()))["statusCode"] == 401
    bad = call(http_event("POST", "/v1/jobs", body=job_body(gpu_count=-1), headers=AUTH))
    assert bad["statusCode"] == 422
    assert "gpu_count" in body_of(bad)["message"]

    created = call(http_event("POST", "/v1/jobs", body=job_body(), headers={**AUTH, "Idempotency-Key": "k1"}))
    assert created["statusCode"] == 202, created
    job = body_of(created)
    listed = call(http_event("GET", "/v1/jobs", headers=AUTH, query={"state": "pending"}))
    assert [j["id"] for j in body_of(listed)["items"]] == [job["id"]]
    again = call(http_event("POST", "/v1/jobs", body=job_body(), headers={**AUTH, "Idempotency-Key": "k1"}))
    assert body_of(again)["id"] == job["id"]  # a retried request through the gateway is not a second job


def test_runtime_is_built_once_per_container(sqlite_env: Path) -> None:
    call(http_event("GET", "/healthz"))
    first = serverless.container()
    call(http_event("GET", "/healthz"))
    assert serverless.container() is first
    serverless.reset()
    call(http_event("GET", "/healthz"))
    assert serverless.container() is not first


# -- EventBridge Scheduler --------------------------------------------------------------------------------------------


def test_scheduled_price_refresh_and_tick_place_a_submitted_job(sqlite_env: Path) -> None:
    job = body_of(call(http_event("POST", "/v1/jobs", body=job_body(), headers=AUTH)))

    idle_tick = call(schedule_event("tick"))
    assert idle_tick["task"] == "tick" and idle_tick["ok"]
    assert "refresh_prices" not in idle_tick["counts"]  # prices have their own schedule
    assert idle_tick["counts"]["place_pending"] == 0  # no prices yet: nothing to place on

    refreshed = call(schedule_event("refresh_prices"))
    assert refreshed["task"] == "refresh_prices" and refreshed["pools"] > 0

    ticked = call(schedule_event("tick"))
    assert ticked["ok"], ticked["errors"]
    assert ticked["counts"]["place_pending"] == 1
    placed = body_of(call(http_event("GET", f"/v1/jobs/{job['id']}", headers=AUTH)))
    assert placed["state"] in ("starting", "running"), placed  # starting: its instance is not up yet


def test_the_reports_task_runs_due_report_schedules_and_unknown_tasks_fail(sqlite_env: Path) -> None:
    idle = call(schedule_event("reports"))
    assert idle == {"task": "reports", "reports": 0}  # no schedule stored yet
    with pytest.raises(ValueError, match="unknown task 'bogus'"):
        call(schedule_event("bogus"))


def test_unrecognised_events_are_refused(sqlite_env: Path) -> None:
    with pytest.raises(ValueError, match="unsupported Lambda event"):
        call({"detail-type": "Scheduled Event", "source": "aws.events"})
    with pytest.raises(ValueError, match="unsupported Lambda event"):
        call({"Records": [{"eventSource": "aws:s3"}]})


# -- database credentials ---------------------------------------------------------------------------------------------


def test_database_url_from_an_rds_managed_secret_and_the_environment() -> None:
    env = {
        serverless.DB_HOST_ENV: "db.cluster-x.us-east-1.rds.amazonaws.com",
        serverless.DB_PORT_ENV: "5432",
        serverless.DB_NAME_ENV: "overspill",
    }
    url = make_url(serverless.database_url_from_secret({"username": "overspill", "password": "p@ss:/w?rd#"}, env))
    assert (url.drivername, url.username, url.password) == ("postgresql+psycopg", "overspill", "p@ss:/w?rd#")
    assert (url.host, url.port, url.database) == ("db.cluster-x.us-east-1.rds.amazonaws.com", 5432, "overspill")
    assert url.query == {"sslmode": "require"}

    rotated = {"username": "u", "password": "p", "host": "other", "port": 6543, "dbname": "d"}
    url = make_url(serverless.database_url_from_secret(rotated, {}))
    assert (url.host, url.port, url.database) == ("other", 6543, "d")

    no_host = {k: v for k, v in env.items() if k != serverless.DB_HOST_ENV}
    with pytest.raises(ValueError, match="OVERSPILL_DATABASE_HOST"):
        serverless.database_url_from_secret({"username": "u", "password": "p"}, no_host)
    with pytest.raises(ValueError, match="'password'"):
        serverless.database_url_from_secret({"username": "u"}, env)


@pytest.mark.integration
def test_settings_read_the_database_secret_from_secrets_manager(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OVERSPILL_DATABASE_URL", raising=False)
    monkeypatch.setenv("OVERSPILL_AWS_ENDPOINT_URL", moto_url)
    secrets = moto_client("secretsmanager", REGION, moto_url)
    arn = secrets.create_secret(Name="rds!cluster-test", SecretString=json.dumps({"username": "a", "password": "b"}))[
        "ARN"
    ]
    env = {
        serverless.SECRET_ARN_ENV: arn,
        serverless.DB_HOST_ENV: "h",
        serverless.DB_PORT_ENV: "5432",
        serverless.DB_NAME_ENV: "n",
    }
    url = make_url(serverless.settings_from_env(env).database_url)
    assert (url.username, url.password, url.host, url.database) == ("a", "b", "h", "n")


# -- SQS interruption messages, end to end on moto + PostgreSQL ----------------------------------------------------


def _lambda_env(moto_url: str, pg_url: str, secret_arn: str) -> dict[str, str]:
    """The environment terraform/ gives the function, pointed at moto and the test's PostgreSQL."""
    url = make_url(pg_url)
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "OVERSPILL_AWS_ENDPOINT_URL": moto_url,
        serverless.SECRET_ARN_ENV: secret_arn,
        serverless.DB_HOST_ENV: str(url.host),
        serverless.DB_PORT_ENV: str(url.port),
        serverless.DB_NAME_ENV: str(url.database),
        serverless.DB_SSLMODE_ENV: "disable",
        "OVERSPILL_BOOTSTRAP_API_KEY": DEV_API_KEY,
    }


def _db_secret(moto_url: str, pg_url: str) -> str:
    url = make_url(pg_url)
    secrets = moto_client("secretsmanager", REGION, moto_url)
    payload = {"username": url.username, "password": "unused-with-trust-auth"}
    name = f"rds!cluster-{url.database}"
    return str(secrets.create_secret(Name=name, SecretString=json.dumps(payload))["ARN"])


@pytest.mark.integration
def test_spot_warning_from_sqs_replaces_the_job_and_failed_records_are_reported(
    moto_url: str, postgres: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pg_url = postgres.create_database()
    for name in list(os.environ):
        if name.startswith("OVERSPILL_"):
            monkeypatch.delenv(name)
    for k, v in _lambda_env(moto_url, pg_url, _db_secret(moto_url, pg_url)).items():
        monkeypatch.setenv(k, v)
    ec2 = moto_client("ec2", REGION, moto_url)
    sqs = moto_client("sqs", REGION, moto_url)
    events = moto_client("events", REGION, moto_url)
    from providers.aws import ensure_interruption_queue, parse_instance_ref

    queue_url = ensure_interruption_queue(events, sqs, "overspill-lambda-test", rule_name="overspill-lambda-test")
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    ami = str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])
    # the checkpoint bucket terraform/ wires in: an instance's agent needs it for its spec, logs and reports
    moto_client("s3", REGION, moto_url).create_bucket(Bucket="overspill-lambda-ckpt")
    settings_env = {
        "OVERSPILL_DATA_DIR": str(tmp_path),
        "OVERSPILL_SIMULATED": "false",
        "OVERSPILL_AWS_REGIONS": json.dumps([REGION]),
        "OVERSPILL_AWS_INSTANCE_TYPES": json.dumps(["g5.xlarge"]),
        "OVERSPILL_AWS_LAUNCH": "true",
        "OVERSPILL_AWS_IMAGE_ID": ami,
        "OVERSPILL_CHECKPOINT_STORES": json.dumps({f"aws/{REGION}": "s3://overspill-lambda-ckpt/"}),
        "OVERSPILL_S3_ENDPOINT_URL": moto_url,
    }
    for k, v in settings_env.items():
        monkeypatch.setenv(k, v)

    job = body_of(call(http_event("POST", "/v1/jobs", body=job_body(accelerators=["A10G"]), headers=AUTH)))
    assert call(schedule_event("refresh_prices"))["pools"] > 0
    call(schedule_event("tick"))
    call(schedule_event("tick"))
    running = body_of(call(http_event("GET", f"/v1/jobs/{job['id']}", headers=AUTH)))
    assert running["state"] == "running", json.dumps(running)
    first = running["placement"]
    assert first["provider"] == "aws" and first["capacity_type"] == "spot"
    region, ec2_id = parse_instance_ref(first["instance_id"])

    # EventBridge delivers the real warning (and a rebalance recommendation) to the queue; the event source
    # mapping hands the received messages to the function as one batch, with a malformed message among them.
    for kind in ("EC2 Instance Rebalance Recommendation", "EC2 Spot Instance Interruption Warning"):
        events.put_events(
            Entries=[
                {
                    "Source": "aws.ec2",
                    "DetailType": kind,
                    "Detail": json.dumps({"instance-id": ec2_id, "instance-action": "terminate"}),
                    "Resources": [f"arn:aws:ec2:{region}a:instance/{ec2_id}"],
                }
            ]
        )
    received = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert len(received) == 2
    records = [sqs_record(m["Body"], queue_arn=queue_arn, message_id=m["MessageId"]) for m in received]
    records.append(sqs_record("{not json", queue_arn=queue_arn))
    result = call(sqs_event(records))
    assert result == {"batchItemFailures": []}  # handled, or malformed (no retry can fix it): all acknowledged

    # the instance runs the agent: the warning is recorded and the instance left to save its final checkpoint; the
    # tick after the deadline (or the agent's final report) re-places the job (tests/test_reports_mailbox.py)
    after = body_of(call(http_event("GET", f"/v1/jobs/{job['id']}", headers=AUTH)))
    assert after["state"] == "running", after
    kinds = [e["kind"] for e in body_of(call(http_event("GET", f"/v1/jobs/{job['id']}/events", headers=AUTH)))["items"]]
    assert "rebalance_notice" in kinds and "interruption_notice" in kinds

    # A redelivered warning is a no-op; a record whose handling fails (the database refusing, here) is the only
    # one reported back for redelivery.
    def flaky_apply(rt: Any, notice: Any, now: Any) -> int:
        if notice.instance_id.endswith("i-0000000000000dead"):
            raise OperationalError("UPDATE placements", {}, Exception("connection reset"))
        return real_apply(rt, notice, now)

    real_apply = serverless.apply_notice
    monkeypatch.setattr(serverless, "apply_notice", flaky_apply)
    repeat = sqs_record(spot_warning(ec2_id, region), queue_arn=queue_arn, message_id="repeat")
    failing = sqs_record(spot_warning("i-0000000000000dead", region), queue_arn=queue_arn, message_id="failing")
    assert call(sqs_event([repeat, failing])) == {"batchItemFailures": [{"itemIdentifier": "failing"}]}
    events_after = body_of(call(http_event("GET", f"/v1/jobs/{job['id']}/events", headers=AUTH)))["items"]
    assert [e["kind"] for e in events_after].count("interruption_notice") == 1


# -- concurrent cold starts -------------------------------------------------------------------------------------------

COLD_START = """
import json, sys
from broker.serverless import handler
from tests.serverless_events import http_event
response = handler(http_event("GET", "/healthz"), None)
print(json.dumps({"status": response["statusCode"]}))
"""


@pytest.mark.integration
def test_concurrent_cold_starts_migrate_one_database_once(moto_url: str, postgres: Any, tmp_path: Path) -> None:
    pg_url = postgres.create_database()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_") and not k.startswith("AWS_")
    } | _lambda_env(moto_url, pg_url, _db_secret(moto_url, pg_url))
    env["OVERSPILL_DATA_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", COLD_START], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=240) for p in starts]
    for process, (out, err) in zip(starts, outputs, strict=True):
        assert process.returncode == 0, err.decode()[-3000:]
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"status": 200}

    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
            keys = conn.execute(text("SELECT count(*) FROM api_key WHERE name = 'bootstrap admin'")).scalar_one()
    finally:
        engine.dispose()
    assert keys == 1


# -- the database password rotates under a warm container ------------------------------------------------------------


@contextmanager
def password_role(postgres: Any, pg_url: str, password: str) -> Iterator[str]:
    """A login role that owns the database at `pg_url` and must present its password over TCP (a pg_hba.conf line
    for it alone, ahead of the test cluster's trust rules); yields its name."""
    if postgres.data_dir is None:
        pytest.skip("needs the suite's own PostgreSQL cluster (its pg_hba.conf) to require a password")
    role = "rot_" + make_url(pg_url).database.removeprefix("t_")
    hba = Path(postgres.data_dir) / "pg_hba.conf"
    original = hba.read_text()
    admin = make_url(pg_url).set(database="postgres", drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        conn.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(make_url(pg_url).database), sql.Identifier(role)
            )
        )
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


@pytest.mark.integration
def test_a_rotated_database_password_is_re_read_and_the_next_request_still_works(
    moto_url: str, postgres: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pg_url = postgres.create_database()
    url = make_url(pg_url)
    with password_role(postgres, pg_url, "first-password") as role:
        admin = url.set(database="postgres", drivername="postgresql").render_as_string(hide_password=False)
        secrets = moto_client("secretsmanager", REGION, moto_url)
        arn = secrets.create_secret(
            Name=f"rds!cluster-{url.database}",
            SecretString=json.dumps({"username": role, "password": "first-password"}),
        )["ARN"]
        for name in list(os.environ):
            if name.startswith("OVERSPILL_"):
                monkeypatch.delenv(name)
        for k, v in {**_lambda_env(moto_url, pg_url, arn), "OVERSPILL_DATA_DIR": str(tmp_path)}.items():
            monkeypatch.setenv(k, v)
        reads: list[str] = []
        real_fetch = serverless_secrets.fetch_secret_json

        def counted_fetch(secret_arn: str, **kwargs: Any) -> dict[str, Any]:
            reads.append(secret_arn)
            return real_fetch(secret_arn, **kwargs)

        monkeypatch.setattr(serverless_secrets, "fetch_secret_json", counted_fetch)

        assert call(http_event("GET", "/v1/jobs", headers=AUTH))["statusCode"] == 200
        first = serverless.container()
        assert reads == [arn]

        # RDS rotates: the role's password changes and the secret follows. The pooled connections are dropped
        # (what recycling, an idle timeout or a resumed database does), so the next request must connect anew.
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal("second")))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        secrets.put_secret_value(SecretId=arn, SecretString=json.dumps({"username": role, "password": "second"}))

        listed = call(http_event("GET", "/v1/jobs", headers=AUTH))
        assert listed["statusCode"] == 200, listed
        assert reads == [arn, arn]  # read again once, on the refused connection
        created = call(http_event("POST", "/v1/jobs", body=job_body(), headers=AUTH))
        assert created["statusCode"] == 202, created
        rebuilt = serverless.container()
        assert rebuilt.runtime is first.runtime and rebuilt.asgi is not first.asgi  # the app took the new URL
        assert make_url(rebuilt.runtime.settings.database_url).password == "second"

        # A secret that still holds refused credentials is read once per refused connection, never in a loop.
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal("third")))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        refused = call(http_event("GET", "/v1/jobs", headers=AUTH))
        assert refused["statusCode"] >= 500
        assert 3 <= len(reads) <= 5  # pre-ping's reconnect and the pool's retry: one read each at most
        serverless.reset()
