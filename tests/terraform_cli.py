"""Running the real `terraform` and `checkov` binaries from tests.

- `terraform_bin()`: the terraform on PATH (or OVERSPILL_TERRAFORM_BIN), else None (tests skip, saying so).
- `plugin_mirror()`: a provider filesystem mirror (OVERSPILL_TF_PLUGIN_MIRROR, or a `tf-plugins` directory up to
  three levels below /, as this machine image ships one) so init works offline; None means the public registry.
- `Workspace`: a copy of terraform/ in a temp dir (the checkout is never written to: no .terraform/, lock file or
  state appear in it) with an environment that uses the mirror; `run(dir, *args)` runs terraform there.
- `example_deployment(config)`: terraform/examples/basic planned and applied once per pytest process against a moto
  server (a `Deployment`: its outputs, state, planned changes, the function's environment), shared by every test
  file that asks; `Deployment.destroy()` tears it down (the next ask applies again). At the end of the session the
  moto server is stopped: nothing is destroyed.
- Applying costs ~80 s and destroying ~70 s, nearly all of it the AWS provider's fixed waits (SQS attribute
  propagation, S3 lifecycle consistency, RDS status polls), not CPU. So tests/conftest.py starts the apply in a
  background thread as soon as collection selects a test that uses it (`start_example_deployment`), and starts the
  destroy in the background once the last such test finished (`start_example_destroy`), moving the destroy test
  to the end of the run, where it joins the destroy (`example_destroyed`) and checks what is left. The other
  tests run meanwhile; a failure in either thread is raised in the test that waits for it.
- `checkov_bin()`: checkov lives in its own virtualenv (its `hcl2` package clashes with python-hcl2 in the dev
  environment): OVERSPILL_CHECKOV_BIN, else `checkov` on PATH, else a virtualenv created once under the user cache
  (CHECKOV_VERSION pinned), else None.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "terraform"
CHECKOV_VERSION = "3.3.30"
EXAMPLE = "examples/basic"
REGION = "us-east-1"


def terraform_bin() -> str | None:
    return os.environ.get("OVERSPILL_TERRAFORM_BIN") or shutil.which("terraform")


def plugin_mirror() -> Path | None:
    given = os.environ.get("OVERSPILL_TF_PLUGIN_MIRROR")
    if given:
        return Path(given)
    for pattern in ("tf-plugins", "*/tf-plugins", "*/*/tf-plugins"):
        for found in sorted(Path("/").glob(pattern)):
            if found.is_dir() and (found / "registry.terraform.io").is_dir():
                return found
    return None


@dataclass
class Workspace:
    """terraform/ copied to `root`; `env` points terraform at the mirror (when there is one)."""

    root: Path
    binary: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, tmp: Path, binary: str, extra_env: dict[str, str] | None = None) -> Workspace:
        root = tmp / "terraform"
        shutil.copytree(MODULE, root, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "AWS_"))}
        env |= {"TF_IN_AUTOMATION": "1", "TF_INPUT": "0", "CHECKPOINT_DISABLE": "1"}
        mirror = plugin_mirror()
        config = tmp / "terraform.tfrc"
        if mirror is not None:
            config.write_text(f'provider_installation {{\n  filesystem_mirror {{\n    path = "{mirror}"\n  }}\n}}\n')
        else:
            config.write_text("")
        env["TF_CLI_CONFIG_FILE"] = str(config)
        env |= extra_env or {}
        return cls(root=root, binary=binary, env=env)

    def run(self, where: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args],
            cwd=self.root / where,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"terraform {' '.join(args)} in {where} failed:\n{result.stdout}\n{result.stderr}")
        return result


@dataclass
class Deployment:
    """terraform/examples/basic applied to the moto server at `moto_url` (see `example_deployment`)."""

    workspace: Workspace
    moto_url: str
    name: str
    vpc: str
    subnets: list[str]
    varfile: Path
    state: Path
    planned: dict[str, Any]  # `terraform show -json` of the plan that was applied
    outputs: dict[str, Any] = field(default_factory=dict)
    destroyed: bool = False

    @property
    def common(self) -> tuple[str, ...]:
        return ("-input=false", "-no-color", f"-state={self.state}")

    def client(self, service: str) -> Any:
        from tests.moto_server import moto_client

        return moto_client(service, REGION, self.moto_url)

    def function_environment(self) -> dict[str, str]:
        """The environment the broker's function runs with, as deployed."""
        function = self.client("lambda").get_function(FunctionName=self.name)["Configuration"]
        return dict(function["Environment"]["Variables"])

    def destroy(self) -> None:
        self.workspace.run(EXAMPLE, "destroy", *self.common, "-auto-approve", f"-var-file={self.varfile}", timeout=900)
        self.destroyed = True


def _network(moto_url: str) -> tuple[str, list[str]]:
    from tests.moto_server import moto_client

    ec2 = moto_client("ec2", REGION, moto_url)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{n}.0/24", AvailabilityZone=f"{REGION}{zone}")["Subnet"][
            "SubnetId"
        ]
        for n, zone in ((1, "a"), (2, "b"))
    ]
    return vpc, subnets


def _small_package(path: Path) -> Path:
    """moto stores the function's code but never runs it: a small zip with the handler module is enough."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(ROOT / "broker" / "serverless.py", "broker/serverless.py")
    return path


def _amazon_image(moto_url: str) -> str:
    from tests.moto_server import moto_client

    return str(moto_client("ec2", REGION, moto_url).describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


def _apply_example(
    workspace: Workspace, moto_url: str, tmp: Path, network: tuple[str, list[str]], ami: str
) -> Deployment:
    name = "ovs" + secrets.token_hex(3)
    vpc, subnets = network
    tfvars = {
        "aws_endpoint_url": moto_url,
        "region": REGION,
        "name": name,
        "lambda_zip_path": str(_small_package(tmp / "package.zip")),
        "vpc_id": vpc,
        "subnet_ids": subnets,
        "bootstrap_api_key": f"ovs_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}",
        "aws_image_id": ami,
        "db_deletion_protection": False,
        "db_skip_final_snapshot": True,
        "force_destroy_buckets": True,
    }
    varfile = tmp / "moto.tfvars.json"
    varfile.write_text(json.dumps(tfvars))
    workspace.env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION}
    deployment = Deployment(workspace, moto_url, name, vpc, subnets, varfile, tmp / "terraform.tfstate", planned={})
    plan = str(tmp / "deploy.tfplan")
    workspace.run(EXAMPLE, "init", "-input=false", "-no-color")
    workspace.run(EXAMPLE, "plan", *deployment.common, f"-var-file={varfile}", f"-out={plan}")
    deployment.planned = json.loads(workspace.run(EXAMPLE, "show", "-json", plan).stdout)
    workspace.run(EXAMPLE, "apply", *deployment.common, "-auto-approve", plan, timeout=900)
    shown = workspace.run(EXAMPLE, "output", "-json", f"-state={deployment.state}").stdout
    deployment.outputs = {k: v["value"] for k, v in json.loads(shown).items()}
    return deployment


_DEPLOYMENT = pytest.StashKey[Deployment]()
_APPLYING = pytest.StashKey[Future[Deployment]]()
_DESTROYING = pytest.StashKey[Future[None]]()
_POOL = pytest.StashKey[ThreadPoolExecutor]()
_RESOURCES = pytest.StashKey[tuple[ExitStack, str, Path]]()


def example_deployment(config: pytest.Config) -> Deployment:
    """The example applied on moto, once per pytest process (again after a `destroy()`); skips without terraform.
    Waits for the background apply when one was started."""
    binary = terraform_bin()
    if binary is None:
        pytest.skip("terraform is not installed (https://developer.hashicorp.com/terraform/install)")
    pending = config.stash.get(_APPLYING, None)
    if pending is not None:
        del config.stash[_APPLYING]
        config.stash[_DEPLOYMENT] = pending.result()
    found = config.stash.get(_DEPLOYMENT, None)
    if found is not None and not found.destroyed:
        return found
    deployment = _prepare_example(config, binary)()
    config.stash[_DEPLOYMENT] = deployment
    return deployment


def start_example_deployment(config: pytest.Config) -> None:
    """Start applying the example in a background thread (no-op without terraform or when one exists already)."""
    binary = terraform_bin()
    if binary is None or _APPLYING in config.stash or _DEPLOYMENT in config.stash:
        return
    config.stash[_APPLYING] = _background(config).submit(_prepare_example(config, binary))


def start_example_destroy(config: pytest.Config) -> None:
    """Start destroying the applied example in a background thread (no-op when nothing was applied)."""
    found = config.stash.get(_DEPLOYMENT, None)
    if found is None or found.destroyed or _DESTROYING in config.stash:
        return
    config.stash[_DESTROYING] = _background(config).submit(found.destroy)


def example_destroyed(config: pytest.Config) -> Deployment:
    """The example, destroyed: joins the background destroy if one was started, else destroys it now."""
    deployment = example_deployment(config) if _DEPLOYMENT not in config.stash else config.stash[_DEPLOYMENT]
    pending = config.stash.get(_DESTROYING, None)
    if pending is not None:
        del config.stash[_DESTROYING]
        pending.result()
    if not deployment.destroyed:
        deployment.destroy()
    return deployment


def release_example(config: pytest.Config) -> None:
    """At the session's end (tests/conftest.py's `pytest_sessionfinish`): wait for a background apply or destroy
    still running, then stop the moto process and remove the workspaces. Not at `config` clean-up: in a pytest-xdist
    worker that runs after the worker said it was done, racing the controller that ends it, which left the moto
    process and its folder behind (tests/leak_check.py)."""
    pool = config.stash.get(_POOL, None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
        del config.stash[_POOL]
    resources = config.stash.get(_RESOURCES, None)
    if resources is not None:
        del config.stash[_RESOURCES]
        resources[0].close()


def _background(config: pytest.Config) -> ThreadPoolExecutor:
    pool = config.stash.get(_POOL, None)
    if pool is None:
        pool = config.stash[_POOL] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terraform")
    return pool


def _prepare_example(config: pytest.Config, binary: str) -> Any:
    """Everything that touches shared state (the moto process, boto3's default session) runs here, in the calling
    thread; the returned callable only runs terraform, so it may run in a background thread."""
    if _RESOURCES not in config.stash:
        from tests.moto_server import running_moto_process

        stack = ExitStack()
        # a process of its own: other test modules reset their in-process moto servers, which would wipe this
        # session-long deployment
        moto_url = stack.enter_context(running_moto_process())
        tmp = Path(tempfile.mkdtemp(prefix="overspill-tf-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        config.stash[_RESOURCES] = (stack, moto_url, tmp)
    _, moto_url, tmp = config.stash[_RESOURCES]
    where = Path(tempfile.mkdtemp(dir=tmp))
    workspace = Workspace.create(where, binary)
    network = _network(moto_url)
    ami = _amazon_image(moto_url)
    return lambda: _apply_example(workspace, moto_url, where, network, ami)


def checkov_bin() -> str | None:
    given = os.environ.get("OVERSPILL_CHECKOV_BIN") or shutil.which("checkov")
    if given:
        return given
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "overspill" / f"checkov-{CHECKOV_VERSION}"
    )
    binary = cache / "bin" / "checkov"
    if binary.exists():
        return str(binary)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True, capture_output=True, timeout=120)
        subprocess.run(
            [str(cache / "bin" / "pip"), "install", "--quiet", f"checkov=={CHECKOV_VERSION}"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.SubprocessError, OSError):
        shutil.rmtree(cache, ignore_errors=True)
        return None
    return str(binary) if binary.exists() else None
