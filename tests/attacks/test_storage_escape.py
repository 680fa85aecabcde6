"""Attacks on checkpoint storage (security issue, findings 1 and 2), each against real parts.

Finding 1: pre-staging copied a job's checkpoint objects keeping their names, so an object named `../../x.pth` in
the job's own S3 checkpoint was written outside the target store's root (into site-packages, where it ran as root).
Here objects with hostile names sit in a moto S3 bucket or the GCS emulator, the job is re-placed next to a local
store, and nothing may appear outside the job's checkpoint directory while the legitimate objects still arrive; a
symlink planted in a local store is followed neither when writing nor when reading.

Finding 2: a job's `checkpoint_uri` named any file the broker could read (`file:///<store>/../../<anything>`, the
broker's SQLite database, another tenant's checkpoints, any bucket), and a FIFO as checkpoint froze the control
loop. Here every such URI is refused with a 422 naming `checkpoint_uri`; a FIFO checkpoint fails its staging at once
with an event; a row stored before the fix with an escaping URI is refused at staging and nothing is read; and a
`file://` store placed over the broker's own files stops the broker at start-up.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

import broker
from broker.config.checkpoint_stores import CheckpointStores
from broker.config.settings import Settings
from broker.loop.place import _place_one, launch_placement
from broker.loop.stage import Staging, stage_checkpoint
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.store.tables import Job, JobEvent, Placement
from tests.builders import job_body
from tests.conftest import MovableClock
from tests.moto_server import CREDS
from tests.scripted import ScriptedCloud, admin_api, attach

pytest_plugins = ["tests.storage_emulators"]

MiB = 1024 * 1024
TENANT = "demo"  # the development admin key's tenant
PAYLOAD = b"import os; os.system('id > /tmp/overspill-pwned')\n"  # what the issue's .pth ran
HOSTILE = ["../../x.pth", "..\\x.pth", "/abs.pth", "a/../../b.pth", "nul\x00.pth", "ctl\x1b.pth"]
# gcp-storage-emulator refuses to store names with '..' segments (it turns backslashes into '/' first); real GCS
# keeps them. The GCS attack plants the hostile names the emulator does hold.
HOSTILE_GCS = ["/abs.pth", "nul\x00.pth", "ctl\x1b.pth"]
# Azurite refuses '..' segments, but turns a backslash into '/', so '..\\x.pth' is stored as '../x.pth' (a real
# '..' segment); it cannot list a container holding a name with a control character
HOSTILE_AZURE = ["..\\x.pth", "/abs.pth"]
LEGIT = {"model.pt": os.urandom(MiB + 3), "optim/state.pt": os.urandom(1000)}


# -- helpers -------------------------------------------------------------------------------------------------------


def _clouds(clock: MovableClock) -> tuple[ScriptedCloud, ScriptedCloud]:
    aws = ScriptedCloud("aws", clock, zones=("us-east-1a",), region="us-east-1")
    gcp = ScriptedCloud("gcp", clock, zones=("us-central1-a",), region="us-central1")
    aws.prices = {"us-east-1a": Decimal("10")}
    gcp.prices = {"us-central1-a": Decimal("12")}
    return aws, gcp


def _runtime(
    make_runtime: Callable[..., Runtime], db_url: str, clouds: tuple[ScriptedCloud, ...], **kw: Any
) -> Runtime:
    rt = make_runtime(db_url, simulated=False, wait_value_usd_per_gpu_hour=0.0, **kw)
    for cloud in clouds:
        attach(rt, cloud)
    tick(rt, rt.clock())
    return rt


def _placed(rt: Runtime, clock: MovableClock, checkpoint_uri: str, provider: str) -> tuple[str, str]:
    """Submit a job with `checkpoint_uri` through the API and place it (without launching) on `provider`."""
    resp = admin_api(rt).post("/v1/jobs", json=job_body(checkpoint_uri=checkpoint_uri))
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    placement_id, _ = _place_one(rt, job_id, rt.catalog.book(clock()), frozenset(), clock())
    assert placement_id is not None
    with Session(rt.engine) as s:
        p = s.get(Placement, placement_id)
        assert p is not None and p.provider == provider
    return job_id, placement_id


def _job(rt: Runtime, job_id: str) -> Job:
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _events(rt: Runtime, job_id: str, kind: str) -> list[JobEvent]:
    with Session(rt.engine) as s:
        return list(s.exec(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == kind)).all())


def _files_under(root: Path) -> set[str]:
    """Every non-directory entry under `root` (symlinks not followed), as root-relative POSIX paths."""
    found: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return found


@pytest.fixture
def stores_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Local checkpoint stores live here: apart from the data dir (tmp_path), which no store may be near."""
    return tmp_path_factory.mktemp("stores")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDS.items():
        monkeypatch.setenv(name.upper(), value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _assert_only_legit_copies(
    rt: Runtime, job_id: str, stores_dir: Path, checkpoint_dir: Path, hostile: list[str] = HOSTILE
) -> None:
    expected = {(checkpoint_dir / name).relative_to(stores_dir).as_posix() for name in LEGIT}
    assert _files_under(stores_dir) == expected, "something was written outside the job's checkpoint directory"
    for name, data in LEGIT.items():
        assert (checkpoint_dir / name).read_bytes() == data
    [skipped] = _events(rt, job_id, "checkpoint_objects_skipped")
    assert sorted(n.partition("runs/llm/")[2] for n in skipped.data["objects"]) == sorted(hostile)
    job = _job(rt, job_id)
    assert job.checkpoint_uri is not None and job.checkpoint_uri.endswith(f"tenants/{TENANT}/jobs/{job_id}/checkpoint/")


# -- finding 1: hostile object names never write outside the store ---------------------------------------------------


@pytest.mark.integration
def test_checkpoint_object_named_dotdot_in_s3_cannot_write_outside_the_local_store(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    s3_endpoint: str,
    s3_client: Any,
    stores_dir: Path,
    aws_env: None,
) -> None:
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    target = stores_dir / "usc1"
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}  # the job moves next to the local store
    rt = _runtime(
        make_runtime,
        db_url,
        (aws, gcp),
        checkpoint_stores={"aws/us-east-1": f"s3://{bucket}/", "gcp/us-central1": f"file://{target}/"},
        s3_endpoint_url=s3_endpoint,
    )
    run = f"tenants/{TENANT}/runs/llm/"
    for name, data in LEGIT.items():
        s3_client.put_object(Bucket=bucket, Key=run + name, Body=data)
    for name in HOSTILE:  # S3 keeps these names as they are
        s3_client.put_object(Bucket=bucket, Key=run + name, Body=PAYLOAD)
    job_id, placement_id = _placed(rt, clock, f"s3://{bucket}/{run}", "gcp")

    launch_placement(rt, placement_id, clock())

    checkpoint_dir = target / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    _assert_only_legit_copies(rt, job_id, stores_dir, checkpoint_dir)
    [launch] = gcp.requests
    assert launch.resume_from == f"file://{checkpoint_dir}/"


@pytest.mark.integration
def test_checkpoint_object_named_dotdot_in_gcs_cannot_write_outside_the_local_store(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    gcs_endpoint: str,
    gcs_client: Any,
    stores_dir: Path,
) -> None:
    bucket = gcs_client.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
    target = stores_dir / "use1"
    aws, gcp = _clouds(clock)  # AWS is the cheaper: the job moves from the GCS store to the local one
    rt = _runtime(
        make_runtime,
        db_url,
        (aws, gcp),
        checkpoint_stores={"gcp/us-central1": f"gs://{bucket.name}/", "aws/us-east-1": f"file://{target}/"},
        gcs_endpoint=gcs_endpoint,
    )
    run = f"tenants/{TENANT}/runs/llm/"
    for name, data in LEGIT.items():
        bucket.blob(run + name).upload_from_string(data)
    for name in HOSTILE_GCS:
        bucket.blob(run + name).upload_from_string(PAYLOAD)
    assert {b.name for b in gcs_client.list_blobs(bucket)} == {run + n for n in [*LEGIT, *HOSTILE_GCS]}
    job_id, placement_id = _placed(rt, clock, f"gs://{bucket.name}/{run}", "aws")

    launch_placement(rt, placement_id, clock())

    checkpoint_dir = target / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    _assert_only_legit_copies(rt, job_id, stores_dir, checkpoint_dir, HOSTILE_GCS)


@pytest.mark.integration
def test_checkpoint_object_with_a_hostile_name_in_azure_blob_cannot_write_outside_the_local_store(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    azurite_endpoint: str,
    azure_service: Any,
    stores_dir: Path,
) -> None:
    from tests.storage_emulators import AZURITE_ACCOUNT, AZURITE_KEY

    container = azure_service.create_container(f"ckpt-{uuid.uuid4().hex[:8]}")
    target = stores_dir / "use1"
    aws, gcp = _clouds(clock)  # the Azure store stands at gcp/us-central1; AWS is the cheaper
    rt = _runtime(
        make_runtime,
        db_url,
        (aws, gcp),
        checkpoint_stores={
            "gcp/us-central1": f"az://{container.container_name}/",
            "aws/us-east-1": f"file://{target}/",
        },
        azure_storage_connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={azurite_endpoint};"
        ),
    )
    run = f"tenants/{TENANT}/runs/llm/"
    for name, data in LEGIT.items():
        container.upload_blob(run + name, data)
    for name in HOSTILE_AZURE:
        container.upload_blob(run + name, PAYLOAD)
    job_id, placement_id = _placed(rt, clock, f"az://{container.container_name}/{run}", "aws")

    launch_placement(rt, placement_id, clock())

    checkpoint_dir = target / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    as_stored = [name.replace("\\", "/") for name in HOSTILE_AZURE]
    _assert_only_legit_copies(rt, job_id, stores_dir, checkpoint_dir, as_stored)


def _local_pair(stores_dir: Path) -> dict[str, str]:
    return {"aws/us-east-1": f"file://{stores_dir}/use1/", "gcp/us-central1": f"file://{stores_dir}/usc1/"}


def _local_source(stores_dir: Path) -> Path:
    source = stores_dir / "use1" / "tenants" / TENANT / "runs" / "llm"
    for name, data in LEGIT.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    return source


def test_symlink_planted_in_the_target_store_is_not_followed_on_write(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    outside = tmp_path_factory.mktemp("outside")  # stands for site-packages
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    source = _local_source(stores_dir)
    job_id, placement_id = _placed(rt, clock, f"file://{source}/", "gcp")
    # whoever can write into the target store plants a link where the job's checkpoint directory will be
    jobs = stores_dir / "usc1" / "tenants" / TENANT / "jobs" / job_id
    jobs.mkdir(parents=True)
    (jobs / "checkpoint").symlink_to(outside, target_is_directory=True)

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.FAILED

    assert list(outside.iterdir()) == []
    [failed] = _events(rt, job_id, "checkpoint_stage_failed")
    assert "symlink" in failed.message
    assert _job(rt, job_id).checkpoint_uri == f"file://{source}/"  # not repointed at anything


def test_symlink_planted_in_a_tenant_area_is_not_followed_on_write(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    source = _local_source(stores_dir)
    (stores_dir / "usc1" / "tenants").mkdir(parents=True)
    (stores_dir / "usc1" / "tenants" / TENANT).symlink_to(outside, target_is_directory=True)
    _, placement_id = _placed(rt, clock, f"file://{source}/", "gcp")

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.FAILED

    assert _files_under(outside) == set()


def test_symlinks_planted_in_a_source_checkpoint_are_not_followed_on_read(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "broker.store.db").write_bytes(b"SQLite format 3\0 every tenant's key hashes")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    source = _local_source(stores_dir)
    (source / "stolen.db").symlink_to(secrets / "broker.store.db")
    (source / "stolen-dir").symlink_to(secrets, target_is_directory=True)
    job_id, placement_id = _placed(rt, clock, f"file://{source}/", "gcp")

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.STAGED

    checkpoint_dir = stores_dir / "usc1" / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    assert _files_under(checkpoint_dir) == set(LEGIT)  # the links were neither followed nor copied
    for copied in checkpoint_dir.rglob("*"):
        assert b"key hashes" not in (copied.read_bytes() if copied.is_file() else b"")


def test_a_checkpoint_that_is_itself_a_symlink_is_not_read(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "broker.store.db").write_bytes(b"SQLite format 3\0 every tenant's key hashes")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    link = _local_source(stores_dir) / "latest.pt"
    link.symlink_to(secrets / "broker.store.db")
    job_id, placement_id = _placed(rt, clock, f"file://{link}", "gcp")

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.FAILED

    assert not (stores_dir / "usc1").exists() or _files_under(stores_dir / "usc1") == set()
    [failed] = _events(rt, job_id, "checkpoint_stage_failed")
    assert "symlink" in failed.message


def test_hard_links_planted_in_a_source_checkpoint_are_not_read(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Hard links are refused wherever symlinks are (issue 32, Low): a hard link is the other file itself, so
    refusing symlinks alone let whoever writes the store read out any broker-readable file on its filesystem."""
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "broker.store.db").write_bytes(b"SQLite format 3\0 every tenant's key hashes")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    source = _local_source(stores_dir)
    os.link(secrets / "broker.store.db", source / "stolen.db")
    job_id, placement_id = _placed(rt, clock, f"file://{source}/", "gcp")

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.STAGED

    checkpoint_dir = stores_dir / "usc1" / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    assert _files_under(checkpoint_dir) == set(LEGIT)  # the link was not copied
    for copied in checkpoint_dir.rglob("*"):
        assert b"key hashes" not in (copied.read_bytes() if copied.is_file() else b"")


def test_a_checkpoint_that_is_itself_a_hard_link_is_not_read(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "broker.store.db").write_bytes(b"SQLite format 3\0 every tenant's key hashes")
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    link = _local_source(stores_dir) / "latest.pt"
    os.link(secrets / "broker.store.db", link)
    job_id, placement_id = _placed(rt, clock, f"file://{link}", "gcp")

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.FAILED

    assert not (stores_dir / "usc1").exists() or _files_under(stores_dir / "usc1") == set()
    [failed] = _events(rt, job_id, "checkpoint_stage_failed")
    assert "hard links" in failed.message


# -- finding 2: a checkpoint_uri must lie under the tenant's prefixes -------------------------------------------------


@pytest.fixture
def confined(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path, tmp_path: Path
) -> tuple[TestClient, Path, str]:
    """An API with a local store at aws/us-east-1, an S3 store at gcp/us-central1 (names only: nothing is read at
    submission) and an extra prefix for the tenant; returns (client, local store root, SQLite file path)."""
    rt = _runtime(
        make_runtime,
        db_url,
        _clouds(clock),
        checkpoint_stores={"aws/us-east-1": f"file://{stores_dir}/use1/", "gcp/us-central1": "s3://ckpt-usc1/"},
        tenant_checkpoint_prefixes={TENANT: {"s3://demo-ml/ckpt/": "aws/us-east-1"}},
    )
    return admin_api(rt), stores_dir / "use1", str(tmp_path / "broker.store.db")


def _escaping_uris(root: Path, db_path: str) -> list[str]:
    area = f"file://{root}/tenants/{TENANT}"
    return [
        f"file://{root}/../../etc/passwd",  # the store root and then up
        f"{area}/../../../../etc/passwd",
        f"{area}/runs/../../../x",
        f"file://{root}/",  # the store root itself: every tenant's checkpoints
        f"file://{root}/tenants/",
        f"{area}/",  # the tenant's area itself (its reserved places included)
        f"file://{root}/tenants/other/jobs/job_1/checkpoint/",  # another tenant's area
        f"file://{db_path}",  # the broker's SQLite database
        f"file://{Path(db_path).parent}/",
        "file:///etc/passwd",
        f"file://{Path(broker.__file__).parent}/app.py",
        f"{area}/%2e%2e/%2e%2e/%2e%2e/etc/passwd",  # percent-encoded dot segments
        f"{area}/%2E%2E/other/x",
        f"{area}/runs/%2e%2e%2f%2e%2e%2fother/x",
        f"{area}/runs/a%00b",  # NUL
        f"{area}/runs/..\\..\\x",  # backslashes
        f"{area}/runs//x",  # an empty segment
        f"{area}/mailbox/report.json",  # reserved for instance reports
        f"{area}/jobs/job_1/attempts/plc_1/spec.json",  # reserved for the instance agent
        "s3://ckpt-usc1/",  # another store's root
        "s3://ckpt-usc1/tenants/other/x",
        "s3://ckpt-usc1/x",
        "s3://someone-elses-bucket/x",  # a bucket the tenant was not assigned
        "s3://demo-ml/other/x",
        "s3://demo-ml/ckpt/../x",
        "gs://ckpt-usc1/tenants/demo/x",  # right bucket name, wrong cloud
        "s3://ckpt-usc1/tenants/demo/x?versionId=1",
        "https://evil.example.com/tenants/demo/x",
        "",
    ]


LOCATION_FIELD = re.compile(r"checkpoint.*(uri|url|path|location|prefix|dir|bucket|store)", re.IGNORECASE)
# a valid body per route that takes a checkpoint location, so only the location makes it fail
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/jobs"): job_body(),
    ("post", "/v1/quotes"): job_body(),
}


def _location_inputs(api: TestClient) -> list[tuple[str, str, str]]:
    """`(method, path, field)` of every body field, in the route table, that names a checkpoint location."""
    spec = api.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    found = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            schema = schemas.get(ref.get("$ref", "").rsplit("/", 1)[-1], {})
            found += [(method, path, f) for f in schema.get("properties", {}) if LOCATION_FIELD.search(f)]
    return found


def test_every_route_input_naming_a_checkpoint_location_refuses_escaping_values(
    confined: tuple[TestClient, Path, str],
) -> None:
    api, root, db_path = confined
    inputs = _location_inputs(api)
    assert ("post", "/v1/jobs", "checkpoint_uri") in inputs
    unregistered = [(m, p) for m, p, _ in inputs if (m, p) not in BODIES]
    assert not unregistered, f"register a valid body in BODIES for {unregistered}, so its locations are attacked"
    for method, path, field in inputs:
        for uri in _escaping_uris(root, db_path):
            resp = api.request(method.upper(), path, json={**BODIES[(method, path)], field: uri})
            assert resp.status_code == 422, (method, path, uri, resp.text)
            body = resp.json()
            assert (body["errors"][0]["field"], body["errors"][0]["location"]) == (field, "body"), (path, uri, body)
            assert body["message"].startswith(field), (path, uri, body)
    refusal = api.post("/v1/jobs", json=job_body(checkpoint_uri="s3://someone-elses-bucket/x")).json()["message"]
    assert f"file://{root}/tenants/{TENANT}/" in refusal and "s3://demo-ml/ckpt/" in refusal  # the allowed ones


def test_any_checkpoint_uri_is_refused_when_no_location_is_configured(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=job_body(checkpoint_uri="s3://bucket/run/"))
    assert resp.status_code == 422
    assert "OVERSPILL_CHECKPOINT_STORES" in resp.json()["message"]
    assert client.post("/v1/jobs", json=job_body()).status_code == 202  # no checkpoint_uri: fine


def test_a_fifo_as_checkpoint_does_not_block_the_control_loop(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    fifo = _local_source(stores_dir) / "latest.pt"
    os.mkfifo(fifo)
    job_id, placement_id = _placed(rt, clock, f"file://{fifo}", "gcp")
    outcome: list[Staging] = []
    worker = threading.Thread(target=lambda: outcome.append(stage_checkpoint(rt, placement_id, clock())), daemon=True)
    try:
        worker.start()
        worker.join(timeout=15)
        assert not worker.is_alive(), "staging a FIFO checkpoint blocked"
    finally:
        if worker.is_alive():  # release the blocked reader so the test process can go on
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            worker.join(timeout=15)
    assert outcome == [Staging.FAILED]
    [failed] = _events(rt, job_id, "checkpoint_stage_failed")
    assert "FIFO" in failed.message


def test_a_fifo_inside_a_checkpoint_directory_is_skipped_and_the_rest_copied(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    source = _local_source(stores_dir)
    os.mkfifo(source / "pipe.pt")
    job_id, placement_id = _placed(rt, clock, f"file://{source}/", "gcp")
    outcome: list[Staging] = []
    worker = threading.Thread(target=lambda: outcome.append(stage_checkpoint(rt, placement_id, clock())), daemon=True)
    try:
        worker.start()
        worker.join(timeout=15)
        assert not worker.is_alive(), "staging a checkpoint holding a FIFO blocked"
    finally:
        if worker.is_alive():
            os.close(os.open(source / "pipe.pt", os.O_WRONLY | os.O_NONBLOCK))
            worker.join(timeout=15)
    assert outcome == [Staging.STAGED]
    checkpoint_dir = stores_dir / "usc1" / "tenants" / TENANT / "jobs" / job_id / "checkpoint"
    assert _files_under(checkpoint_dir) == set(LEGIT)


@pytest.fixture
def secret_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    secrets = tmp_path_factory.mktemp("broker-host")
    (secrets / "overspill.db").write_bytes(b"SQLite format 3\0 every tenant's key hashes")
    yield secrets


def test_a_job_stored_before_the_fix_with_an_escaping_checkpoint_is_refused_at_staging(
    db_url: str,
    make_runtime: Callable[..., Runtime],
    clock: MovableClock,
    stores_dir: Path,
    secret_dir: Path,
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    job_id, placement_id = _placed(rt, clock, f"file://{_local_source(stores_dir)}/", "gcp")
    escaping = f"file://{stores_dir}/use1/../../{secret_dir.name}/"  # what the old API stored as given
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.checkpoint_uri = escaping
        job.checkpoint_provider, job.checkpoint_region = "aws", "us-east-1"
        s.add(job)
        s.commit()

    launch_placement(rt, placement_id, clock())

    assert not (stores_dir / "usc1").exists() or _files_under(stores_dir / "usc1") == set()  # nothing read
    assert gcp.requests == []  # and not handed to an instance either
    job = _job(rt, job_id)
    assert job.state == "paused" and "checkpoint_uri" in job.wait_reason
    [refused] = _events(rt, job_id, "checkpoint_refused")
    assert refused.data["checkpoint_uri"] == escaping
    assert stage_checkpoint(rt, placement_id, clock()) is Staging.NOT_NEEDED  # the placement is given up


def test_a_job_stored_before_the_fix_pointing_into_another_tenants_area_is_refused_at_staging(
    db_url: str, make_runtime: Callable[..., Runtime], clock: MovableClock, stores_dir: Path
) -> None:
    aws, gcp = _clouds(clock)
    gcp.prices = {"us-central1-a": Decimal("1")}
    rt = _runtime(make_runtime, db_url, (aws, gcp), checkpoint_stores=_local_pair(stores_dir))
    theirs = stores_dir / "use1" / "tenants" / "other" / "runs" / "secret"
    theirs.mkdir(parents=True)
    (theirs / "model.pt").write_bytes(b"another tenant's weights")
    job_id, placement_id = _placed(rt, clock, f"file://{_local_source(stores_dir)}/", "gcp")
    with Session(rt.engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.checkpoint_uri = f"file://{theirs}/"
        s.add(job)
        s.commit()

    assert stage_checkpoint(rt, placement_id, clock()) is Staging.REFUSED
    assert not (stores_dir / "usc1").exists()


# -- the broker's own files can never be a store ---------------------------------------------------------------------


def _file_uri(path: Path) -> str:
    return "file://" + str(path).rstrip("/") + "/"


def _site_packages() -> Path:
    return Path(next(p for p in sys.path if p.endswith("site-packages")))


@pytest.mark.parametrize(
    "root",
    [
        lambda tmp: Path("/"),
        lambda tmp: tmp,  # the data dir (and the SQLite file's directory)
        lambda tmp: tmp / "ckpt",  # inside it
        lambda tmp: tmp.parent,  # containing it
        lambda tmp: tmp / "reports",
        lambda tmp: _site_packages(),
        lambda tmp: _site_packages() / "ckpt",
        lambda tmp: Path(sys.prefix).parent,
        lambda tmp: Path(broker.__file__).parent,
        lambda tmp: Path(broker.__file__).parent.parent,  # the project, holding every package
    ],
    ids=[
        "fs-root",
        "data-dir",
        "in-data-dir",
        "around-data-dir",
        "reports",
        "site",
        "in-site",
        "around-venv",
        "pkg",
        "project",
    ],
)
def test_a_file_store_over_the_brokers_own_files_stops_the_broker(tmp_path: Path, root: Callable[[Path], Path]) -> None:
    path = root(tmp_path)
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'broker.store.db'}",
        checkpoint_stores={"onprem/dc1": _file_uri(path)},
    )
    with pytest.raises(ValueError, match=r"OVERSPILL_CHECKPOINT_STORES\['onprem/dc1'\]"):
        CheckpointStores.from_settings(settings)
    extra = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'broker.store.db'}",
        tenant_checkpoint_prefixes={"acme": {_file_uri(path): "onprem/dc1"}},
    )
    with pytest.raises(ValueError, match=r"OVERSPILL_TENANT_CHECKPOINT_PREFIXES\['acme'\]"):
        CheckpointStores.from_settings(extra)
