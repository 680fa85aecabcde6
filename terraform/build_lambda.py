"""Build the broker's Lambda deployment package (the zip terraform/ deploys) from this checkout.

    python terraform/build_lambda.py --out dist/overspill-lambda.zip \
        [--python-version 3.12] [--architecture x86_64 | arm64] [--no-deps]

The project's own packages (those pyproject.toml's setuptools section includes, with their package data such as
the Alembic migrations) are copied as they are; its runtime dependencies plus the `lambda` extra are installed by
pip for Lambda's platform and Python (binary wheels only, so psycopg's binary build is what lands). The zip has
sorted entries and fixed timestamps: the same inputs give the same bytes, so Terraform's `source_code_hash` changes
only when the code or a dependency does. `--no-deps` packages only the project's code (offline; for tests, or a
layer that carries the dependencies). Match `--python-version` and `--architecture` to the module's `lambda_runtime`
and `lambda_architecture`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANDLER_MODULE = "broker/serverless.py"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)
SKIP_PARTS = frozenset({"__pycache__", ".pytest_cache"})
PLATFORMS = {"x86_64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}


def project_packages(root: Path = ROOT) -> list[str]:
    """Top-level packages pyproject.toml ships (tool.setuptools.packages.find.include, e.g. "broker*")."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*").rstrip(".") for p in patterns})


def requirements(root: Path = ROOT, extra: str = "lambda") -> list[str]:
    """The project's runtime dependencies plus one extra's."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def copy_packages(root: Path, staging: Path) -> None:
    for name in project_packages(root):
        shutil.copytree(
            root / name, staging / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
        )


def install_dependencies(staging: Path, *, python_version: str, platform: str) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--target",
        str(staging),
        "--platform",
        platform,
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        "--only-binary=:all:",
        *requirements(),
    ]
    subprocess.run(command, check=True)


def _files(staging: Path) -> Iterator[Path]:
    for path in sorted(staging.rglob("*")):
        if path.is_file() and not SKIP_PARTS.intersection(path.relative_to(staging).parts) and path.suffix != ".pyc":
            yield path


def write_zip(staging: Path, out: Path) -> int:
    """Zip `staging` reproducibly into `out`; returns the number of files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for path in _files(staging):
            info = zipfile.ZipInfo(path.relative_to(staging).as_posix(), date_time=FIXED_TIME)
            info.external_attr = (0o755 if path.stat().st_mode & 0o111 else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
            count += 1
    return count


def build(out: Path, *, python_version: str, platform: str, deps: bool = True, root: Path = ROOT) -> int:
    with tempfile.TemporaryDirectory(prefix="overspill-lambda-") as tmp:
        staging = Path(tmp)
        copy_packages(root, staging)
        if deps:
            install_dependencies(staging, python_version=python_version, platform=platform)
        if not (staging / HANDLER_MODULE).is_file():
            raise SystemExit(f"{HANDLER_MODULE} is missing from the package")
        return write_zip(staging, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "overspill-lambda.zip")
    parser.add_argument("--python-version", default="3.12", help="Lambda runtime's Python (3.11, 3.12, 3.13)")
    parser.add_argument("--architecture", choices=sorted(PLATFORMS), default="x86_64")
    parser.add_argument("--no-deps", action="store_true", help="package only the project's own code")
    args = parser.parse_args(argv)
    count = build(
        args.out,
        python_version=args.python_version,
        platform=PLATFORMS[args.architecture],
        deps=not args.no_deps,
    )
    size = args.out.stat().st_size
    print(f"{args.out}: {count} files, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
