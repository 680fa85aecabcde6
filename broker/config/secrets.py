"""Secrets: read from the environment or from AWS Secrets Manager, and refused in production when missing or default.

Role: `Settings` (broker/config/settings.py) calls `resolve_secrets` once when it is built; the Lambda entry point
(broker/serverless.py) reads its database secret with `fetch_secret_json`: one reader for both. Each secret
setting can be given directly (`OVERSPILL_CALLBACK_SECRET=...`) or as the ARN of a Secrets Manager secret
(`OVERSPILL_CALLBACK_SECRET_ARN=arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME`); a direct value wins. The
secret settings are `SECRET_FIELDS`: the bootstrap API key, the callback secret, the database URL, the libcloud
secret and the metrics token (terraform/ generates the callback secret and the metrics token and passes their
ARNs). A secret whose SecretString is a JSON object is read whole unless the ARN ends in `#field`, which picks that
field (e.g. `...:secret:overspill-db#url`). The secret's region comes from its ARN; `OVERSPILL_SECRETS_ENDPOINT_URL`
(or `OVERSPILL_AWS_ENDPOINT_URL`) points the client elsewhere (tests use a moto server). A secret that cannot be
read stops the broker with an error naming the setting and the ARN, never the value.

`unsafe_in_production` lists what a production broker must not start with: the public development API key, a
missing or short bootstrap key, a callback secret that is missing (it would be derived from the bootstrap key) or
short, a metrics token that is missing or short (an open /metrics shows every tenant's names, job counts and spend;
there is no open-metrics mode in production), a libcloud secret missing while libcloud is enabled, and any secret
equal to a well-known default.
Secret values are kept out of `repr(settings)` (so out of logs and tracebacks) by the fields themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

SECRET_FIELDS = ("bootstrap_api_key", "callback_secret", "database_url", "libcloud_secret", "metrics_token")
MIN_SECRET_CHARS = 32
KNOWN_DEFAULTS = frozenset(
    {"changeme", "change-me", "secret", "password", "development", "dev", "test", "testing", "overspill"}
)


class SecretError(ValueError):
    """A secret could not be resolved; the message names the setting and where it was looked for."""


ClientFactory = Callable[[str, str | None], Any]  # (region, endpoint_url) -> boto3 secretsmanager client


def _boto_client(region: str, endpoint_url: str | None) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10)
    return boto3.client("secretsmanager", region_name=region, endpoint_url=endpoint_url, config=config)


def fetch_secret(arn: str, *, endpoint_url: str | None = None, client_factory: ClientFactory = _boto_client) -> str:
    """The value of a Secrets Manager secret (`ARN` or `ARN#field` for one field of a JSON secret)."""
    from botocore.exceptions import BotoCoreError, ClientError

    secret_id, _, json_field = arn.partition("#")
    parts = secret_id.split(":")
    if len(parts) < 7 or parts[0] != "arn" or parts[2] != "secretsmanager":
        raise SecretError(f"{arn!r} is not a Secrets Manager ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME)")
    try:
        answer = client_factory(parts[3], endpoint_url).get_secret_value(SecretId=secret_id)
    except (ClientError, BotoCoreError) as exc:
        raise SecretError(f"cannot read secret {secret_id}: {type(exc).__name__}: {exc}") from exc
    value = answer.get("SecretString")
    if not isinstance(value, str):
        raise SecretError(f"secret {secret_id} has no SecretString (binary secrets are not supported)")
    if json_field:
        try:
            document = json.loads(value)
            value = document[json_field]
        except (ValueError, KeyError, TypeError) as exc:
            raise SecretError(f"secret {secret_id} has no JSON field {json_field!r}") from exc
        if not isinstance(value, str):
            raise SecretError(f"field {json_field!r} of secret {secret_id} is not a string")
    return value


def fetch_secret_json(
    arn: str, *, endpoint_url: str | None = None, client_factory: ClientFactory = _boto_client
) -> dict[str, Any]:
    """The JSON object held by a Secrets Manager secret (e.g. an RDS-managed database secret); `SecretError`
    naming the secret (never its value) when it cannot be read or does not hold a JSON object."""
    value = fetch_secret(arn, endpoint_url=endpoint_url, client_factory=client_factory)
    try:
        document = json.loads(value)
    except ValueError as exc:
        raise SecretError(f"secret {arn.partition('#')[0]} does not hold JSON") from exc
    if not isinstance(document, dict):
        raise SecretError(f"secret {arn.partition('#')[0]} does not hold a JSON object")
    return document


def resolve_secrets(
    values: Mapping[str, Any], *, endpoint_url: str | None = None, client_factory: ClientFactory = _boto_client
) -> dict[str, str]:
    """For every secret field left empty whose `<field>_arn` is set: its value from Secrets Manager."""
    out: dict[str, str] = {}
    for name in SECRET_FIELDS:
        arn = values.get(f"{name}_arn") or ""
        if values.get(name) or not arn:
            continue
        try:
            out[name] = fetch_secret(arn, endpoint_url=endpoint_url, client_factory=client_factory)
        except SecretError as exc:
            raise SecretError(f"OVERSPILL_{name.upper()}_ARN: {exc}") from exc
    return out


def unsafe_in_production(values: Mapping[str, Any], *, dev_api_key: str) -> list[str]:
    """Why a production broker must not start with these settings (empty when it may)."""
    problems = []
    key = str(values.get("bootstrap_api_key") or "")
    if not key or key == dev_api_key:
        problems.append("OVERSPILL_BOOTSTRAP_API_KEY must be set to a fresh key (the development key is public)")
    elif len(key.split("_", 2)[-1]) < MIN_SECRET_CHARS:
        problems.append(f"OVERSPILL_BOOTSTRAP_API_KEY: its secret part must be at least {MIN_SECRET_CHARS} characters")
    callback = str(values.get("callback_secret") or "")
    if not callback:
        problems.append("OVERSPILL_CALLBACK_SECRET must be set (or _ARN): it signs what instances report")
    elif len(callback) < MIN_SECRET_CHARS:
        problems.append(f"OVERSPILL_CALLBACK_SECRET must be at least {MIN_SECRET_CHARS} characters")
    metrics = str(values.get("metrics_token") or "")
    if not metrics:
        problems.append(
            "OVERSPILL_METRICS_TOKEN must be set (or _ARN): /metrics shows every tenant's names, job counts and spend "
            "to whoever reaches the port"
        )
    elif len(metrics) < MIN_SECRET_CHARS:
        problems.append(f"OVERSPILL_METRICS_TOKEN must be at least {MIN_SECRET_CHARS} characters")
    if values.get("libcloud_provider") and not values.get("libcloud_secret"):
        problems.append("OVERSPILL_LIBCLOUD_SECRET must be set when OVERSPILL_LIBCLOUD_PROVIDER is")
    for name in SECRET_FIELDS:
        value = str(values.get(name) or "")
        if value.lower() in KNOWN_DEFAULTS:
            problems.append(f"OVERSPILL_{name.upper()} is a well-known default value")
    return problems
