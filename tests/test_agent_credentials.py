"""Secrets and registry credentials, fetched with the instance identity: AWS Secrets Manager and ECR for real on moto,
GCP Secret Manager, Azure Key Vault and ACR's token exchange on stand-ins answering their documented shapes; and the
refusals that keep instance tokens from going anywhere else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent.identity import Identities
from agent.protocol import RegistryAuth, RegistryAuthKind, SecretRef, SecretSource
from agent.registry import ACR_USER, RegistryError, login_for
from agent.secrets import SecretError, crc32c, resolve
from tests.agent_standins import CloudStandIns
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


@pytest.fixture(scope="module")
def standins(metadata: MetadataServer) -> Iterator[CloudStandIns]:
    with CloudStandIns(metadata) as server:
        yield server


@pytest.fixture
def env(moto_url: str, metadata: MetadataServer, standins: CloudStandIns) -> dict[str, str]:
    return {
        "OVERSPILL_METADATA_URL": metadata.url,
        "AWS_ENDPOINT_URL": moto_url,
        "OVERSPILL_GCP_SECRET_MANAGER_ENDPOINT": standins.url,
        "OVERSPILL_AZURE_KEYVAULT_ENDPOINT": standins.url,
        "OVERSPILL_ACR_ENDPOINT": standins.url,
    }


def _resolve(source: SecretSource, ref: str, env: dict[str, str], field: str | None = None) -> str:
    return resolve(SecretRef("X", source, ref, field), Identities(env), env)


def test_aws_secrets_manager_on_moto(moto_url: str, env: dict[str, str]) -> None:
    sm: Any = moto_client("secretsmanager", "us-east-1", moto_url)
    arn = sm.create_secret(Name="agent/db", SecretString=json.dumps({"password": "hunter2-db", "port": 5432}))["ARN"]
    sm.create_secret(Name="agent/bin", SecretBinary=b"binary-value")
    assert _resolve(SecretSource.AWS_SECRETS_MANAGER, "agent/db", env, "password") == "hunter2-db"
    assert _resolve(SecretSource.AWS_SECRETS_MANAGER, arn, env, "port") == "5432"
    assert _resolve(SecretSource.AWS_SECRETS_MANAGER, "agent/bin", env) == "binary-value"
    with pytest.raises(SecretError) as err:
        _resolve(SecretSource.AWS_SECRETS_MANAGER, "agent/missing", env)
    assert err.value.user_fault and "ResourceNotFoundException" in str(err.value)
    with pytest.raises(SecretError, match="not a JSON object with the key 'user'") as err:
        _resolve(SecretSource.AWS_SECRETS_MANAGER, "agent/db", env, "user")
    assert "hunter2" not in str(err.value)


def test_gcp_secret_manager_with_the_metadata_token(standins: CloudStandIns, env: dict[str, str]) -> None:
    standins.gcp_secrets["projects/p1/secrets/api-key"] = b"gcp-secret-v@lue"
    assert _resolve(SecretSource.GCP_SECRET_MANAGER, "projects/p1/secrets/api-key", env) == "gcp-secret-v@lue"
    assert (
        _resolve(SecretSource.GCP_SECRET_MANAGER, "projects/p1/secrets/api-key/versions/1", env) == "gcp-secret-v@lue"
    )
    path, auth = next((r[1], r[2]) for r in reversed(standins.requests) if r[1].endswith(":access"))
    assert path == "/v1/projects/p1/secrets/api-key/versions/1:access" and auth == "Bearer ya29.test-gcp-access-token"
    with pytest.raises(SecretError) as err:
        _resolve(SecretSource.GCP_SECRET_MANAGER, "projects/p1/secrets/nope", env)
    assert err.value.user_fault and "404" in str(err.value)
    with pytest.raises(SecretError, match="expected projects/"):
        _resolve(SecretSource.GCP_SECRET_MANAGER, "projects/p1/../../v1/other", env)


def test_azure_key_vault_with_a_managed_identity_token(standins: CloudStandIns, env: dict[str, str]) -> None:
    standins.vault_secrets["db-password"] = "kv-secret-value"
    ref = "https://overspill-kv.vault.azure.net/secrets/db-password"
    assert _resolve(SecretSource.AZURE_KEY_VAULT, ref, env) == "kv-secret-value"
    with pytest.raises(SecretError) as err:
        _resolve(SecretSource.AZURE_KEY_VAULT, "https://overspill-kv.vault.azure.net/secrets/other", env)
    assert err.value.user_fault and "SecretNotFound" in str(err.value)


@pytest.mark.parametrize(
    "ref",
    [
        "https://evil.example.com/secrets/x",  # the managed identity's token would go to a stranger
        "http://overspill-kv.vault.azure.net/secrets/x",  # in clear text
        "https://overspill-kv.vault.azure.net.evil.example/secrets/x",
        "https://overspill-kv.vault.azure.net:8443/secrets/x",
        "https://overspill-kv.vault.azure.net/keys/x",
    ],
)
def test_key_vault_token_is_never_sent_outside_key_vault(
    ref: str, standins: CloudStandIns, env: dict[str, str]
) -> None:
    before = len(standins.requests)
    with pytest.raises(SecretError) as err:
        _resolve(SecretSource.AZURE_KEY_VAULT, ref, env)
    assert err.value.user_fault
    assert len(standins.requests) == before


def test_a_secret_service_that_does_not_answer_is_not_the_users_fault(silent_endpoint: str) -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
           "AWS_REGION": "us-east-1"}  # fmt: skip
    with pytest.raises(SecretError) as err:
        _resolve(SecretSource.AWS_SECRETS_MANAGER, "x", env)
    assert not err.value.user_fault


def test_crc32c_matches_google() -> None:
    import google_crc32c

    for data in (b"", b"a", b"hello world", bytes(range(256)) * 3):
        assert crc32c(data) == google_crc32c.value(data)


# ------------------------------------------------------------------------------------------------ registries


def _no_secret(ref: SecretRef) -> str:
    raise AssertionError("no secret expected")


def test_ecr_authorization_token_from_moto(env: dict[str, str]) -> None:
    server = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    login = login_for(RegistryAuth(RegistryAuthKind.ECR, server), Identities(env), _no_secret, env)
    assert login is not None
    assert (login.server, login.username, login.password) == (server, "AWS", "123456789012-auth-token")


def test_gcp_registry_uses_the_metadata_token(env: dict[str, str]) -> None:
    login = login_for(RegistryAuth(RegistryAuthKind.GCP, "europe-docker.pkg.dev"), Identities(env), _no_secret, env)
    assert login is not None and (login.username, login.password) == ("oauth2accesstoken", "ya29.test-gcp-access-token")


def test_acr_exchanges_the_managed_identity_token(standins: CloudStandIns, env: dict[str, str]) -> None:
    login = login_for(RegistryAuth(RegistryAuthKind.ACR, "overspillacr.azurecr.io"), Identities(env), _no_secret, env)
    assert login is not None
    assert login.username == ACR_USER and login.password == standins.acr_refresh_tokens[-1]


def test_registry_secret_holds_username_and_password(env: dict[str, str]) -> None:
    value = json.dumps({"username": "robot", "password": "pw"})
    auth = RegistryAuth(
        RegistryAuthKind.SECRET, "127.0.0.1:5055", SecretRef("R", SecretSource.AWS_SECRETS_MANAGER, "r")
    )
    login = login_for(auth, Identities(env), lambda ref: value, env)
    assert login is not None and (login.username, login.password) == ("robot", "pw")
    assert "pw" not in repr(login)
    with pytest.raises(RegistryError, match="username and password"):
        login_for(auth, Identities(env), lambda ref: "not json", env)


@pytest.mark.parametrize(
    ("kind", "server"),
    [
        (RegistryAuthKind.ECR, "evil.example.com"),
        (RegistryAuthKind.ECR, "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.example"),
        (RegistryAuthKind.GCP, "docker.io"),
        (RegistryAuthKind.ACR, "ghcr.io"),
        (RegistryAuthKind.ACR, ""),
    ],
)
def test_instance_tokens_only_go_to_their_own_clouds_registries(
    kind: RegistryAuthKind, server: str, metadata: MetadataServer, env: dict[str, str]
) -> None:
    tokens_before = sum(v for k, v in metadata.hits.items() if "token" in k)
    with pytest.raises(RegistryError):
        login_for(RegistryAuth(kind, server), Identities(env), _no_secret, env)
    assert sum(v for k, v in metadata.hits.items() if "token" in k) == tokens_before
