"""Running the real `terraform` and `checkov` binaries from tests.

- `terraform_bin()`: the terraform on PATH (or OVERSPILL_TERRAFORM_BIN), else None (tests skip, saying so).
- `plugin_mirror()`: a provider filesystem mirror (OVERSPILL_TF_PLUGIN_MIRROR, or a `tf-plugins` directory up to
  three levels below /, as this machine image ships one) so init works offline; None means the public registry.
- `Workspace`: a copy of terraform/ in a temp dir (the checkout is never written to: no .terraform/, lock file or
  state appear in it) with an environment that uses the mirror; `run(dir, *args)` runs terraform there.
- `checkov_bin()`: checkov lives in its own virtualenv (its `hcl2` package clashes with python-hcl2 in the dev
  environment): OVERSPILL_CHECKOV_BIN, else `checkov` on PATH, else a virtualenv created once under the user cache
  (CHECKOV_VERSION pinned), else None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "terraform"
CHECKOV_VERSION = "3.3.30"


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
