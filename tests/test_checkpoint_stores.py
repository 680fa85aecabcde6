"""Checkpoint locations: the per-tenant layout, the start-up checks of OVERSPILL_CHECKPOINT_STORES and
OVERSPILL_TENANT_CHECKPOINT_PREFIXES (each bad entry named), which URIs a tenant may use, and that allowed ones are
accepted at submission (the refusals are attacks: tests/attacks/test_storage_escape.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.agent_side import checkpoint_layout as layout
from broker.config.checkpoint_stores import CheckpointRefused, CheckpointStores
from broker.config.settings import Settings
from broker.runtime import Runtime
from providers.storage import LocalStore, UnsafeKey
from providers.storage.s3 import S3Store
from tests.builders import job_body
from tests.scripted import admin_api


@pytest.fixture
def settings_for(tmp_path: Path) -> Callable[..., Settings]:
    (tmp_path / "data").mkdir()

    def make(**kw: object) -> Settings:
        return Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'data' / 'b.db'}", **kw)

    return make


def test_layout() -> None:
    p = "s3://ckpt/overspill/"
    assert layout.tenant_area(p, "acme") == "s3://ckpt/overspill/tenants/acme/"
    assert layout.job_checkpoint_prefix(p, "acme", "job_1") == "s3://ckpt/overspill/tenants/acme/jobs/job_1/checkpoint/"
    assert layout.attempt_prefix(p, "acme", "job_1", "plc_2") == (
        "s3://ckpt/overspill/tenants/acme/jobs/job_1/attempts/plc_2/"
    )
    assert layout.mailbox_prefix(p, "acme") == "s3://ckpt/overspill/tenants/acme/mailbox/"
    for tenant in ("..", "a/b", "", "a\x00"):
        with pytest.raises(UnsafeKey):
            layout.tenant_area(p, tenant)
    assert layout.reserved_reason("mailbox/x") and layout.reserved_reason("jobs/j/attempts/p/spec.json")
    assert layout.reserved_reason("jobs/j/checkpoint/x") is None and layout.reserved_reason("runs/x/") is None


@pytest.mark.parametrize(
    ("stores", "extra", "names"),
    [
        ({"aws": "s3://b/"}, {}, "OVERSPILL_CHECKPOINT_STORES: location 'aws'"),
        ({"aws/us-east-1": "ftp://b/"}, {}, "OVERSPILL_CHECKPOINT_STORES['aws/us-east-1']"),
        ({"aws/us-east-1": "s3://b/a/../"}, {}, "OVERSPILL_CHECKPOINT_STORES['aws/us-east-1']"),
        ({"aws/us-east-1": "s3://b/", "aws/us-west-2": "s3://b/tenants/x/"}, {}, "['aws/us-west-2']: s3://b/tenants"),
        ({}, {"a/b": {"s3://x/": "aws/us-east-1"}}, "OVERSPILL_TENANT_CHECKPOINT_PREFIXES['a/b']"),
        ({}, {"acme": {"s3://x/": "us-east-1"}}, "OVERSPILL_TENANT_CHECKPOINT_PREFIXES['acme']['s3://x/']"),
        ({}, {"acme": {"s3://x?y/": "aws/us-east-1"}}, "['acme']['s3://x?y/']"),
        ({"aws/us-east-1": "s3://b/"}, {"acme": {"s3://b/ml/": "aws/us-east-1"}}, "overlaps the checkpoint store"),
        ({"aws/us-east-1": "s3://b/ckpt/"}, {"acme": {"s3://b/": "aws/us-east-1"}}, "overlaps the checkpoint store"),
        ({}, {"a": {"s3://x/": "aws/r"}, "b": {"s3://x/b/": "aws/r"}}, "['b']['s3://x/b/']: overlaps s3://x/"),
    ],
)
def test_bad_entries_stop_the_broker_with_a_message_naming_them(
    settings_for: Callable[..., Settings], stores: dict[str, str], extra: dict[str, dict[str, str]], names: str
) -> None:
    with pytest.raises(ValueError) as err:
        CheckpointStores.from_settings(settings_for(checkpoint_stores=stores, tenant_checkpoint_prefixes=extra))
    assert names in str(err.value)


def test_build_runtime_refuses_a_bad_entry(settings_for: Callable[..., Settings], tmp_path: Path) -> None:
    from broker.runtime import build_runtime

    with pytest.raises(ValueError, match="OVERSPILL_CHECKPOINT_STORES"):
        build_runtime(settings_for(checkpoint_stores={"onprem/dc1": f"file://{tmp_path}/data/ckpt/"}))


@pytest.fixture
def stores(settings_for: Callable[..., Settings], tmp_path: Path) -> CheckpointStores:
    return CheckpointStores.from_settings(
        settings_for(
            checkpoint_stores={"aws/us-east-1": "s3://ckpt/overspill", "dc/one": f"file://{tmp_path}/ckpt/"},
            tenant_checkpoint_prefixes={"acme": {"s3://acme-ml/ckpt/": "aws/us-west-2"}},
        )
    )


def test_a_tenant_may_use_its_areas_and_its_extra_prefixes(stores: CheckpointStores, tmp_path: Path) -> None:
    assert stores.allowed_prefixes("acme") == [
        "s3://ckpt/overspill/tenants/acme/",
        f"file://{tmp_path}/ckpt/tenants/acme/",
        "s3://acme-ml/ckpt/",
    ]
    assert stores.allowed_prefixes("other") == [
        "s3://ckpt/overspill/tenants/other/",
        f"file://{tmp_path}/ckpt/tenants/other/",
    ]
    found = stores.match("s3://ckpt/overspill/tenants/acme/runs/a%20b/", "acme")
    assert (found.allowed.prefix, found.key, found.location) == (
        "s3://ckpt/overspill/tenants/acme/",
        "runs/a b/",
        ("aws", "us-east-1"),
    )
    assert stores.locate("s3://acme-ml/ckpt/run/x.pt", "acme") == ("aws", "us-west-2")
    assert stores.locate("s3://acme-ml/ckpt/run/x.pt", "other") is None
    with pytest.raises(CheckpointRefused, match="not under any of them"):
        stores.match("s3://acme-ml/ckpt/run/x.pt", "other")
    with pytest.raises(CheckpointRefused, match="reserved for instance reports"):
        stores.match("s3://ckpt/overspill/tenants/acme/mailbox/x", "acme")


def test_stores_are_opened_at_their_root_and_narrowed(stores: CheckpointStores, tmp_path: Path) -> None:
    local = stores.store(layout.job_checkpoint_prefix(f"file://{tmp_path}/ckpt/", "acme", "job_1"))
    assert isinstance(local, LocalStore)
    assert local.root == (tmp_path / "ckpt").resolve() and local.prefix == "tenants/acme/jobs/job_1/checkpoint/"
    assert local.uri("m.pt") == f"file://{tmp_path}/ckpt/tenants/acme/jobs/job_1/checkpoint/m.pt"
    with pytest.raises(CheckpointRefused):
        stores.store("s3://elsewhere/")


def test_a_job_checkpoint_uri_is_derived_from_the_store_at_its_location(stores: CheckpointStores) -> None:
    assert stores.job_checkpoint_uri(("aws", "us-east-1"), "acme", "job_1") == (
        "s3://ckpt/overspill/tenants/acme/jobs/job_1/checkpoint/"
    )
    assert stores.job_checkpoint_uri(("gcp", "us-central1"), "acme", "job_1") is None


def test_resolve_confines_the_store_to_the_prefix_holding_the_uri(
    stores: CheckpointStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store, key = stores.resolve_for_tenant("s3://ckpt/overspill/tenants/acme/runs/x.pt", "acme")
    assert isinstance(store, S3Store) and store.prefix == "overspill/tenants/acme/" and key == "runs/x.pt"
    store, key = stores.resolve("s3://ckpt/overspill/tenants/acme/runs/x.pt")
    assert isinstance(store, S3Store) and store.prefix == "overspill/" and key == "tenants/acme/runs/x.pt"


def test_checkpoint_uris_under_the_tenants_prefixes_are_accepted_at_submission(
    db_url: str, make_runtime: Callable[..., Runtime], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("stores")
    rt: Runtime = make_runtime(
        db_url,
        checkpoint_stores={"aws/us-east-1": f"file://{root}/", "gcp/us-central1": "s3://ckpt-usc1/"},
        tenant_checkpoint_prefixes={"demo": {"s3://demo-ml/ckpt/": "aws/us-east-1"}},
    )
    api = admin_api(rt)
    for uri in (
        f"file://{root}/tenants/demo/runs/llm/",
        f"file://{root}/tenants/demo/runs/llm/step-100.pt",
        f"file://{root}/tenants/demo/jobs/job_1/checkpoint/",  # an earlier job's checkpoint
        f"file://{root}/tenants/demo/runs/a%20b/x",
        "s3://ckpt-usc1/tenants/demo/runs/x/",
        "s3://demo-ml/ckpt/runs/x/",
    ):
        resp = api.post("/v1/jobs", json=job_body(checkpoint_uri=uri))
        assert resp.status_code == 202, (uri, resp.text)
        assert api.post("/v1/quotes", json=job_body(checkpoint_uri=uri)).status_code == 200
