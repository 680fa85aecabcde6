"""Attack on the Terraform deployment (terraform/): its HTTP API is public, and `GET /metrics` names every tenant,
team and their spend. The module must make the deployed broker require the metrics token it generates.

The example root (terraform/examples/basic) is applied on a moto server (shared with tests/test_terraform_deploy.py,
see tests/terraform_cli.py); the function's environment is read back as deployed, its secrets resolved from moto's
Secrets Manager exactly as the function's cold start does, and the broker app is built from it (on a local SQLite
database instead of Aurora, which moto does not run).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker import serverless
from broker.app import create_app
from broker.runtime import build_runtime
from tests.terraform_cli import REGION, example_deployment

pytestmark = [pytest.mark.integration, pytest.mark.terraform_deployment]


def test_scraping_metrics_of_the_terraform_deployment_without_the_token_is_refused(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    deployment = example_deployment(request.config)
    env = deployment.function_environment()
    for name in list(os.environ):
        if name.startswith("OVERSPILL_"):
            monkeypatch.delenv(name)
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    endpoints = {
        "OVERSPILL_SECRETS_ENDPOINT_URL": deployment.moto_url,
        "OVERSPILL_AWS_ENDPOINT_URL": deployment.moto_url,
    }
    database = {"OVERSPILL_DATABASE_URL": f"sqlite:///{tmp_path / 'broker.store.db'}"}
    for key, value in (env | endpoints | database | aws).items():
        monkeypatch.setenv(key, value)

    rt = build_runtime(serverless.settings_from_env())
    try:
        with TestClient(create_app(runtime=rt)) as api:
            anonymous = api.get("/metrics")
            assert anonymous.status_code == 401, "the deployed broker serves every tenant's spend to anyone"
            assert "overspill_" not in anonymous.text
            bootstrap = env["OVERSPILL_BOOTSTRAP_API_KEY"]  # an API key (even the admin's) is not the metrics token
            assert api.get("/metrics", headers={"Authorization": f"Bearer {bootstrap}"}).status_code == 401
            token = deployment.client("secretsmanager").get_secret_value(SecretId=env["OVERSPILL_METRICS_TOKEN_ARN"])
            scraped = api.get("/metrics", headers={"Authorization": f"Bearer {token['SecretString']}"})
            assert scraped.status_code == 200 and "overspill_" in scraped.text
    finally:
        rt.engine.dispose()
