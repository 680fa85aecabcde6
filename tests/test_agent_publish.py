"""Publishing the agent's wheel to each checkpoint store: built once per process, put at `P _agent/<sha256>/<name>`
only when it is not there yet (a second publisher, as in another broker process, uploads nothing), and readable by
an instance with plain HTTPS and no credentials of its own through the URL the broker signs: a moto presigned GET,
a V4 signed URL on the GCS emulator, an Azurite SAS (the same blob without it is refused), `file://` for a file
store. What the URL delivers is the wheel, byte for byte, with the SHA-256 the start-up script checks."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker.agent_side.publish import AgentPublisher, agent_wheel
from broker.config.checkpoint_stores import CheckpointStores
from broker.config.settings import Settings
from providers.storage import StorageError
from tests.moto_server import CREDS
from tests.storage_emulators import AZURITE_ACCOUNT, AZURITE_KEY

pytest_plugins = ["tests.storage_emulators"]


def _anonymous_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:  # no credentials, no SDK: what the script does
        return bytes(answer.read())


def _publisher(tmp_path: Path, store: str, **settings: Any) -> tuple[AgentPublisher, CheckpointStores]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    stores = CheckpointStores.from_settings(
        Settings(data_dir=data, checkpoint_stores={"x/r1": store}, **settings)  # type: ignore[arg-type]
    )
    return AgentPublisher(stores, stores.settings), stores


def test_the_wheel_is_built_once_per_process() -> None:
    first, second = agent_wheel(), agent_wheel()
    assert first is second and hashlib.sha256(first.data).hexdigest() == first.sha256
    assert first.key == f"_agent/{first.sha256}/{first.name}" and first.name.endswith("-py3-none-any.whl")


def test_file_store_publish_is_idempotent_and_the_url_is_the_file(tmp_path: Path) -> None:
    root = tmp_path.parent / f"{tmp_path.name}-store"
    root.mkdir()
    publisher, _ = _publisher(tmp_path, f"file://{root}/")
    wheel = publisher.publish(f"file://{root}/")
    path = root / wheel.key
    before = path.stat().st_mtime_ns
    again, _ = _publisher(tmp_path, f"file://{root}/")  # another process: asks the store, uploads nothing
    again.publish(f"file://{root}/")
    assert path.stat().st_mtime_ns == before
    url, _ = publisher.wheel_url(f"file://{root}/")
    assert url == path.as_uri() and _anonymous_get(url) == wheel.data


@pytest.mark.integration
def test_s3_publish_is_idempotent_and_a_presigned_get_reads_it(
    s3_endpoint: str, s3_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": CREDS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3_client.create_bucket(Bucket="publish-test")
    publisher, _ = _publisher(
        tmp_path, "s3://publish-test/ovs/", s3_endpoint_url=s3_endpoint, agent_url_expiry_seconds=600
    )
    wheel = publisher.publish("s3://publish-test/ovs/")
    key = f"ovs/{wheel.key}"
    etag = s3_client.head_object(Bucket="publish-test", Key=key)["LastModified"]
    again, _ = _publisher(tmp_path, "s3://publish-test/ovs/", s3_endpoint_url=s3_endpoint)
    again.publish("s3://publish-test/ovs/")
    assert s3_client.head_object(Bucket="publish-test", Key=key)["LastModified"] == etag
    listed = s3_client.list_objects_v2(Bucket="publish-test")["Contents"]
    assert [o["Key"] for o in listed] == [key], "beside tenants/, under the store prefix, nothing else"
    url, _ = publisher.wheel_url("s3://publish-test/ovs/")
    assert "X-Amz-Signature=" in url and "X-Amz-Expires=600" in url and url.startswith(s3_endpoint)
    assert hashlib.sha256(_anonymous_get(url)).hexdigest() == wheel.sha256


@pytest.mark.integration
def test_gcs_signed_url_reads_it_on_the_emulator(gcs_endpoint: str, gcs_client: Any, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    if gcs_client.lookup_bucket("publish-test") is None:
        gcs_client.create_bucket("publish-test")
    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )
    key_file = tmp_path / "sa.json"
    key_file.write_text(
        json.dumps({"type": "service_account", "private_key": pem, "private_key_id": "1", "project_id": "p",
                    "client_email": "broker@p.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"})
    )  # fmt: skip
    publisher, _ = _publisher(tmp_path, "gs://publish-test/", gcs_endpoint=gcs_endpoint)
    with pytest.raises(StorageError, match="cannot sign a GCS URL"):  # anonymous credentials sign nothing
        publisher.wheel_url("gs://publish-test/")
    publisher, _ = _publisher(tmp_path, "gs://publish-test/", gcs_endpoint=gcs_endpoint, gcs_signing_key_file=key_file)
    url, wheel = publisher.wheel_url("gs://publish-test/")
    assert url.startswith(gcs_endpoint) and "X-Goog-Signature=" in url and "X-Goog-Expires=43200" in url
    assert _anonymous_get(url) == wheel.data
    blobs = [b.name for b in gcs_client.list_blobs("publish-test", prefix="_agent/")]
    assert blobs == [wheel.key]


@pytest.mark.integration
def test_azure_sas_reads_it_and_the_blob_alone_is_refused(azurite_endpoint: str, tmp_path: Path) -> None:
    from azure.storage.blob import BlobServiceClient

    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={azurite_endpoint};"
    )
    container = BlobServiceClient.from_connection_string(connection).get_container_client("publish-test")
    if not container.exists():
        container.create_container()
    publisher, _ = _publisher(tmp_path, "az://publish-test/", azure_storage_connection_string=connection)
    url, wheel = publisher.wheel_url("az://publish-test/")
    bare, _, query = url.partition("?")
    assert "sig=" in query and "sp=r" in query and bare.endswith(wheel.key)
    assert _anonymous_get(url) == wheel.data
    with pytest.raises(urllib.error.HTTPError) as refused:
        _anonymous_get(bare)
    assert refused.value.code in (401, 403, 404)
