"""The agent's hand-written store clients against real servers: SigV4 equal to botocore's, S3 on moto, GCS on the
GCS emulator, Azure Blob on Azurite over HTTPS with a managed-identity bearer token, and the file store. Credentials
and tokens come from tests/metadata_server.py, as on an instance; objects are checked with the official SDKs."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.identity import AzureIdentity, Identities
from agent.sigv4 import AwsCredentials, sign
from agent.stores import AzureBlobStore, FileStore, Store, StoreError, open_uri
from tests.agent_fixtures import azure_container
from tests.metadata_server import MetadataServer, fake_jwt

pytest_plugins = ["tests.storage_emulators", "tests.agent_fixtures"]
MiB = 1024 * 1024
FIXED = datetime(2026, 11, 2, 8, 30, 15, tzinfo=UTC)


# ------------------------------------------------------------------------------------------------------- SigV4


@pytest.mark.parametrize(
    ("service", "method", "url", "body", "headers"),
    [
        ("s3", "PUT", "https://bkt.s3.us-east-1.amazonaws.com/dir/a%20b%2Bc%C3%A9.bin", b"x" * 100,
         {"Content-Type": "application/octet-stream", "Content-Length": "100"}),
        ("s3", "GET", "http://127.0.0.1:5000/bkt/?continuation-token=a%2Fb%3D&list-type=2&prefix=logs%2Fp%201%2F",
         b"", {}),
        ("s3", "POST", "https://bkt.s3.eu-west-1.amazonaws.com/k?uploadId=abc%2B1", b"<x/>", {}),
        ("secretsmanager", "POST", "https://secretsmanager.us-east-1.amazonaws.com/", b'{"SecretId":"a/b"}',
         {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "secretsmanager.GetSecretValue"}),
        ("ecr", "POST", "http://127.0.0.1:8080/", b"{}",
         {"Content-Type": "application/x-amz-json-1.1",
          "X-Amz-Target": "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("token", [None, "session+token/=="])
def test_sigv4_authorization_equals_botocore(
    monkeypatch: pytest.MonkeyPatch, service: str, method: str, url: str, body: bytes, headers: dict[str, str],
    token: str | None,
) -> None:  # fmt: skip
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: FIXED.replace(tzinfo=None))
    region = "eu-west-1" if "eu-west-1" in url else "us-east-1"
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    auth_cls = botocore.auth.S3SigV4Auth if service == "s3" else botocore.auth.SigV4Auth
    auth_cls(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token), service, region).add_auth(
        request
    )
    ours = sign(
        method, url, headers, payload_sha256=hashlib.sha256(body).hexdigest(), service=service, region=region,
        credentials=AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token), now=FIXED,
    )  # fmt: skip
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    if token:
        assert ours["X-Amz-Security-Token"] == token
    if service == "s3":
        assert ours["X-Amz-Content-SHA256"] == request.headers["X-Amz-Content-SHA256"]


# ------------------------------------------------------------------------------------------------- the contract


def _exercise(store: Store, prefix: str, tmp_path: Path) -> None:
    """The contract every backend keeps: put/get/list/delete/put_file/download, missing objects, odd names."""
    assert store.get(prefix + "missing") is None
    assert store.download(prefix + "missing", tmp_path / "nothing") is False
    store.delete(prefix + "missing")
    names = ["a.txt", "dir/b c.txt", "dir/é+=&?.bin", "z/0000000000000001.log"]
    for i, name in enumerate(names):
        store.put(prefix + name, f"content {i}".encode())
    assert store.list(prefix) == sorted(prefix + n for n in names)
    assert store.list(prefix + "dir/") == sorted(prefix + n for n in names if n.startswith("dir/"))
    assert store.get(prefix + "dir/é+=&?.bin") == b"content 2"
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * MiB + 17))
    store.put_file(prefix + "big.bin", big)
    assert store.download(prefix + "big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    store.delete(prefix + "a.txt")
    assert store.get(prefix + "a.txt") is None
    assert prefix + "a.txt" not in store.list(prefix)


def test_file_store_keeps_the_contract(tmp_path: Path) -> None:
    store, key = open_uri(f"file://{tmp_path}/store/p/", Identities({}), {})
    assert isinstance(store, FileStore)
    _exercise(store, key, tmp_path)
    assert not list((tmp_path / "store").rglob(".part-*"))


# ------------------------------------------------------------------------------------------------------------ S3


@pytest.mark.integration
def test_s3_store_on_moto_with_instance_role_credentials(
    s3_endpoint: str, s3_client: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    s3_client.create_bucket(Bucket="agent-s3")
    env = {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL_S3": s3_endpoint}
    before = metadata.hits["GET /latest/meta-data/iam/security-credentials/"]
    store, key = open_uri("s3://agent-s3/jobs/j1/", Identities(env), env)
    _exercise(store, key, tmp_path)
    assert metadata.hits["GET /latest/meta-data/iam/security-credentials/"] > before  # the role, not the env
    got = s3_client.get_object(Bucket="agent-s3", Key="jobs/j1/dir/é+=&?.bin")["Body"].read()
    assert got == b"content 2"


@pytest.mark.integration
def test_s3_multipart_upload_of_a_large_file(
    s3_endpoint: str, s3_client: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    s3_client.create_bucket(Bucket="agent-mp")
    env = {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL_S3": s3_endpoint}
    store, _ = open_uri("s3://agent-mp/x", Identities(env), env)
    store.multipart_threshold, store.part_size = 6 * MiB, 5 * MiB  # type: ignore[attr-defined]
    path = tmp_path / "ckpt.bin"
    path.write_bytes(os.urandom(11 * MiB + 3))
    store.put_file("ckpt.bin", path)
    head = s3_client.head_object(Bucket="agent-mp", Key="ckpt.bin")
    assert head["ETag"].endswith('-3"')  # three parts
    assert s3_client.get_object(Bucket="agent-mp", Key="ckpt.bin")["Body"].read() == path.read_bytes()


@pytest.mark.integration
def test_s3_errors_name_the_object_and_never_the_secret(s3_endpoint: str, metadata: MetadataServer) -> None:
    env = {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL_S3": s3_endpoint}
    store, _ = open_uri("s3://no-such-bucket-agent/x", Identities(env), env)
    with pytest.raises(StoreError) as err:
        store.put("k", b"data")
    assert "no-such-bucket-agent" in str(err.value) and "404" in str(err.value)
    assert "testing-session-token" not in str(err.value)


# ----------------------------------------------------------------------------------------------------------- GCS


@pytest.mark.integration
def test_gcs_store_on_the_emulator(
    gcs_endpoint: str, gcs_client: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    gcs_client.create_bucket("agent-gcs")
    env = {"OVERSPILL_METADATA_URL": metadata.url, "STORAGE_EMULATOR_HOST": gcs_endpoint}
    store, key = open_uri("gs://agent-gcs/jobs/j1/", Identities(env), env)
    _exercise(store, key, tmp_path)
    assert metadata.hits["GET /computeMetadata/v1/instance/service-accounts/default/token"] >= 1
    assert gcs_client.bucket("agent-gcs").blob("jobs/j1/dir/b c.txt").download_as_bytes() == b"content 1"


# --------------------------------------------------------------------------------------------------------- Azure


@pytest.mark.integration
def test_azure_blob_store_on_azurite_with_a_managed_identity_token(
    azurite_https: tuple[str, str], metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, cafile = azurite_https
    monkeypatch.setenv("SSL_CERT_FILE", cafile)
    container = azure_container(endpoint, cafile, "agent-az")
    env = {"OVERSPILL_METADATA_URL": metadata.url, "OVERSPILL_AZURE_BLOB_ENDPOINT": endpoint}
    store, key = open_uri(f"{endpoint}/agent-az/jobs/j1/", Identities(env), env)
    assert isinstance(store, AzureBlobStore)
    _exercise(store, key, tmp_path)
    assert "https://storage.azure.com/" in metadata.azure_tokens
    assert container.download_blob("jobs/j1/dir/b c.txt").readall() == b"content 1"
    # az://container/key under the configured account endpoint names the same objects
    same, same_key = open_uri("az://agent-az/jobs/j1/dir/b c.txt", Identities(env), env)
    assert same.get(same_key) == b"content 1"
    # a large file goes up as blocks
    store.multipart_threshold, store.part_size = 2 * MiB, 1 * MiB  # type: ignore[attr-defined]
    path = tmp_path / "blocks.bin"
    path.write_bytes(os.urandom(3 * MiB + 5))
    store.put_file("blocks.bin", path)
    blocks = container.get_blob_client("blocks.bin").get_block_list("committed")[0]
    assert len(blocks) == 4
    assert container.download_blob("blocks.bin").readall() == path.read_bytes()


@pytest.mark.integration
def test_azure_blob_refuses_an_expired_or_foreign_token(
    azurite_https: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, cafile = azurite_https
    monkeypatch.setenv("SSL_CERT_FILE", cafile)
    azure_container(endpoint, cafile, "agent-az-deny")
    for token in (fake_jwt("https://storage.azure.com/", lifetime=-120), fake_jwt("https://vault.azure.net")):
        store = AzureBlobStore(endpoint, "agent-az-deny", token=lambda token=token: token)
        with pytest.raises(StoreError, match="403"):
            store.put("k", b"data")
    assert AzureIdentity.STORAGE == "https://storage.azure.com/"
