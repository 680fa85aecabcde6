"""A throw-away real Slurm 22.05+ cluster for the test suite: MariaDB, slurmdbd, munged, slurmctld and two slurmd
on this host, with the broker as a non-root Slurm operator.

Contract: `slurm_session()` is the body of a session-scoped pytest fixture. It starts the daemons with every file
(config, munge key and socket, database, state, spool, logs, fake GPU device nodes) under one temp dir, waits until
every node is idle (about 2 s, most of it MariaDB), yields a `SlurmCluster`, and on teardown cancels every job, waits
for them to finish, runs `scontrol shutdown`, stops slurmdbd, MariaDB and munged and removes the dir. Without the
binaries (apt packages `slurm-wlm slurmdbd mariadb-server munge sudo`) or root (slurmd and mknod need it) it skips
with the reason; CI turns that skip into a failure.

The cluster: partition `gpu` (default, DefaultTime=60 min) over nodes `ovs1` and `ovs2`, each with 8 CPUs and 4
fake A100s (`Gres=gpu:a100:4`, gres.conf `AutoDetect=off` with `File=` pointing at character devices made with
`mknod c 195 N`: regular files would give jobs an empty CUDA_VISIBLE_DEVICES, and `Count=` alone drains the
node). `MinJobAge` is a day so finished jobs stay visible to `squeue` (`SlurmCluster.min_job_age(s)` shortens it
for a test), slurmdbd stores job comments (`AccountingStoreFlags=job_comment`, what a site running the broker
sets so `sacct` shows whose job it is), the backfill scheduler runs every second so
pending jobs get estimated start times quickly, and `KillWait=1` makes cancellation quick. Every command must run
with `SLURM_CONF` set: `SlurmCluster.env` / `SlurmCluster.run`.

Identities. Slurm 22.05 takes a user's `AdminLevel` from accounting only (with `accounting_storage/none` every
non-root user is level None, so an operator cannot exist), hence slurmdbd on a throw-away MariaDB (its system
tables from `mariadb-install-db` with a small InnoDB, under 1 s: slurmdbd's association queries call stored
procedures; then `--skip-grant-tables` on 127.0.0.1 and a free port: no database accounts). An operator cannot
write AdminComment (administrators only), which is why the broker marks its holds in the job's Comment. Unix users
are created if absent (`useradd`, no home, no login shell): `ovsbroker` (the broker, `AdminLevel=Operator`: it may
hold, release, update and cancel other users' jobs, and is neither root nor `SlurmUser`), the job owners `alice`
and `bob`, `carol` (whose account no policy maps), `tenant-acme` and `tenant-demo` (the identities the broker
submits tenants `acme`'s and `demo`'s on-prem jobs as). Accounts `acme` (alice, tenant-acme), `beta` (bob),
`gamma` (carol) and `demo` (tenant-demo); `AccountingStorageEnforce=associations` so an account must be real.
`SlurmCluster.run` runs a command as root (the site admin), `run_as(user, argv)` as a user, `broker_runner()` is a
runner (argv -> CompletedProcess) running every command as `ovsbroker`. A sudoers drop-in lets `ovsbroker` run
only `sbatch` and `tee`, only as `alice`, `bob` or the tenant identities, with `SLURM_CONF` kept: the site set-up
behind the provider's default `sudo -n -u <user> --` submit wrapper and the burst output writer
(`sudo -n -u <user> -- /usr/bin/tee -- <path>`, which writes a burst's log to the user's `--output` as that user).
`AccountingStoreFlags=job_env,job_script`: `sacct --env-vars` gives a pending job's submission environment.
With slurmdbd, `sacct` works too.

slurmrestd. With Slurm's JWT plugin installed, slurm.conf and slurmdbd.conf accept JWTs (`AuthAltTypes=auth/jwt`, a
random key in the temp dir); `SlurmCluster.restd()` starts slurmrestd (v0.0.38 and dbv0.0.38 plugins, JWT only,
`SLURM_JWT=daemon`) as `ovsbroker` on first use and returns its URL, `token(user)` mints a JWT, `jwt_file()` writes
the operator's to a file, `transport(kind)` / `transport_settings(kind)` give the provider transport or the broker
settings for "cli" or "rest". Without slurmrestd or the plugin, `restd()` skips saying what to install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from providers.slurm.rest import RestTransport
from providers.slurm.transport import CliTransport, SlurmTransport

NODES = ("ovs1", "ovs2")
BROKER_USER = "ovsbroker"
JOB_USERS = {"alice": "acme", "bob": "beta", "carol": "gamma", "tenant-acme": "acme", "tenant-demo": "demo"}
SUDOERS_FILE = Path("/etc/sudoers.d/overspill-test-slurm")
SUDOERS = (
    f'Defaults:{BROKER_USER} env_keep += "SLURM_CONF"\n'
    f"{BROKER_USER} ALL=(alice,bob,tenant-acme,tenant-demo) NOPASSWD: /usr/bin/sbatch, /usr/bin/tee\n"
)
GPUS_PER_NODE = 4
GPU_TYPE = "a100"
PARTITION = "gpu"
DEFAULT_MIN_JOB_AGE = 86400
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_STARTUP_TIMEOUT_S = 20.0


def find_daemon(name: str) -> str | None:
    """A Slurm/munge daemon on PATH or in the usual sbin dirs (which a non-login PATH may lack)."""
    found = shutil.which(name)
    if found:
        return found
    for base in _SBIN:
        path = Path(base) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def jwt_plugin() -> bool:
    """Whether Slurm's auth/jwt plugin is installed (Debian: slurm-wlm-jwt-plugin); the cluster accepts JWTs (for
    slurmrestd) only then."""
    return any(Path("/usr/lib").glob("*/slurm-wlm/auth_jwt.so")) or Path("/usr/lib/slurm/auth_jwt.so").exists()


def missing_requirements() -> str | None:
    """Why a cluster cannot start here, or None."""
    missing = [d for d in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd") if find_daemon(d) is None]
    tools = ("sbatch", "squeue", "sinfo", "scontrol", "scancel", "sacctmgr", "runuser", "sudo", "useradd")
    tools += ("mariadb-install-db", "visudo")
    missing += [c for c in tools if find_daemon(c) is None]
    if missing:
        return (
            f"Slurm binaries not found ({', '.join(missing)}): "
            "apt-get install -y slurm-wlm slurmdbd mariadb-server munge sudo (Debian bookworm: Slurm 22.05)"
        )
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (slurmd runs jobs as their user; fake GPUs need mknod)"
    return None


_PICKED: set[int] = set()


def _free_port() -> int:
    """A free port below the kernel's ephemeral range: a port taken from that range (bind to 0) can be handed out
    again as the local end of an outgoing connection (slurmctld to slurmdbd, sacctmgr...) before the daemon that
    was meant to listen on it binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, max(low, 20001))
        if port in _PICKED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PICKED.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


@dataclass
class SlurmCluster:
    """A running cluster. `env` carries SLURM_CONF; `run` runs a Slurm client command against it."""

    root: Path
    conf: Path
    env: dict[str, str]
    nodes: tuple[str, ...] = NODES
    gpus_per_node: int = GPUS_PER_NODE
    gpu_type: str = GPU_TYPE
    partition: str = PARTITION
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    restd_url: str = ""

    def run(self, args: list[str], *, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a command as root (the site's admin)."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True, check=check, timeout=30)

    def run_as(self, user: str, args: list[str], *, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a command as a unix user (a job owner, or the broker)."""
        return self.run(["runuser", "-u", user, "--", *args], check=check)

    def broker_runner(self) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
        """A provider runner executing every command as the broker's non-root operator account."""

        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return self.run_as(BROKER_USER, argv)

        return run

    def token(self, user: str = BROKER_USER, lifespan: int = 3600) -> str:
        """A JWT for `user` (`scontrol token`, which only root or SlurmUser may run for another user)."""
        out = self.run(["scontrol", "token", f"username={user}", f"lifespan={lifespan}"], check=True).stdout
        return out.strip().partition("SLURM_JWT=")[2]

    def restd(self) -> str:
        """slurmrestd for this cluster (started on first use, stopped with the cluster): the v0.0.38 and dbv0.0.38
        plugins, JWT authentication only, running as the broker's operator account (slurmrestd refuses root) on a
        free 127.0.0.1 port. Returns its base URL. Callers send `X-SLURM-USER-NAME`/`X-SLURM-USER-TOKEN`."""
        if "slurmrestd" in self.procs and self.procs["slurmrestd"].poll() is None:
            return self.restd_url
        binary = find_daemon("slurmrestd")
        if binary is None or not jwt_plugin():
            pytest.skip("slurmrestd or its JWT plugin missing (apt-get install -y slurmrestd slurm-wlm-jwt-plugin)")
        port = _free_port()
        env = {**self.env, "SLURM_JWT": "daemon"}
        argv = [binary, "-u", BROKER_USER, "-s", "openapi/v0.0.38,openapi/dbv0.0.38", "-a", "rest_auth/jwt"]
        self.procs["slurmrestd"] = _spawn([*argv, f"127.0.0.1:{port}"], env, self.root / "log" / "slurmrestd.out")
        self.restd_url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: _port_open(port), "slurmrestd", self)
        return self.restd_url

    def jwt_file(self, lifespan: int = 86400) -> Path:
        """A file holding a fresh JWT for the broker's operator account (what a site's cron'd `scontrol token`
        writes for the broker's `OVERSPILL_SLURM_JWT_FILE`)."""
        path = self.root / "run" / "broker.jwt"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.token(BROKER_USER, lifespan) + "\n")
        tmp.replace(path)
        return path

    def transport_settings(self, kind: str) -> dict[str, object]:
        """The broker settings that select transport `kind` ("cli" or "rest") on this cluster."""
        if kind == "cli":
            return {"slurm_transport": "cli"}
        return {
            "slurm_transport": "rest",
            "slurmrestd_url": self.restd(),
            "slurmrestd_user": BROKER_USER,
            "slurm_jwt_file": str(self.jwt_file()),
        }

    def transport(self, kind: str) -> SlurmTransport:
        """A transport of `kind` ("cli" or "rest") acting as the broker's operator (`broker_runner`)."""
        cli = CliTransport(self.broker_runner())
        if kind == "cli":
            return cli
        return RestTransport(self.restd(), BROKER_USER, fallback=cli, token_file=str(self.jwt_file()))

    def jobs(self) -> list[dict[str, object]]:
        out = self.run(["squeue", "--json", "--all", "--states=all"], check=True).stdout
        return list(json.loads(out)["jobs"])

    def cancel_all(self, timeout: float = 15.0) -> None:
        """Cancel every job and wait until none is pending, running or completing (GPUs free again)."""
        live = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD")
        deadline = time.monotonic() + timeout
        while True:
            active = [_target(j) for j in self.jobs() if _state(j) in live]
            if not active:
                return
            self.run(["scancel", *active])
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still active after scancel: {active}")
            time.sleep(0.1)

    @contextlib.contextmanager
    def min_job_age(self, seconds: int) -> Iterator[None]:
        """Run with `MinJobAge=seconds` (slurmctld forgets a finished job that long after it ends; it purges on a
        timer, so a job leaves squeue up to about a minute later), then put the default back. `scontrol
        reconfigure` applies each change."""
        text = self.conf.read_text()
        self.conf.write_text(text.replace(f"MinJobAge={DEFAULT_MIN_JOB_AGE}", f"MinJobAge={seconds}"))
        self.run(["scontrol", "reconfigure"], check=True)
        try:
            yield
        finally:
            self.conf.write_text(text)
            self.run(["scontrol", "reconfigure"], check=True)

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, TimeoutError, ValueError, KeyError):
            self.cancel_all()
        if "slurmctld" in self.procs:
            self.run(["scontrol", "shutdown"])
        for name, proc in reversed(list(self.procs.items())):
            if name == "munged":
                continue
            if name in ("slurmrestd", "slurmdbd", "mariadbd") and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            _stop_proc(proc, 10.0)
        if "munged" in self.procs:  # munged only stops when told
            self.procs["munged"].send_signal(signal.SIGTERM)
            _stop_proc(self.procs["munged"], 5.0)
        shutil.rmtree(self.root, ignore_errors=True)


def _target(job: dict[str, object]) -> str:
    """How scancel names a job: `<array>_<task>` for an array task (22.05 ignores a task's own job id)."""
    array, task = job.get("array_job_id"), job.get("array_task_id")
    if isinstance(array, dict):  # 23.11+: {"set", "number"}
        array = array.get("number") if array.get("set") else None
    if isinstance(task, dict):
        task = task.get("number") if task.get("set") else None
    return f"{array}_{task}" if array and task is not None else str(job["job_id"])


def _state(job: dict[str, object]) -> str:
    state = job.get("job_state")
    return str(state[0] if isinstance(state, list) and state else state)


def _stop_proc(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _write_config(root: Path, db_port: int, dbd_port: int) -> Path:
    host = socket.gethostname().split(".")[0]
    ctld_port = _free_port()
    (root / "etc").mkdir()
    for sub in ("state", "spool", "log", "run"):
        (root / sub).mkdir()
    shared = root / "shared"  # job output and markers, written by jobs of every user
    shared.mkdir()
    os.chmod(shared, 0o1777)
    jwt_key = root / "etc" / "jwt.key"  # HS256 key slurmctld and slurmdbd verify slurmrestd callers' tokens with
    jwt_key.write_bytes(os.urandom(64))
    os.chmod(jwt_key, 0o600)
    jwt_lines = ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={jwt_key}"] if jwt_plugin() else []
    dbd = root / "etc" / "slurmdbd.conf"
    dbd.write_text(
        "\n".join(
            [
                "AuthType=auth/munge",
                f"AuthInfo=socket={root}/run/munge.socket",
                *jwt_lines,
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"LogFile={root}/log/slurmdbd.log",
                f"PidFile={root}/run/slurmdbd.pid",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                "StorageUser=slurm",
                "StorageLoc=slurm_acct_db",
                "",
            ]
        )
    )
    os.chmod(dbd, 0o600)
    gres_lines = ["AutoDetect=off"]
    node_lines = []
    for node in NODES:
        devdir = root / "dev" / node
        devdir.mkdir(parents=True)
        for i in range(GPUS_PER_NODE):
            os.mknod(devdir / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))  # S_IFCHR
        gres_lines.append(f"NodeName={node} Name=gpu Type={GPU_TYPE} File={devdir}/nvidia[0-{GPUS_PER_NODE - 1}]")
        node_lines.append(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=8 "
            f"RealMemory=8000 Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE} State=UNKNOWN"
        )
    conf = root / "etc" / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=overspill",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={ctld_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={root}/run/munge.socket",
                *jwt_lines,  # slurmrestd's callers present JWTs (SLURM_JWT=daemon in its env)
                f"StateSaveLocation={root}/state",
                f"SlurmdSpoolDir={root}/spool/%n",
                f"SlurmctldPidFile={root}/run/slurmctld.pid",
                f"SlurmdPidFile={root}/run/slurmd.%n.pid",
                f"SlurmctldLogFile={root}/log/slurmctld.log",
                f"SlurmdLogFile={root}/log/slurmd.%n.log",
                "SlurmctldDebug=info",
                "SlurmdDebug=info",
                "SlurmdParameters=config_overrides",
                "SwitchType=switch/none",
                "MpiDefault=none",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={dbd_port}",
                f"AccountingStoragePass={root}/run/munge.socket",  # the munge socket for slurmdbd connections
                "AccountingStorageEnforce=associations",
                # sacct --env-vars: a held job's environment; job_comment: sacct shows whose job it is
                "AccountingStoreFlags=job_comment,job_env,job_script",
                "JobCompType=jobcomp/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "DefMemPerCPU=100",
                "GresTypes=gpu",
                "SchedulerType=sched/backfill",
                "SchedulerParameters=bf_interval=1,sched_min_interval=0",
                f"MinJobAge={DEFAULT_MIN_JOB_AGE}",
                "KillWait=1",
                "InactiveLimit=0",
                "ReturnToService=2",
                "SlurmdTimeout=60",
                *node_lines,
                f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE DefaultTime=60",
                "",
            ]
        )
    )
    (root / "etc" / "gres.conf").write_text("\n".join([*gres_lines, ""]))
    (root / "etc" / "cgroup.conf").write_text("")
    return conf


def ensure_users() -> None:
    """Create the unix users the cluster's jobs and the broker run as (no home, no login shell), if absent."""
    for user in (BROKER_USER, *JOB_USERS):
        if subprocess.run(["getent", "passwd", user], capture_output=True, check=False).returncode != 0:
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], capture_output=True, check=True
            )


def _install_sudoers() -> None:
    """The site's sudoers rule for the broker's submit wrapper. It stays after the session (it only lets
    `ovsbroker` run sbatch as the test users): removing it could pull it from under a concurrent session."""
    if SUDOERS_FILE.exists() and SUDOERS_FILE.read_text() == SUDOERS:
        return
    tmp = SUDOERS_FILE.with_suffix(".tmp")
    tmp.write_text(SUDOERS)
    os.chmod(tmp, 0o440)
    check = subprocess.run(
        [find_daemon("visudo") or "visudo", "-cf", str(tmp)], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        tmp.unlink()
        raise RuntimeError(f"sudoers drop-in refused by visudo: {check.stdout}{check.stderr}")
    tmp.replace(SUDOERS_FILE)


_SMALL_INNODB = (  # a small, unsafe-on-crash InnoDB: the database lives for one test session
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=4M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-use-native-aio=0",
)


def _accounting_commands() -> list[list[str]]:
    """The sacctmgr set-up: the cluster, its accounts, the job owners and the broker as an operator."""
    by_account: dict[str, list[str]] = {}
    for user, acct in JOB_USERS.items():
        by_account.setdefault(acct, []).append(user)
    return [
        ["add", "cluster", "overspill"],
        ["add", "account", ",".join(sorted(by_account)), "cluster=overspill"],
        *(["add", "user", ",".join(users), f"account={a}", "cluster=overspill"] for a, users in by_account.items()),
        ["add", "user", BROKER_USER, "account=root", "cluster=overspill", "adminlevel=Operator"],
    ]


def _template_dir() -> Path:
    """Where a set-up accounting database is kept between sessions, keyed by the set-up and the MariaDB build."""
    mariadbd = find_daemon("mariadbd") or ""
    stamp = f"{_accounting_commands()}|{_SMALL_INNODB}|{mariadbd}|{os.stat(mariadbd).st_mtime if mariadbd else 0}"
    return (
        Path(os.environ.get("OVERSPILL_TEST_CACHE", "/var/tmp"))
        / f"overspill-slurmdbd-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
    )


def _start_accounting(cluster: SlurmCluster, db_port: int) -> None:
    """MariaDB and slurmdbd with the cluster's accounts, users and the operator.

    The first session builds the database (`mariadb-install-db`: slurmdbd's association queries call stored
    procedures, so the system tables are needed; then the sacctmgr set-up), stops both daemons and keeps a copy of
    the data dir as a template; later sessions start from a copy of it (seconds saved on a loaded machine).
    """
    root = cluster.root
    data, run = root / "mysql", root / "mysql-run"
    run.mkdir()
    shutil.chown(run, "mysql", "mysql")
    template = _template_dir()
    fresh = not template.is_dir()
    if fresh:
        data.mkdir()
        shutil.chown(data, "mysql", "mysql")
        install = find_daemon("mariadb-install-db")
        assert install is not None
        done = subprocess.run(
            [install, "--no-defaults", f"--datadir={data}", "--user=mysql", "--skip-test-db", *_SMALL_INNODB],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    else:
        shutil.copytree(template, data, symlinks=True)
        subprocess.run(["chown", "-R", "mysql:mysql", str(data)], check=True)
    _start_database(cluster, data, run, db_port)
    if not fresh:
        return
    for args in _accounting_commands():
        done = cluster.run(["sacctmgr", "-i", *args])
        if done.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(args)} failed: {done.stdout}{done.stderr}")
    for name in ("slurmdbd", "mariadbd"):  # a clean shutdown, so the copy is consistent
        proc = cluster.procs.pop(name)
        proc.send_signal(signal.SIGTERM)
        _stop_proc(proc, 20.0)
    staging = Path(tempfile.mkdtemp(prefix=template.name + ".", dir=template.parent))
    shutil.copytree(data, staging / "data", symlinks=True)
    with contextlib.suppress(OSError):  # another session saved it first: theirs is as good
        (staging / "data").rename(template)
    shutil.rmtree(staging, ignore_errors=True)
    _start_database(cluster, data, run, db_port)


def _start_database(cluster: SlurmCluster, data: Path, run: Path, db_port: int) -> None:
    mariadbd = find_daemon("mariadbd")
    slurmdbd = find_daemon("slurmdbd")
    assert mariadbd is not None and slurmdbd is not None
    cluster.procs["mariadbd"] = _spawn(
        [
            mariadbd,
            "--no-defaults",
            f"--datadir={data}",
            f"--socket={run}/mysqld.sock",
            f"--pid-file={run}/mysqld.pid",
            f"--port={db_port}",
            "--bind-address=127.0.0.1",
            "--user=mysql",
            "--skip-grant-tables",  # a throw-away database on 127.0.0.1: no database accounts to set up
            *_SMALL_INNODB,
        ],
        cluster.env,
        cluster.root / "log" / "mariadbd.out",
    )
    _wait_for(lambda: _port_open(db_port), "MariaDB", cluster)
    cluster.procs["slurmdbd"] = _spawn([slurmdbd, "-D"], cluster.env, cluster.root / "log" / "slurmdbd.out")
    _wait_for(lambda: cluster.run(["sacctmgr", "-n", "list", "cluster"]).returncode == 0, "slurmdbd", cluster)


def start_slurm_cluster() -> SlurmCluster:
    """Start MariaDB, slurmdbd, munged, slurmctld and one slurmd per node under a new temp dir; return once every
    node is idle."""
    reason = missing_requirements()
    if reason:
        raise FileNotFoundError(reason)
    ensure_users()
    root = Path(tempfile.mkdtemp(prefix="overspill-slurm-"))
    os.chmod(root, 0o755)
    cluster: SlurmCluster | None = None
    try:
        db_port, dbd_port = _free_port(), _free_port()
        conf = _write_config(root, db_port, dbd_port)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        env["PATH"] = ":".join([env.get("PATH", ""), *_SBIN])
        cluster = SlurmCluster(root=root, conf=conf, env=env)
        _install_sudoers()
        key = root / "etc" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(root / "run", 0o711)
        munged = find_daemon("munged")
        assert munged is not None
        cluster.procs["munged"] = _spawn(
            [
                munged,
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/run/munge.socket",
                f"--pid-file={root}/run/munged.pid",
                f"--log-file={root}/log/munged.log",
                f"--seed-file={root}/run/munged.seed",
            ],
            env,
            root / "log" / "munged.out",
        )
        _wait_for(lambda: (root / "run" / "munge.socket").exists(), "munged socket", cluster)
        _start_accounting(cluster, db_port)
        ctld = find_daemon("slurmctld")
        slurmd = find_daemon("slurmd")
        assert ctld is not None and slurmd is not None
        cluster.procs["slurmctld"] = _spawn([ctld, "-D", "-i"], env, root / "log" / "slurmctld.out")
        _wait_for(lambda: cluster.run(["scontrol", "ping"]).returncode == 0, "slurmctld", cluster)
        for node in NODES:
            cluster.procs[f"slurmd-{node}"] = _spawn([slurmd, "-D", "-N", node], env, root / "log" / f"{node}.out")
        _wait_for(lambda: _all_idle(cluster), "nodes idle", cluster)
        return cluster
    except BaseException:
        if cluster is not None:
            cluster.stop()
        else:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _spawn(cmd: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _all_idle(cluster: SlurmCluster) -> bool:
    done = cluster.run(["sinfo", "--json"])
    if done.returncode != 0:
        return False
    nodes = json.loads(done.stdout).get("nodes", [])
    states = {n["name"]: n["state"] for n in nodes}
    return all(str(states.get(node, "")).lower() == "idle" for node in NODES)


def _wait_for(check: object, what: str, cluster: SlurmCluster) -> None:
    assert callable(check)
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while not check():
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}: {_tail(cluster)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}: {_tail(cluster)}")
        time.sleep(0.05)


def _tail(cluster: SlurmCluster) -> str:
    parts = []
    for path in sorted((cluster.root / "log").glob("*")):
        text = path.read_text(errors="replace").strip().splitlines()[-8:]
        if text:
            parts.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(parts)


def slurm_session() -> Iterator[SlurmCluster]:
    """Body of a session-scoped fixture: start the cluster (or skip saying why), yield it, stop it."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    try:
        cluster = start_slurm_cluster()
    except PermissionError as exc:  # e.g. a container without CAP_MKNOD for the fake GPU devices
        pytest.skip(f"cannot set up the test Slurm cluster here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
