"""A throw-away PostgreSQL server for the test suite, started from the installed binaries.

`OVERSPILL_TEST_POSTGRES_URL` points the suite at an existing server instead. Running as root, the cluster is
owned by the `postgres` system user (initdb refuses root). Every test gets its own database.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg


def find_pg_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    admin_url: str
    data_dir: Path | None = None
    bin_dir: Path | None = None
    run_as: str | None = None

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        base = self.admin_url.rsplit("/", 1)[0]
        return f"{base}/{name}"

    def stop(self) -> None:
        if self.data_dir is None or self.bin_dir is None:
            return
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "stop", "-m", "fast"], self.run_as)
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _run(cmd: list[str], user: str | None) -> subprocess.CompletedProcess[str]:
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def start_postgres() -> PgServer:
    """Start a cluster in a temp dir on a free loopback port (about a second)."""
    given = os.environ.get("OVERSPILL_TEST_POSTGRES_URL")
    if given:
        return PgServer(admin_url=given)
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL binaries (initdb, pg_ctl) not found; install the postgresql package")
    run_as = None
    root = Path(tempfile.mkdtemp(prefix="overspill-pg-"))
    if os.geteuid() == 0:
        run_as = "postgres"
        pw = pwd.getpwnam(run_as)
        os.chmod(root, 0o755)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data = root / "data"
    _run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"], run_as)
    port = _free_port()
    opts = f"-k {root} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=500"
    _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start"], run_as)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 20
    while True:
        try:
            psycopg.connect(url).close()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return PgServer(admin_url=url, data_dir=data, bin_dir=bin_dir, run_as=run_as)
