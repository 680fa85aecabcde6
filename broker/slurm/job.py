"""The cloud job a burst runs: the user's own Slurm batch script, with its environment, in its working directory.

Contract: `cloud_job(details, *, gpus, paths)` turns what `providers.slurm.script.read_job` read about a held job
into the `command`, `env` and optional `image` of the broker job (a `CloudJob`), or raises `ScriptRefused` saying
why the job cannot run in the cloud as it would on-prem:

- One node. A job asking for more than one node, or a heterogeneous job, is refused: its script would `srun`
  across nodes the cloud instance does not have.
- Working directory. `paths` (`OVERSPILL_SLURM_CLOUD_PATHS`, a site setting) maps on-prem directories to where the
  same shared filesystem is mounted in the cloud image, e.g. `{"/home": "/home", "/scratch/proj": "/mnt/proj"}`;
  the longest matching prefix (whole path components) wins. The job's `WorkDir` and its `SLURM_SUBMIT_DIR` must
  both be absolute, normal (no `.`/`..` parts, no NUL or newline) and mapped, else the job is refused: it is never
  run somewhere else.
- Command: `bash -c <LAUNCHER> slurm-burst <cloud workdir>`. The launcher is fixed text: it rebuilds the script
  from `SLURM_SCRIPT_B64_0..n` (base64 in 30,000-character chunks, so no quoting of the script is ever involved,
  whatever it holds), unsets them, `cd`s into the mapped working directory and `exec`s the script as Slurm does:
  through its own `#!` interpreter. A missing directory or interpreter fails the job like any user error.
- Environment: the submission environment (`sacct --env-vars`) minus what describes the submit host rather than
  the job (`HOST_ONLY`: PATH, HOME, LD_LIBRARY_PATH, module-system and session variables, `SLURM_CONF`,
  rlimits...), minus names the broker cannot pass (not `[A-Za-z_][A-Za-z0-9_]*`, or the agent's own `OVERSPILL_*`),
  plus the `SLURM_*` variables a batch script commonly reads, set as Slurm would for this job: SLURM_JOB_ID (the
  Slurm job id; for an array task the task's own id), SLURM_JOBID, SLURM_JOB_NAME, SLURM_JOB_USER,
  SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION, SLURM_JOB_QOS, SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID (array tasks),
  SLURM_NTASKS/SLURM_NPROCS, SLURM_NNODES/SLURM_JOB_NUM_NODES (1), SLURM_GPUS/SLURM_GPUS_ON_NODE,
  SLURM_CPUS_PER_TASK (when set), SLURM_SUBMIT_DIR (mapped), SLURM_CLUSTER_NAME, and SLURM_JOB_ON_CLOUD=1. Too
  many or too large variables for a job's environment (`broker.api.schemas` limits) refuse the job, naming the count.
- Image: the job's own container when it names one (`providers.slurm.script.container_image`), else None (the
  account policy's and partition's default apply).
"""

from __future__ import annotations

import base64
import posixpath
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from broker.api.schemas import ENV_NAME, MAX_ENV_BYTES, MAX_ENV_ENTRIES, RESERVED_ENV_PREFIX, JobCreate
from broker.config.settings import Settings
from broker.observe.metrics import BurstReason
from broker.slurm.accounts import image_allowed
from broker.slurm.policy import BurstRequest, Refusal
from providers.slurm.script import (
    Runner,
    ScriptRefused,
    SlurmJobDetails,
    container_image,
    parse_show_job,
    read_job,
)

SCRIPT_ENV = "SLURM_SCRIPT_B64_"
CHUNK = 30_000
HOST_ONLY = frozenset(
    {
        "PATH", "HOME", "SHELL", "PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "HOST", "TMPDIR", "TERM", "DISPLAY",
        "MAIL", "LOGNAME", "USER", "LD_LIBRARY_PATH", "LD_PRELOAD", "LIBRARY_PATH", "MANPATH", "INFOPATH",
        "MODULEPATH", "MODULESHOME", "LOADEDMODULES", "_LMFILES_", "SLURM_CONF", "SLURM_PRIO_PROCESS", "SLURM_UMASK",
        "KRB5CCNAME", "SSH_AUTH_SOCK", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "VIRTUAL_ENV", "CONDA_PREFIX",
    }
)  # fmt: skip
HOST_ONLY_PREFIXES = ("SLURM_RLIMIT_", "BASH_FUNC_", "LMOD", "__LMOD", "XDG_", "SSH_", "SLURM_SCRIPT_B64_")
_ENV_NAME = re.compile(ENV_NAME)

LAUNCHER = (
    'set -e; d=$(mktemp -d); i=0; : > "$d/b64"; '
    f'while v="{SCRIPT_ENV}$i"; [ -n "${{!v+x}}" ]; do printf %s "${{!v}}" >> "$d/b64"; unset "$v"; i=$((i+1)); '
    'done; base64 -d "$d/b64" > "$d/slurm_script"; rm -f "$d/b64"; chmod 700 "$d/slurm_script"; '
    'cd -- "$1"; set +e; exec "$d/slurm_script"'
)


@dataclass(frozen=True, slots=True)
class CloudJob:
    """What a burst runs: `command` and `env` for the broker job, the job's own `image` (None: the default),
    the on-prem and cloud working directories, and the host-only variables it left behind (`dropped`)."""

    command: list[str]
    env: dict[str, str]
    image: str | None
    workdir: str
    cloud_workdir: str
    dropped: tuple[str, ...]


def map_path(path: str, paths: Mapping[str, str]) -> str | None:
    """Where an on-prem directory is in the cloud (longest whole-component prefix of `paths`), or None."""
    if not is_clean_path(path):
        return None
    best: tuple[str, str] | None = None
    for onprem, cloud in paths.items():
        base = onprem.rstrip("/") or "/"
        under = path == base or path.startswith(base.rstrip("/") + "/")
        if under and (best is None or len(base) > len(best[0])):
            best = (base, cloud)
    if best is None:
        return None
    base, cloud = best
    rest = path[len(base) :].lstrip("/") if base != "/" else path.lstrip("/")
    return posixpath.join(cloud, rest) if rest else cloud


def is_clean_path(path: str) -> bool:
    """Absolute, normal (no `.`, `..` or empty parts), without NUL, newline or other control characters."""
    if not path.startswith("/") or any(ord(c) < 32 or c == "\x7f" for c in path):
        return False
    return posixpath.normpath(path) == path or (path == "/")


def cloud_job(details: SlurmJobDetails, *, gpus: int, paths: Mapping[str, str], job_id: str = "") -> CloudJob:
    """Build the cloud job (see the module docstring); `job_id` overrides the record's JobId (an array task that
    got its own id when held)."""
    nodes = details.get("NumNodes").split("-", 1)[0]
    if (nodes.isdigit() and int(nodes) > 1) or details.get("HetJobId"):
        het = " (a heterogeneous job)" if details.get("HetJobId") else ""
        raise ScriptRefused(
            f"the job asks for {details.get('NumNodes')} nodes{het}: a burst runs a batch script on one cloud "
            "instance, so multi-node and heterogeneous jobs stay on-prem"
        )
    workdir = details.get("WorkDir")
    cloud_dir = map_path(workdir, paths)
    if cloud_dir is None:
        raise ScriptRefused(
            f"the job's working directory {workdir[:200]!r} is not under a path mapped to the cloud "
            f"(OVERSPILL_SLURM_CLOUD_PATHS: {', '.join(sorted(paths)) or 'none'}): it is not run elsewhere"
        )
    submit_dir = details.env.get("SLURM_SUBMIT_DIR", workdir)
    cloud_submit = map_path(submit_dir, paths)
    if cloud_submit is None:
        raise ScriptRefused(f"the job's submit directory {submit_dir[:200]!r} is not under a path mapped to the cloud")
    env, dropped = _user_env(details.env)
    env.update(_slurm_env(details, gpus=gpus, submit_dir=cloud_submit, job_id=job_id))
    encoded = base64.b64encode(details.script.encode("utf-8")).decode("ascii")
    for i in range(0, max(1, len(encoded)), CHUNK):
        env[f"{SCRIPT_ENV}{i // CHUNK}"] = encoded[i : i + CHUNK]
    _check_size(env)
    image = container_image(details.options, details.env, details.get("Container"))
    command = ["bash", "-c", LAUNCHER, "slurm-burst", cloud_dir]
    if len(cloud_dir) > 1000:
        raise ScriptRefused("the job's cloud working directory is over 1000 characters")
    return CloudJob(command, env, image, workdir, cloud_dir, tuple(sorted(dropped)))


def _user_env(submitted: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in submitted.items():
        host_only = name in HOST_ONLY or name.startswith(HOST_ONLY_PREFIXES)
        unusable = not _ENV_NAME.match(name) or name.upper().startswith(RESERVED_ENV_PREFIX) or "\x00" in value
        if host_only or unusable:
            dropped.append(name[:64])
            continue
        env[name] = value
    return env, dropped


def _slurm_env(details: SlurmJobDetails, *, gpus: int, submit_dir: str, job_id: str) -> dict[str, str]:
    rec = details.get
    own_id = job_id or rec("JobId")
    env = {
        "SLURM_JOB_ID": own_id,
        "SLURM_JOBID": own_id,
        "SLURM_JOB_NAME": rec("JobName"),
        "SLURM_JOB_USER": rec("UserId").split("(", 1)[0],
        "SLURM_JOB_ACCOUNT": rec("Account"),
        "SLURM_JOB_PARTITION": rec("Partition"),
        "SLURM_JOB_QOS": rec("QOS"),
        "SLURM_NTASKS": rec("NumTasks") or "1",
        "SLURM_NPROCS": rec("NumTasks") or "1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_GPUS": str(gpus),
        "SLURM_GPUS_ON_NODE": str(gpus),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_JOB_ON_CLOUD": "1",
    }
    array, sep, task = details.target.partition("_")
    if sep:
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = array, task
    cpus = rec("CPUs/Task")
    if cpus.isdigit():
        env["SLURM_CPUS_PER_TASK"] = cpus
    cluster = details.env.get("SLURM_CLUSTER_NAME")
    if cluster:
        env["SLURM_CLUSTER_NAME"] = cluster
    return {k: v for k, v in env.items() if v}


def _check_size(env: Mapping[str, str]) -> None:
    total = sum(len(k) + len(v.encode("utf-8", "replace")) for k, v in env.items())
    if len(env) > MAX_ENV_ENTRIES or total > MAX_ENV_BYTES:
        raise ScriptRefused(
            f"the job's environment and script add up to {len(env)} variables and {total} bytes, over the "
            f"{MAX_ENV_ENTRIES} variables and {MAX_ENV_BYTES} bytes a job carries (submit with --export=NONE or "
            "fewer variables, or a smaller script)"
        )


def with_script(request: BurstRequest, cloud: CloudJob, default_image: str | None) -> BurstRequest | Refusal:
    """The burst request running the job's script: its command and environment, and its own container when it names
    one (which the account's `allowed_images` must allow, unless it is the partition's default image)."""
    update: dict[str, object] = {"command": cloud.command, "env": cloud.env}
    if cloud.image is not None and cloud.image != request.create.image:
        if cloud.image != default_image and not image_allowed(cloud.image, request.policy.allowed_images):
            return Refusal(
                BurstReason.IMAGE_NOT_ALLOWED,
                f"the job's container {cloud.image} is not in the account's allowed_images",
            )
        update["image"] = cloud.image
    try:
        create = JobCreate(**{**request.create.model_dump(), **update})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return Refusal(BurstReason.JOB_NOT_RUNNABLE, problems[:500])
    return BurstRequest(create, request.policy, request.account)


@dataclass(frozen=True, slots=True)
class ScriptJob:
    """A burst request that runs the job's script, and what its `spec["slurm"]` records for the output step:
    the on-prem `output`/`error` paths, `workdir` and `cloud_workdir`, the host-only variables `dropped`."""

    request: BurstRequest
    record: dict[str, object]


def script_job(
    run: Runner, target: str, array_job_id: int | None, gpus: int, request: BurstRequest, settings: Settings,
    partition: str,
) -> ScriptJob | Refusal:  # fmt: skip
    """Read the held job and build its burst request (`read_job`, `cloud_job`, `with_script`), or the refusal."""
    try:
        details = read_job(run, target, array_job_id=array_job_id, require_env=settings.slurm_require_environment)
        cloud = cloud_job(details, gpus=gpus, paths=settings.slurm_cloud_paths)
    except ScriptRefused as exc:
        return Refusal(BurstReason.JOB_NOT_RUNNABLE, str(exc)[:500])
    built = with_script(request, cloud, settings.slurm_default_images.get(partition))
    if isinstance(built, Refusal):
        return built
    record: dict[str, object] = {
        "output": details.get("StdOut"),
        "error": details.get("StdErr"),
        "workdir": cloud.workdir,
        "cloud_workdir": cloud.cloud_workdir,
        "dropped_env": list(cloud.dropped),
        "env_known": details.env_known,
    }
    return ScriptJob(built, record)


def task_paths(run: Runner, target: str) -> dict[str, str]:
    """An array task's `--output`/`--error` as Slurm expands them once the task has its own job id (after the
    hold split it out of its array record: `%j` was the record's id before); {} when unreadable (the record's
    stay)."""
    try:
        done = run(["scontrol", "show", "job", target])
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return {}
    if done.returncode != 0:
        return {}
    record = parse_show_job(done.stdout or "")
    return {k: record[f] for k, f in (("output", "StdOut"), ("error", "StdErr")) if record.get(f)}
