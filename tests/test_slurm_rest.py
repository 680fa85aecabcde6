"""The slurmrestd transport on the real cluster (slurmrestd v0.0.38 as the operator `ovsbroker`, JWT auth): reads,
holds, comment/dependency updates, cancels and accounting go over HTTP, and only what v0.0.38 cannot do (release,
requeue, submit, PriorityType) runs a Slurm tool; the token file is re-read when it changes and when slurmctld
refuses the token; failures name the endpoint. Plus the settings wiring (no cluster needed).
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.config.providers import build_providers
from broker.config.settings import Settings
from federation.pressure import QueueModel
from providers.base import AuthError, NotFound
from providers.model import BatchJob
from providers.slurm.provider import SlurmProvider, SlurmUnavailable
from providers.slurm.rest import RestTransport
from providers.slurm.transport import CliTransport, SlurmCommandError
from tests.slurm_cluster import BROKER_USER, SlurmCluster, _free_port, _port_open, _spawn, find_daemon
from tests.test_provider_slurm import BROKER_ID, PARTITIONS, fill_gpus, sbatch, wait_until


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    cluster.cancel_all()
    yield cluster
    cluster.cancel_all()


class Recording:
    """The operator's runner, remembering every Slurm tool it ran."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.inner = cluster.broker_runner()
        self.tools: list[str] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.tools.append(" ".join(argv[:2]))
        return self.inner(argv)


def _rest(cluster: SlurmCluster, token_file: Path) -> tuple[RestTransport, Recording]:
    tools = Recording(cluster)
    return RestTransport(cluster.restd(), BROKER_USER, fallback=CliTransport(tools), token_file=str(token_file)), tools


@pytest.mark.integration
def test_the_contract_goes_over_http_and_only_what_v0038_lacks_runs_a_tool(
    slurm: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="providers.slurm.rest")
    rest, tools = _rest(slurm, slurm.jwt_file())
    provider = SlurmProvider(
        broker_id=BROKER_ID, partitions=PARTITIONS, queue_model=QueueModel, transport=rest, hold_key=b"k"
    )
    fill = fill_gpus(slurm)
    user_job = sbatch(slurm, "--gres=gpu:a100:1", "--time=5", "--wrap=true")
    dependent = sbatch(slurm, "--gres=gpu:a100:1", f"--dependency=afterok:{user_job}", "--wrap=true")
    wait_until(lambda: next(j for j in provider.squeue() if j.job_id == user_job).state_reason != "None", "a reason")
    provider.offerings(datetime.now(UTC))
    provider.pressure(datetime.now(UTC))
    assert user_job in [q.job.job_id for q in provider.queued_jobs()]
    held = provider.hold(user_job, "bursting")
    assert held.held and held.job is not None and held.job.state_reason == "JobHeldAdmin"
    assert tools.tools == []  # reads, the mark (a Comment update) and the hold all went to slurmrestd
    assert provider.complete_held(user_job) == [str(dependent)]  # dependency rewritten, the job cancelled: HTTP
    assert tools.tools == []
    wait_until(lambda: next(j for j in provider.squeue() if j.job_id == user_job).state == "CANCELLED", "cancel")
    dep = next(j for j in provider.squeue() if j.job_id == dependent)
    assert str(user_job) not in dep.dependency  # rewritten as if it had completed
    provider.requeue(str(fill[0]))  # v0.0.38 has no requeue endpoint: the one tool
    assert tools.tools == ["scontrol requeue"]
    provider.requeue(str(fill[1]))
    said = [r.getMessage() for r in caplog.records if "goes through the Slurm tools" in r.getMessage()]
    assert said == ["slurmrestd transport: requeue goes through the Slurm tools (v0.0.38 has no requeue endpoint)"]


@pytest.mark.integration
def test_accounting_over_http_and_nothing_found_is_no_records(slurm: SlurmCluster) -> None:
    rest, tools = _rest(slurm, slurm.jwt_file())
    done = sbatch(slurm, "--gres=gpu:a100:1", "--comment=acct-check", "--wrap=exit 3")

    def ours() -> list[BatchJob]:  # job ids repeat across test sessions: this one's record carries the comment
        return [r for r in rest.accounting([str(done)]) if r.job_id == done and r.comment == "acct-check"]

    # slurmdbd may file the end before the start: until the start arrives the record is a placeholder named
    # "allocation" with no partition, so wait for the whole record, not only the FAILED state
    wait_until(
        lambda: [(r.state, r.name, r.partition) for r in ours()] == [("FAILED", "wrap", "gpu")],
        "slurmdbd to record the failed job whole",
        timeout=30,
    )
    time.sleep(1)  # the job's end record too, not only its start
    assert rest.accounting([str(done)]) == CliTransport(slurm.broker_runner()).accounting([str(done)])  # sacct's
    assert rest.accounting(["987654"]) == []  # slurmdbd's "Nothing found": no records, no error
    assert tools.tools == []


@pytest.mark.integration
def test_array_task_updates_are_read_back_since_2205_answers_them_all_with_an_error(slurm: SlurmCluster) -> None:
    """22.05's slurmrestd answers every array-task update 200 with an error entry, done or not: the transport reads
    the task back, so an update that took passes and one that did not is an error naming the endpoint."""
    rest, tools = _rest(slurm, slurm.jwt_file())
    fill_gpus(slurm)
    array = sbatch(slurm, "--gres=gpu:a100:1", "--array=0-3", "--time=5", "--wrap=true")
    other = sbatch(slurm, "--gres=gpu:a100:1", "--time=5", "--wrap=true")
    rest.update_job(f"{array}_2", comment="ovs:mark", dependency=f"afterok:{other}")
    task = next(j for j in rest.jobs() if j.target == f"{array}_2")
    assert task.comment == "ovs:mark" and str(other) in task.dependency
    rest.update_job(f"{array}_2", dependency="")  # dropping a dependency reads back as none
    assert next(j for j in rest.jobs() if j.target == f"{array}_2").dependency == ""
    with pytest.raises(SlurmCommandError, match=rf"slurmrestd (POST|GET) /slurm/v0.0.38/job/{array}_9"):
        rest.update_job(f"{array}_9", comment="ovs:mark")  # no such task: 200 from the update, caught on read-back
    assert tools.tools == []


@pytest.mark.integration
def test_token_file_is_reread_when_it_changes_and_when_refused(slurm: SlurmCluster, tmp_path: Path) -> None:
    token_file = tmp_path / "broker.jwt"
    token_file.write_text("SLURM_JWT=not-a-token\n")
    rest, _ = _rest(slurm, token_file)
    with pytest.raises(AuthError, match=r"slurmrestd GET /slurm/v0.0.38/jobs failed \(500\).*invalid or expired JWT"):
        rest.jobs()
    time.sleep(0.01)
    token_file.write_text(f"SLURM_JWT={slurm.token()}\n")  # the site's cron wrote a fresh one
    assert isinstance(rest.jobs(), list)
    # a rotation the mtime does not show (same second, same size class): slurmctld refuses the cached token, the
    # transport reads the file again and retries once
    rest._token = (token_file.stat().st_mtime, "stale.token.value")
    assert isinstance(rest.jobs(), list)


@pytest.mark.integration
def test_failures_name_the_endpoint(slurm: SlurmCluster) -> None:
    rest, _ = _rest(slurm, slurm.jwt_file())
    with pytest.raises(NotFound, match=r"slurmrestd DELETE /slurm/v0.0.38/job/999999 failed \(500\).*Invalid job id"):
        rest.cancel("999999")
    with pytest.raises(NotFound, match=r"slurmrestd POST /slurm/v0.0.38/job/999999"):
        rest.hold("999999")
    down = RestTransport(
        "http://127.0.0.1:9", BROKER_USER, fallback=CliTransport(slurm.broker_runner()), token="x", timeout=2
    )
    with pytest.raises(SlurmUnavailable, match=r"slurmrestd GET /slurm/v0.0.38/nodes: cannot reach slurmrestd"):
        down.nodes()


@pytest.mark.integration
def test_an_unreachable_controller_is_unavailable_not_a_refused_token(slurm: SlurmCluster) -> None:
    """22.05's slurmrestd answers for an unreachable slurmctld with the same bare "Unspecified error" as for a bad
    token: the transport asks `scontrol ping` and says which. A second slurmrestd here reads a copy of the cluster's
    slurm.conf naming a controller port nobody listens on (the tools through the fallback read the same copy)."""
    conf = slurm.root / "etc" / f"unreachable-{uuid.uuid4().hex[:6]}.conf"
    conf.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={_free_port()}", slurm.conf.read_text()))
    conf.chmod(0o644)
    env = {**slurm.env, "SLURM_CONF": str(conf), "SLURM_JWT": "daemon"}
    port = _free_port()
    binary = find_daemon("slurmrestd")
    assert binary is not None
    argv = [binary, "-u", BROKER_USER, "-s", "openapi/v0.0.38", "-a", "rest_auth/jwt", f"127.0.0.1:{port}"]
    restd = _spawn(argv, env, slurm.root / "log" / f"{conf.stem}.out")
    try:
        wait_until(lambda: _port_open(port), "the second slurmrestd to listen")

        def tools(args: list[str]) -> subprocess.CompletedProcess[str]:
            run_as = ["runuser", "-u", BROKER_USER, "--", *args]
            return subprocess.run(run_as, env=env, capture_output=True, text=True, check=False, timeout=60)

        rest = RestTransport(f"http://127.0.0.1:{port}", BROKER_USER, fallback=CliTransport(tools), token=slurm.token())
        with pytest.raises(
            SlurmUnavailable, match=r"slurmrestd GET /slurm/v0.0.38/jobs failed \(500\): slurmctld is down"
        ):
            rest.jobs()
    finally:
        restd.terminate()
        restd.wait(timeout=10)


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'b.db'}",
        data_dir=tmp_path,
        simulated=False,
        slurm_partitions={"gpu": {"accelerator": "A100", "rate_usd_per_gpu_hour": "1.10", "gpus_per_node": "4"}},
        **extra,  # type: ignore[arg-type]
    )


def test_settings_choose_the_transport_and_name_what_is_missing(tmp_path: Path) -> None:
    (cli,) = build_providers(_settings(tmp_path))
    assert isinstance(cli, SlurmProvider) and isinstance(cli.transport, CliTransport)
    token = tmp_path / "jwt"
    token.write_text("SLURM_JWT=abc\n")
    rest_settings = {"slurm_transport": "rest", "slurmrestd_url": "http://ctl:6820", "slurmrestd_user": "ovsbroker"}
    (rest,) = build_providers(_settings(tmp_path, **rest_settings, slurm_jwt_file=str(token)))
    assert isinstance(rest, SlurmProvider) and isinstance(rest.transport, RestTransport)
    assert rest.transport.token() == "abc" and rest.transport.url == "http://ctl:6820"
    with pytest.raises(ValueError, match="OVERSPILL_SLURM_JWT_FILE"):
        build_providers(_settings(tmp_path, **rest_settings))
    with pytest.raises(ValueError, match="OVERSPILL_SLURMRESTD_URL"):
        build_providers(_settings(tmp_path, slurm_transport="rest", slurm_jwt="abc", slurmrestd_user="u"))
    with pytest.raises(ValueError, match="OVERSPILL_SLURMRESTD_URL"):
        build_providers(_settings(tmp_path, **{**rest_settings, "slurmrestd_url": "ctl:6820"}, slurm_jwt="abc"))
