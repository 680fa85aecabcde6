"""A burst runs the user's own Slurm job, on the real cluster with the broker as the non-root operator `ovsbroker`:
the held job's batch script, `#SBATCH` lines, submission environment (slurmdbd `job_env`) and working directory
become the cloud job; a job whose directory the site has not mapped to the cloud is refused with the reason and
never held; after the cloud run, the log the agent shipped to the store is written to the user's `--output` file as
that user (sudo limited to tee), before the held job ends so that its `afterok` dependent, which reads it, runs; a
path the user may not write (a symlink into root's files, `..`) leaves the log in the store with a pointer.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from agent.protocol import LOGS_DIR, SPEC_NAME, Outcome, Report, ReportKind, log_chunk_name, mailbox_entry_name
from broker.agent_side.attempt_spec import build_spec
from broker.agent_side.checkpoint_layout import attempt_prefix, job_checkpoint_prefix, mailbox_prefix
from broker.api.auth import callback_token
from broker.loop.slurm_output import write_back
from broker.loop.tick import tick
from broker.runtime import Runtime
from broker.services.jobs import spec_of
from broker.store.tables import AuditEntry, Job, JobEvent, Placement
from providers.storage.small import put_object
from tests.agent_harness import agent_env, start_agent
from tests.builders import agent_store
from tests.conftest import MovableClock
from tests.scripted import ScriptedCloud
from tests.test_e2e_slurm_burst import _runtime, site_paths
from tests.test_provider_slurm import fill_gpus, job, wait_until

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.agent_fixtures"]

WRITER = ["runuser", "-u", "ovsbroker", "--", "sudo", "-n", "-u", "{user}", "--", "/usr/bin/tee", "--"]
SCRIPT = """#!/bin/bash
#SBATCH --job-name=user-train
#SBATCH --gres=gpu:a100:1
#SBATCH --time=60
#SBATCH --output={out}
#SBATCH --comment='overspill-burst {{"max_total_usd": "40", "image": "ghcr.io/example/train:1", "work_gpu_hours": "2"}}'
echo "job $SLURM_JOB_ID says: $GREETING"
"""


@pytest.fixture
def slurm(cluster: Any) -> Iterator[Any]:
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


def _home(slurm: Any, name: str, user: str = "alice") -> Path:
    """A directory of `user` under the cluster's shared dir (which the site maps into the cloud)."""
    d = slurm.root / "shared" / name
    d.mkdir(parents=True, exist_ok=True)
    pw = pwd.getpwnam(user)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def _submit(slurm: Any, workdir: Path, script: str, greeting: str, *extra: str) -> int:
    path = workdir / "job.sh"
    path.write_text(script)
    os.chmod(path, 0o644)
    cmd = f"cd {workdir} && GREETING={shlex.quote(greeting)} sbatch --parsable -A acme {' '.join(extra)} job.sh"
    done = slurm.run_as("alice", ["bash", "-c", cmd], check=True)
    return int(done.stdout.strip().split(";")[0])


def _env_in_accounting(slurm: Any, slurm_id: int) -> None:
    def known() -> bool:
        done = slurm.run(["sacct", "-j", str(slurm_id), "--env-vars"])
        return "GREETING=" in done.stdout

    wait_until(known, "slurmdbd to hold the job's environment", timeout=30)


def _broker_job(rt: Runtime, slurm_id: int) -> Job | None:
    with Session(rt.engine) as s:
        return s.exec(select(Job).where(Job.origin == f"onprem-slurm:{slurm_id}")).first()


def _events(rt: Runtime, job_id: str) -> dict[str, JobEvent]:
    with Session(rt.engine) as s:
        return {e.kind: e for e in s.exec(select(JobEvent).where(JobEvent.job_id == job_id)).all()}


def _ship_log(rt: Runtime, job: Job, text: str) -> None:
    """What the agent does on the cloud instance: its log, as offset-named chunks under the attempt's prefix, and
    its signed final report (succeeded) in the tenant's mailbox: the verdict of an agent attempt is the agent's."""
    with Session(rt.engine) as s:
        placement = s.exec(  # the latest attempt
            select(Placement).where(Placement.job_id == job.id).order_by(col(Placement.created_at).desc())
        ).first()
        assert placement is not None
        store_prefix = next(iter(rt.settings.checkpoint_stores.values()))
        placement.attempt_uri = attempt_prefix(store_prefix, job.tenant, job.id, placement.id)
        s.add(placement)
        s.commit()
        attempt = placement.attempt_uri
    store = rt.checkpoint_stores.store(attempt + LOGS_DIR)
    data = text.encode()
    put_object(store, log_chunk_name(0), data[:10])
    put_object(store, log_chunk_name(10), data[10:])
    final = Report(
        placement.id, 1, ReportKind.FINAL, datetime.now(UTC).isoformat(), outcome=Outcome.SUCCEEDED, exit_code=0
    ).signed(callback_token(rt.settings, placement.id))
    mailbox = mailbox_prefix(store_prefix, job.tenant)
    put_object(rt.checkpoint_stores.store(mailbox), mailbox_entry_name(final), final.to_json())


def test_the_burst_runs_the_users_script_and_its_output_lands_for_the_afterok_dependent(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    stores = agent_store(tmp_path, ("scripted/r1",))
    rt = _runtime(
        slurm, tmp_path, cloud, slurm_require_environment=True, slurm_output_writer=WRITER, checkpoint_stores=stores,
        transport=slurm_transport,
    )  # fmt: skip
    fillers = fill_gpus(slurm, minutes=60)
    work = _home(slurm, "alice-proj")
    out = work / "result-%j.txt"
    greeting = 'it\'s "quoted" $(not run)'
    slurm_id = _submit(slurm, work, SCRIPT.format(out=out), greeting)
    dependent = slurm.run_as(
        "alice",
        ["sbatch", "--parsable", "-A", "acme", f"--dependency=afterok:{slurm_id}", f"--output={work}/dep.txt",
         f"--wrap=cat {work}/result-{slurm_id}.txt"],
        check=True,
    ).stdout.strip()  # fmt: skip
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    _env_in_accounting(slurm, slurm_id)

    tick(rt, clock())
    burst = _broker_job(rt, slurm_id)
    assert burst is not None, "not burst"
    spec = burst.spec
    assert spec["command"][:2] == ["bash", "-c"] and spec["command"][-1] == f"/mnt/site/shared/{work.name}"
    env = spec["env"]
    assert env["GREETING"] == greeting and env["SLURM_JOB_ID"] == str(slurm_id)
    assert env["SLURM_JOB_NAME"] == "user-train" and env["SLURM_SUBMIT_DIR"] == f"/mnt/site/shared/{work.name}"
    assert "PATH" not in env and "SLURM_CONF" not in env  # the submit host's, not the job's
    assert spec["slurm"]["output"] == str(out).replace("%j", str(slurm_id))
    # the cloud stand-in runs what the broker job says, with the site's shared dir where the mapping says
    cloud_root = tmp_path / "cloud"
    cloud_root.mkdir()
    (cloud_root / "shared").symlink_to(slurm.root / "shared")
    command = [spec["command"][0], spec["command"][1], spec["command"][2], "x", str(cloud_root / "shared" / work.name)]
    ran = subprocess.run(command, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, check=False)
    assert ran.returncode == 0 and ran.stdout == f"job {slurm_id} says: {greeting}\n", ran.stderr

    tick(rt, clock())  # placed in the cloud
    _ship_log(rt, _broker_job(rt, slurm_id), ran.stdout)  # type: ignore[arg-type]
    clock.advance(hours=3)
    tick(rt, clock())
    tick(rt, clock())
    done = _broker_job(rt, slurm_id)
    assert done is not None and done.state == "succeeded" and done.origin_settled
    result = work / f"result-{slurm_id}.txt"
    assert result.read_text() == ran.stdout
    assert result.stat().st_uid == pwd.getpwnam("alice").pw_uid  # written as the user, not root or the broker
    assert "onprem_output_written" in _events(rt, done.id)
    slurm.run(["scancel", *map(str, fillers)])
    wait_until(lambda: job(provider, int(dependent)).state == "COMPLETED", "the afterok dependent to run", timeout=30)
    assert (work / "dep.txt").read_text() == ran.stdout  # it read the burst's output


def test_a_job_in_an_unmapped_directory_is_refused_with_the_reason_and_never_held(slurm: Any, tmp_path: Path) -> None:
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    paths = {k: v for k, v in site_paths(slurm).items() if k != str(slurm.root)}  # the shared dir is not mapped
    rt = _runtime(slurm, tmp_path, cloud, slurm_cloud_paths=paths)
    fill_gpus(slurm, minutes=60)
    work = _home(slurm, "alice-unmapped")
    slurm_id = _submit(slurm, work, SCRIPT.format(out=work / "o.txt"), "hi")
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    tick(rt, clock())
    assert _broker_job(rt, slurm_id) is None
    assert job(provider, slurm_id).state_reason in ("Resources", "Priority")  # still queued on-prem, not held
    with Session(rt.engine) as s:
        (audit,) = s.exec(select(AuditEntry).where(AuditEntry.method == "REFUSE")).all()
    assert audit.route.startswith("job_not_runnable_in_cloud: the job's working directory")
    assert str(work) in audit.route and audit.client == "slurm user=alice account=acme"
    calls: list[list[str]] = []
    inner = provider.run
    provider.run = lambda argv: calls.append(argv) or inner(argv)  # type: ignore[attr-defined]
    tick(rt, clock.advance(seconds=20))  # refused a moment ago: the job is not read again every tick
    assert not any(argv[:3] == ["scontrol", "write", "batch_script"] for argv in calls)
    tick(rt, clock.advance(minutes=1))
    assert any(argv[:3] == ["scontrol", "write", "batch_script"] for argv in calls)
    assert _broker_job(rt, slurm_id) is None


def test_a_job_environment_not_yet_in_accounting_is_refused_when_the_site_requires_it(
    slurm: Any, tmp_path: Path
) -> None:
    """slurmdbd receives a pending job's record a few seconds after its submission (slurmctld sends pending jobs'
    records in a background pass), held or not: read at once, a job's environment is not in accounting yet. On a
    loaded machine the record can arrive between the two reads; then the job is read with its environment, and
    the test tries again with a new job."""
    from providers.slurm.script import ScriptRefused, read_job

    work = _home(slurm, "alice-noenv")
    refused = details = None
    for _ in range(5):
        slurm_id = _submit(slurm, work, SCRIPT.format(out=work / "o.txt"), "hi", "--hold")
        try:
            early = read_job(slurm.broker_runner(), str(slurm_id))
        except ScriptRefused as exc:
            refused = str(exc)
            details = read_job(slurm.broker_runner(), str(slurm_id), require_env=False)
        else:  # the record was there before the first read: it is the real one
            assert early.env_known and early.env["GREETING"] == "hi"
            details = None
        slurm.run(["scancel", str(slurm_id)], check=True)
        if details is None:
            continue
        assert details.get("WorkDir") == str(work) and ("--job-name", "user-train") in details.options
        if not details.env_known:
            break
        assert details.env["GREETING"] == "hi"  # the record arrived between the reads: it is the real one
    assert refused is not None and "AccountingStoreFlags=job_env" in refused
    assert details is not None and details.env == {} and not details.env_known


@pytest.mark.parametrize(
    ("make", "why"),
    [
        ("symlink", "Permission denied"),
        ("dotdot", "not an absolute, normal path"),
        ("foreign", "Permission denied"),
    ],
)
def test_output_to_a_path_the_user_cannot_write_stays_in_the_store(
    slurm: Any, tmp_path: Path, make: str, why: str
) -> None:
    """Symlinks and `..` cannot make the broker write where the user could not: the log stays in the store."""
    clock = MovableClock(datetime.now(UTC))
    stores = agent_store(tmp_path, ("scripted/r1",))
    rt = _runtime(slurm, tmp_path, ScriptedCloud("scripted", clock), slurm_output_writer=WRITER,
                  checkpoint_stores=stores)  # fmt: skip
    work = _home(slurm, f"alice-{make}")
    protected = slurm.root / "shared" / f"root-only-{make}"
    protected.write_text("root's\n")
    os.chmod(protected, 0o644)
    target = {
        "symlink": work / "out.txt",
        "dotdot": Path(f"{work}/../root-only-{make}"),
        "foreign": _home(slurm, f"bob-{make}", user="bob") / "out.txt",
    }[make]
    if make == "symlink":
        target.symlink_to(protected)
    now = clock()
    burst = Job(
        id=f"job_out_{make}", tenant="demo", team="nlp", project="atlas", name="x", state="succeeded",
        spec={"image": "r/i:1", "env": {"SLURM_JOB_ID": "77"},
              "slurm": {"user": "alice", "target": "77", "output": str(target), "error": str(target)}},
        max_total_usd=Decimal(1), created_at=now, updated_at=now,
    )  # fmt: skip
    placement = Placement(
        id=f"pl_out_{make}", job_id=burst.id, tenant="demo", offering_key="k", provider="scripted", region="r1",
        zone="z1", instance_type="t", capacity_type="spot", accelerator="A100", accelerator_count=1,
        launch_token=f"tok-{make}", state="succeeded", created_at=now,
    )  # fmt: skip
    with Session(rt.engine, expire_on_commit=False) as s:
        s.add(burst)
        s.add(placement)
        s.commit()
    _ship_log(rt, burst, "secret-free log line\n")
    assert write_back(rt, burst, now) is False
    assert protected.read_text() == "root's\n"  # untouched
    event = _events(rt, burst.id)["onprem_output_in_store"]
    assert why in event.message and event.data["uri"].endswith(f"/attempts/{placement.id}/logs/")
    assert not (make == "foreign" and target.exists())


E2E_SCRIPT = """#!/bin/bash
#SBATCH --job-name=e2e-train
#SBATCH --gres=gpu:a100:1
#SBATCH --time=60
#SBATCH --output={out}
#SBATCH --comment='overspill-burst {{"max_total_usd": "40", "image": "ghcr.io/example/train:1", "work_gpu_hours": "2"}}'
echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) in $(pwd) on GPUs $CUDA_VISIBLE_DEVICES says: $GREETING"
echo "a line on stderr" >&2
echo done > ran-in-the-cloud
"""


def test_e2e_a_users_sbatch_script_bursts_runs_under_the_real_agent_and_its_output_lands(
    slurm: Any, tmp_path: Path, agent_wheel: Path, slurm_transport: str
) -> None:
    """The whole way, with the real agent (process runtime) as the cloud instance's workload runner: the attempt
    spec the broker builds for the burst job (`broker.agent_side.attempt_spec.build_spec`, as the launch step does) is
    what the
    agent runs. The cloud stand-in mounts the site's shared filesystem at the same path (an identity mapping)."""
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    stores = agent_store(tmp_path, ("scripted/r1",))
    rt = _runtime(
        slurm, tmp_path, cloud, slurm_require_environment=True, slurm_output_writer=WRITER, checkpoint_stores=stores,
        slurm_cloud_paths={str(slurm.root): str(slurm.root), str(Path.cwd()): str(Path.cwd())},
        agent_runtime={"scripted": "process"}, transport=slurm_transport,
    )  # fmt: skip
    fillers = fill_gpus(slurm, minutes=60)
    work = _home(slurm, "alice-e2e")
    greeting = "hello from alice's login shell"
    slurm_id = _submit(slurm, work, E2E_SCRIPT.format(out=work / "slurm-%j.out"), greeting)
    dependent = slurm.run_as(
        "alice",
        ["sbatch", "--parsable", "-A", "acme", f"--dependency=afterok:{slurm_id}", f"--output={work}/dep.txt",
         f"--wrap=grep -c says {work}/slurm-{slurm_id}.out"],
        check=True,
    ).stdout.strip()  # fmt: skip
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, slurm_id).state_reason in ("Resources", "Priority"), "the job to pend")
    _env_in_accounting(slurm, slurm_id)

    tick(rt, clock())  # held on-prem, burst
    tick(rt, clock())  # placed in the cloud stand-in
    burst = _broker_job(rt, slurm_id)
    assert burst is not None and burst.state == "running"
    with Session(rt.engine) as s:
        placement = s.exec(select(Placement).where(Placement.job_id == burst.id)).one()
    store_prefix = stores["scripted/r1"]
    attempt = attempt_prefix(store_prefix, burst.tenant, burst.id, placement.id)
    spec = build_spec(
        rt.settings, spec_of(burst), job_id=burst.id, placement_id=placement.id, provider_name="scripted",
        provider=cloud, checkpoint_uri=job_checkpoint_prefix(store_prefix, burst.tenant, burst.id), resume=False,
        attempt_prefix=attempt, mailbox_uri=mailbox_prefix(store_prefix, burst.tenant),
    )  # fmt: skip
    put_object(rt.checkpoint_stores.store(attempt), SPEC_NAME, spec.to_json())
    with Session(rt.engine) as s:
        row = s.get(Placement, placement.id)
        assert row is not None
        row.attempt_uri = attempt
        s.add(row)
        s.commit()
    tools = tmp_path / "instance-bin"  # the instance's GPU driver, as tests/instance_boot.py gives it
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100 (UUID: GPU-00000000-test)'\n")
    (tools / "nvidia-smi").chmod(0o755)
    env = agent_env(agent_wheel)
    env["PATH"] = f"{tools}:{env['PATH']}"
    run = start_agent(attempt + SPEC_NAME, spec, tmp_path / "instance", env)
    assert run.wait() == 0, run.stderr()
    final = next(r for r in _mailbox_reports(rt, spec) if r.kind is ReportKind.FINAL)
    assert final.outcome is Outcome.SUCCEEDED and final.exit_code == 0, run.stderr()
    assert (work / "ran-in-the-cloud").read_text() == "done\n"  # in its own working directory

    clock.advance(hours=3)  # the cloud run ends (the stand-in's verdict): the burst settles
    tick(rt, clock())
    tick(rt, clock())
    done = _broker_job(rt, slurm_id)
    assert done is not None and done.state == "succeeded" and done.origin_settled
    out = (work / f"slurm-{slurm_id}.out").read_text()
    assert f"job {slurm_id} (e2e-train) in {work} on GPUs 0 says: {greeting}\n" in out, out
    assert "a line on stderr" in out  # one merged stream, as Slurm's default --output
    slurm.run(["scancel", *map(str, fillers)])
    wait_until(lambda: job(provider, int(dependent)).state == "COMPLETED", "the afterok dependent to run", timeout=30)
    assert (work / "dep.txt").read_text().strip() == "1"


def _mailbox_reports(rt: Runtime, spec: Any) -> list[Report]:
    store = rt.checkpoint_stores.store(spec.mailbox_uri)
    out = []
    for info in store.list(""):
        if info.key.startswith(spec.placement_id + "-"):
            data = b"".join(store.open_read(info.key))
            out.append(Report.from_json(data))
    return out


def test_an_array_task_bursts_with_its_own_job_id_task_id_and_output_path(
    slurm: Any, tmp_path: Path, slurm_transport: str
) -> None:
    """A pending task has no job id of its own until the hold splits it out of its array record: the burst's
    SLURM_JOB_ID and its `%j` output path are the task's, read after the hold."""
    clock = MovableClock(datetime.now(UTC))
    cloud = ScriptedCloud("scripted", clock)
    cloud.prices = {"z1": Decimal("3"), "z2": Decimal("3.5")}
    rt = _runtime(slurm, tmp_path, cloud, slurm_require_environment=True, transport=slurm_transport)
    fill_gpus(slurm, minutes=60)
    work = _home(slurm, "alice-array")
    script = SCRIPT.format(out=work / "o-%A_%a-%j.txt")
    array_id = _submit(slurm, work, script, "hi", "--array=0-1")
    provider = rt.providers["onprem-slurm"]
    wait_until(lambda: job(provider, array_id).state_reason in ("Resources", "Priority"), "the array to pend")
    _env_in_accounting(slurm, array_id)
    tick(rt, clock())
    for task in (0, 1):
        burst = _broker_job(rt, f"{array_id}_{task}")  # type: ignore[arg-type]
        assert burst is not None, f"task {task} not burst"
        own = next(j.job_id for j in provider.squeue() if j.array_job_id == array_id and j.array_task_id == task)
        env = burst.spec["env"]
        assert (env["SLURM_JOB_ID"], env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == (
            str(own), str(array_id), str(task))  # fmt: skip
        assert burst.spec["slurm"]["output"] == f"{work}/o-{array_id}_{task}-{own}.txt"
        assert env["GREETING"] == "hi"
