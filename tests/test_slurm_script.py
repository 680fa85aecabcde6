"""Carrying a user's Slurm batch script to the cloud (providers/slurm/script.py, broker/slurm/job.py): hostile script
text arrives byte for byte and runs through the real launcher under bash; NULs, non-UTF-8 and oversized scripts are
refused with the reason; unmapped or crooked working directories are refused, never run elsewhere; the
environment loses only what describes the submit host; `#SBATCH` and pyxis container names become pullable images."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from broker.api.schemas import JobCreate
from broker.config.settings import Settings
from broker.slurm.job import CHUNK, LAUNCHER, SCRIPT_ENV, cloud_job, map_path, with_script
from broker.slurm.policy import BurstRequest, Refusal
from providers.slurm.script import (
    MAX_SCRIPT_BYTES,
    ScriptRefused,
    SlurmJobDetails,
    container_image,
    parse_env_vars,
    parse_show_job,
    read_job,
    sbatch_options,
)

SHOW_JOB = """JobId=41 JobName=train it
   UserId=alice(1002) GroupId=alice(1002) MCS_label=N/A
   Priority=0 Nice=0 Account=acme QOS=normal
   JobState=PENDING Reason=JobHeldAdmin Dependency=(null)
   NumNodes=1 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   Partition=gpu AllocNode:Sid=localhost:9527
   Command={workdir}/job.sh
   WorkDir={workdir}
   StdErr={workdir}/out 41.txt
   StdIn=/dev/null
   StdOut={workdir}/out 41.txt
   Container=
"""


def _details(tmp: Path, script: str, env: dict[str, str] | None = None, target: str = "41") -> SlurmJobDetails:
    record = parse_show_job(SHOW_JOB.format(workdir=tmp))
    base = {"SLURM_SUBMIT_DIR": str(tmp), "MYVAR": "from the login node", "PATH": "/login/bin", **(env or {})}
    return SlurmJobDetails(target, script, record, base, tuple(sbatch_options(script)))


def _run(job: Any, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": "/usr/bin:/bin", **job.env}
    return subprocess.run(job.command, env=env, cwd="/", capture_output=True, timeout=30, check=False)


HOSTILE = (
    "#!/bin/bash\n"
    "#SBATCH --job-name='it''s \"quoted\"' # a comment\n"
    'echo "id=$SLURM_JOB_ID var=$MYVAR pwd=$(pwd) path_kept=${PATH#/login}"\n'
    "echo 'single '\"'\"' quote' \\$\\(not run\\) `printf backtick` $'\\x41'\n"
    "cat <<'EOF'\n$(rm -rf /) ${IFS} ; && || \\ \\\\ \t tab é ünïcødé 🚀\nEOF\n"
    "printf '%s\\n' \"${SLURM_SCRIPT_B64_0:-script vars gone}\"\n"
    'cp -- "$0" ./carried\n'
)


def test_a_hostile_script_arrives_byte_for_byte_and_runs_in_its_mapped_directory(tmp_path: Path) -> None:
    onprem, cloud = tmp_path / "site" / "proj", tmp_path / "cloud" / "proj"
    onprem.mkdir(parents=True)
    cloud.mkdir(parents=True)
    job = cloud_job(_details(onprem, HOSTILE), gpus=2, paths={str(tmp_path / "site"): str(tmp_path / "cloud")})
    assert job.command[:2] == ["bash", "-c"] and job.command[2] == LAUNCHER and job.command[-1] == str(cloud)
    JobCreate(name="x", image="r/i:1", accelerators=["A100"], gpu_count=2, max_total_usd="1", runtime_hours="1", **{
        "command": job.command, "env": job.env})  # fmt: skip  # what the broker job validates
    done = _run(job, cloud)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert f"id=41 var=from the login node pwd={cloud} path_kept=/usr/bin:/bin" in out  # PATH is the image's
    assert "single ' quote $(not run) backtick A" in out
    assert "$(rm -rf /) ${IFS} ; && || \\ \\\\ \t tab é ünïcødé 🚀" in out
    assert "script vars gone" in out  # the carrier variables are not the script's business
    assert (cloud / "carried").read_text() == HOSTILE  # the very script, byte for byte


def test_a_large_script_travels_in_chunks_and_an_oversized_one_is_refused(tmp_path: Path) -> None:
    body = "#!/bin/bash\n" + "".join(f": line {i} {'x' * 60}\n" for i in range(1200)) + "echo end-of-big\n"
    assert len(body) > 2 * CHUNK
    job = cloud_job(_details(tmp_path, body), gpus=1, paths={str(tmp_path): str(tmp_path)})
    assert sum(1 for k in job.env if k.startswith(SCRIPT_ENV)) >= 3
    assert _run(job, tmp_path).stdout.decode().strip() == "end-of-big"

    def runner(script: str) -> Any:
        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            out = {"write": script, "show": SHOW_JOB.format(workdir=tmp_path)}.get(argv[1], "")
            if argv[0] == "sacct":
                out = "Environment used for 41\n-----\nA=1\n"
            return subprocess.CompletedProcess(argv, 0, out, "")

        return run

    huge = "#!/bin/bash\n" + "#" * MAX_SCRIPT_BYTES
    with pytest.raises(ScriptRefused, match=f"over the {MAX_SCRIPT_BYTES}"):
        read_job(runner(huge), "41")
    with pytest.raises(ScriptRefused, match="NUL"):
        read_job(runner("#!/bin/bash\necho a\x00b\n"), "41")
    with pytest.raises(ScriptRefused, match="#!"):
        read_job(runner("echo no interpreter\n"), "41")
    assert read_job(runner("#!/bin/sh\necho ok\n"), "41").env == {"A": "1"}


def test_unreadable_text_and_missing_environment_are_refused_with_the_reason(tmp_path: Path) -> None:
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "scontrol" and argv[1] == "write":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return subprocess.CompletedProcess(argv, 0, "", "")

    with pytest.raises(ScriptRefused, match="not UTF-8"):
        read_job(run, "41")

    def no_env(argv: list[str]) -> subprocess.CompletedProcess[str]:
        out = {"scontrol": "#!/bin/bash\n" if argv[1] == "write" else SHOW_JOB.format(workdir=tmp_path)}
        return subprocess.CompletedProcess(argv, 0, out.get(argv[0], ""), "")

    with pytest.raises(ScriptRefused, match="AccountingStoreFlags=job_env"):
        read_job(no_env, "41")


@pytest.mark.parametrize(
    ("workdir", "why"),
    [
        ("/elsewhere/proj", "not under a path mapped"),
        ("/site/proj/../../etc", "not under a path mapped"),
        ("/site/./proj", "not under a path mapped"),
        ("/site/pro\nj", "not under a path mapped"),
        ("relative/proj", "not under a path mapped"),
        ("/sitex/proj", "not under a path mapped"),  # a prefix of a name is no parent directory
    ],
)
def test_a_working_directory_not_mapped_to_the_cloud_is_refused(workdir: str, why: str) -> None:
    details = SlurmJobDetails("41", "#!/bin/bash\n", {"WorkDir": workdir}, {"SLURM_SUBMIT_DIR": "/site"})
    with pytest.raises(ScriptRefused, match=why):
        cloud_job(details, gpus=1, paths={"/site": "/mnt/site"})


def test_paths_map_by_the_longest_whole_component_prefix() -> None:
    paths = {"/site": "/mnt/site", "/site/fast": "/fast", "/": "/root-mirror"}
    assert map_path("/site/proj/a", paths) == "/mnt/site/proj/a"
    assert map_path("/site/fast/x", paths) == "/fast/x"
    assert map_path("/site", paths) == "/mnt/site"
    assert map_path("/other", paths) == "/root-mirror/other"
    assert map_path("/site/../etc", paths) is None


def test_the_environment_keeps_the_jobs_variables_and_sets_slurms(tmp_path: Path) -> None:
    env = {
        "LD_PRELOAD": "/login/evil.so",
        "BASH_FUNC_module%%": "() { :; }",
        "OVERSPILL_CHECKPOINT_DIR": "/mine",
        "SLURM_RLIMIT_NOFILE": "1024",
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_JOB_ID": "forged",
        "WANDB_PROJECT": "atlas",
    }
    job = cloud_job(_details(tmp_path, "#!/bin/bash\n", env, target="40_3"), gpus=4, paths={"/": "/"}, job_id="44")
    assert job.env["WANDB_PROJECT"] == "atlas" and job.env["SLURM_ARRAY_TASK_COUNT"] == "4"
    assert (job.env["SLURM_JOB_ID"], job.env["SLURM_ARRAY_JOB_ID"], job.env["SLURM_ARRAY_TASK_ID"]) == ("44", "40", "3")
    assert (job.env["SLURM_JOB_NAME"], job.env["SLURM_JOB_USER"], job.env["SLURM_JOB_ACCOUNT"]) == (
        "train it", "alice", "acme")  # fmt: skip
    assert (job.env["SLURM_NTASKS"], job.env["SLURM_GPUS_ON_NODE"], job.env["SLURM_SUBMIT_DIR"]) == (
        "2",
        "4",
        str(tmp_path),
    )
    for gone in ("LD_PRELOAD", "BASH_FUNC_module%%", "OVERSPILL_CHECKPOINT_DIR", "SLURM_RLIMIT_NOFILE", "PATH"):
        assert gone not in job.env and gone in job.dropped


def test_an_environment_too_large_for_a_job_is_refused_naming_the_count(tmp_path: Path) -> None:
    env = {f"V{i}": "x" for i in range(200)}
    with pytest.raises(ScriptRefused, match=r"variables and \d+ bytes, over the 128 variables"):
        cloud_job(_details(tmp_path, "#!/bin/bash\n", env), gpus=1, paths={"/": "/"})


def test_sbatch_options_stop_at_the_first_command_and_survive_bad_quotes() -> None:
    script = (
        "#!/bin/bash\n#SBATCH -J name --output out.txt\n\n# a comment\n"
        "#SBATCH --container-image=nvcr.io\\#nvidia/pytorch:24.01\n"
        "#SBATCH --error='unterminated\n#SBATCH --gres=gpu:a100:2 # two\necho go\n#SBATCH --container-image=late:1\n"
    )
    opts = sbatch_options(script)
    assert opts == [("-J", "name"), ("--output", "out.txt"), ("--container-image", "nvcr.io#nvidia/pytorch:24.01"),
                    ("--gres", "gpu:a100:2")]  # fmt: skip
    assert container_image(opts, {}) == "nvcr.io/nvidia/pytorch:24.01"
    assert (
        container_image([], {"_SLURM_SPANK_OPTION_pyxis_container_image": "docker://ghcr.io/a/b:2"}) == "ghcr.io/a/b:2"
    )
    assert container_image([("--container", "ghcr.io/x/y:1")], {}) == "ghcr.io/x/y:1"
    assert container_image([], {}) is None
    for local in ("/srv/images/torch.sqsh", "/srv/bundles/oci", "./img.sif"):
        with pytest.raises(ScriptRefused, match="cannot pull it"):
            container_image([("--container-image", local)], {})


def test_sacct_environment_parsing() -> None:
    text = "Environment used for 3_[0-1] (must be batch to display)\n" + "-" * 80 + "\nA=1\nB=two\nlines\nC==x\n\n"
    assert parse_env_vars(text) == {"A": "1", "B": "two\nlines", "C": "=x"}
    assert parse_env_vars("") is None
    assert parse_env_vars(text + text) is None  # two jobs' blocks (a reused id): ambiguous, never guessed
    tasks = text.replace("3_[0-1]", "3_0") + text.replace("3_[0-1]", "3_[1]").replace("A=1", "A=2")
    assert parse_env_vars(tasks, 3) == {"A": "1", "B": "two\nlines", "C": "=x"}  # an array's split tasks
    assert parse_env_vars(text.replace("3_[0-1]", "33_[0-1]"), 3) is None  # another array


def _judged(tmp: Path, script: str) -> Any:
    from tests.test_slurm_policy import judge

    allowed = judge({"max_total_usd": "40"})
    assert not isinstance(allowed, Refusal)
    cloud = cloud_job(_details(tmp, script), gpus=2, paths={"/": "/"})
    return with_script(allowed, cloud, "registry.site/runner:1")


def test_the_jobs_own_container_runs_only_when_the_account_allows_it(tmp_path: Path) -> None:
    own = _judged(tmp_path, "#!/bin/bash\n#SBATCH --container-image=registry.site\\#acme/bert:3\necho\n")
    assert isinstance(own, BurstRequest) and own.create.image == "registry.site/acme/bert:3"
    assert own.create.command[:2] == ["bash", "-c"] and own.create.env["SLURM_JOB_ID"] == "41"
    default = _judged(tmp_path, "#!/bin/bash\necho\n")
    assert isinstance(default, BurstRequest) and default.create.image == "registry.site/runner:1"  # the partition's
    other = _judged(tmp_path, "#!/bin/bash\n#SBATCH --container-image=docker.io/evil/miner:latest\necho\n")
    assert isinstance(other, Refusal) and other.reason == "image_not_allowed" and "evil/miner" in other.message


def test_a_comment_cannot_name_a_command_and_cloud_paths_must_be_absolute() -> None:
    from tests.test_slurm_policy import judge

    refused = judge({"command": ["rm", "-rf", "/"]})
    assert (
        isinstance(refused, Refusal) and refused.reason == "comment_field_not_allowed" and "command" in refused.message
    )
    with pytest.raises(ValidationError, match="slurm_cloud_paths key 'home'"):
        Settings(slurm_cloud_paths={"home": "/home"})
    with pytest.raises(ValidationError, match=re.escape("slurm_cloud_paths value '/mnt/../etc'")):
        Settings(slurm_cloud_paths={"/home": "/mnt/../etc"})
    with pytest.raises(ValidationError, match=re.escape("must contain '{user}'")):
        Settings(slurm_output_writer=["tee", "--"])


@pytest.mark.parametrize("shape", ["NumNodes=2-2", "NumNodes=4", "NumNodes=1 HetJobId=40"])
def test_multi_node_and_heterogeneous_jobs_stay_on_prem(tmp_path: Path, shape: str) -> None:
    details = _details(tmp_path, "#!/bin/bash\n")
    record = {**details.record, **dict(p.split("=", 1) for p in shape.split())}
    with pytest.raises(ScriptRefused, match="stay on-prem"):
        cloud_job(replace(details, record=record), gpus=1, paths={"/": "/"})
    assert cloud_job(details, gpus=1, paths={"/": "/"}).env["SLURM_NNODES"] == "1"  # NumNodes=1: it runs
