"""Finished Slurm jobs from accounting (`providers.slurm.accounting`) and the provider's use of it.

The 22.05 capture (tests/fixtures/slurm/sacct_22.05_v0.0.38.json) is `sacct --json -a -j 1,..,6` from the test
cluster (tests/slurm_cluster.py) after jobs that exited 0, exited 3, killed themselves with SIGKILL, were
cancelled, and a 2-task array; steps and a few bulky fields were cut. The v0.0.40+ records follow SchedMD's
data_parser shapes (flag lists, `{set, infinite, number}` numbers). The real-cluster test with MinJobAge=2 is in
tests/test_slurm_outcomes.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from federation.pressure import QueueModel
from providers.base import InstanceState, NotFound
from providers.model import Outcome
from providers.slurm.accounting import (
    PARSABLE_FIELDS,
    classify,
    describe_ending,
    parse_sacct,
    parse_sacct_parsable,
)
from providers.slurm.json_api import SlurmParseError
from providers.slurm.provider import PartitionInfo, SlurmProvider
from tests.provider_contract import ContractEnv

CAPTURE = Path(__file__).parent / "fixtures" / "slurm" / "sacct_22.05_v0.0.38.json"
BROKER = "b1"
PREFIX = f"overspill:{BROKER}:"


def num(n: int | None) -> dict[str, object]:
    return {"set": n is not None, "infinite": False, "number": n or 0}


def v40(job_id: int, state: str, *, code: int | None = 0, signal: int | None = None, **extra: object) -> dict:
    """A data_parser v0.0.40+ accounting record (23.11 to 25.x)."""
    exit_code: dict[str, object] = {"status": ["SIGNALED" if signal else "EXITED"], "return_code": num(code)}
    if signal:
        exit_code["signal"] = {"id": num(signal), "name": "KILL"}
    return {
        "job_id": job_id,
        "name": "ovs-tok",
        "state": {"current": [state], "reason": "None"},
        "exit_code": exit_code,
        "time": {"submission": 1_700_000_000, "start": 1_700_000_010, "end": 1_700_000_500, "limit": num(60)},
        "comment": {"job": f"{PREFIX}tok job=j placement=p"},
        "array": {"job_id": 0, "task_id": num(None)},
        "het": {"job_id": 0, "job_offset": num(None)},
        "partition": "gpu",
        "user": "tenant-acme",
        "account": "acme",
        "nodes": "ovs[1-2]",
        "tres": {"allocated": [{"type": "gres", "name": "gpu:a100", "count": 2}, {"type": "cpu", "count": 4}]},
        **extra,
    }


def test_the_2205_capture_is_classified() -> None:
    jobs = {j.job_id: j for j in parse_sacct(CAPTURE.read_text())}
    assert {i: classify(j) for i, j in jobs.items()} == {
        1: Outcome.SUCCEEDED,
        2: Outcome.USER_FAILED,  # exit 3
        3: Outcome.USER_FAILED,  # killed by its own SIGKILL
        4: Outcome.CANCELLED,
        5: Outcome.SUCCEEDED,
        6: Outcome.SUCCEEDED,
    }
    assert jobs[2].exit_code is None  # 22.05 writes SUCCESS/0 for exit 3: unknown, never read as 0
    assert describe_ending(jobs[2]) == "FAILED, exit code not reported"
    assert (jobs[3].exit_signal, describe_ending(jobs[3])) == (9, "FAILED, signal 9")
    assert (jobs[6].array_job_id, jobs[6].array_task_id, jobs[6].target) == (5, 0, "5_0")
    assert jobs[1].end_time == datetime.fromtimestamp(1795808445, UTC) and jobs[1].time_limit == 60
    assert (jobs[1].user, jobs[1].account, jobs[1].nodes, jobs[1].comment) == ("alice", "acme", ("ovs1",), "")


@pytest.mark.parametrize(
    ("state", "code", "signal", "outcome"),
    [
        ("COMPLETED", 0, None, Outcome.SUCCEEDED),
        ("FAILED", 3, None, Outcome.USER_FAILED),
        ("FAILED", None, 11, Outcome.USER_FAILED),
        ("FAILED", 125, None, Outcome.INFRA_FAILED),  # the container runtime's own failure, as the agent says
        ("TIMEOUT", 0, 15, Outcome.USER_FAILED),
        ("OUT_OF_MEMORY", 0, 9, Outcome.USER_FAILED),
        ("DEADLINE", 0, None, Outcome.USER_FAILED),
        ("NODE_FAIL", 0, None, Outcome.INFRA_FAILED),
        ("BOOT_FAIL", 0, None, Outcome.INFRA_FAILED),
        ("PREEMPTED", 0, 15, Outcome.PREEMPTED),
        ("CANCELLED", 0, 15, Outcome.CANCELLED),
        ("RUNNING", None, None, None),
        ("PENDING", None, None, None),
    ],
)
def test_v40_records_are_classified(state: str, code: int | None, signal: int | None, outcome: Outcome) -> None:
    (job,) = parse_sacct({"jobs": [v40(7, state, code=code, signal=signal)]})
    assert classify(job) is outcome
    assert (job.exit_code, job.exit_signal) == (code, signal)
    assert job.gpus == {"a100": 2} and job.nodes == ("ovs1", "ovs2") and job.time_limit == 60


def test_v40_array_and_heterogeneous_records() -> None:
    task = v40(9, "COMPLETED", array={"job_id": 8, "task_id": num(3)})
    het = v40(11, "FAILED", code=2, het={"job_id": 10, "job_offset": num(1)})
    a, h = parse_sacct({"jobs": [task, het]})
    assert (a.target, a.array_job_id, a.array_task_id) == ("8_3", 8, 3)
    assert (h.het_job_id, h.het_job_offset, h.target, classify(h)) == (10, 1, "11", Outcome.USER_FAILED)


def test_hostile_accounting_json_names_the_field() -> None:
    with pytest.raises(SlurmParseError) as exc:
        parse_sacct({"jobs": [{**v40(7, "FAILED"), "time": "soon"}]})
    assert exc.value.field == "jobs[0] (job 7).time"
    with pytest.raises(SlurmParseError):
        parse_sacct({"jobs": [{**v40(7, "FAILED"), "state": {"current": []}}]})
    with pytest.raises(SlurmParseError):
        parse_sacct("not json")


def parsable(**row: str) -> str:
    base = dict.fromkeys(PARSABLE_FIELDS, "")
    base.update({"State": "COMPLETED", "ExitCode": "0:0", "Timelimit": "01:00:00"}, **row)
    return "|".join(base[f] for f in PARSABLE_FIELDS)


def test_parsable_fallback() -> None:
    text = "\n".join(
        [
            parsable(JobIDRaw="4", JobID="4", State="CANCELLED by 0", Submit="1700000000", End="1700000100"),
            parsable(JobIDRaw="4.batch", JobID="4.batch", State="CANCELLED"),
            parsable(JobIDRaw="6", JobID="5_0", State="FAILED", ExitCode="3:0", Timelimit="1-02:00:00"),
            parsable(JobIDRaw="12", JobID="11+1", State="TIMEOUT", ExitCode="0:15", Timelimit="UNLIMITED"),
            parsable(JobIDRaw="13", JobID="13", Comment=f"{PREFIX}tok job=a|b", NodeList="ovs[1-2]"),
        ]
    )
    cancelled, task, het, ours = parse_sacct_parsable(text)
    assert (cancelled.job_id, classify(cancelled), cancelled.end_time) == (
        4,
        Outcome.CANCELLED,
        datetime.fromtimestamp(1700000100, UTC),
    )
    assert (task.target, task.exit_code, task.time_limit, classify(task)) == ("5_0", 3, 1560, Outcome.USER_FAILED)
    assert (het.het_job_id, het.het_job_offset, het.exit_signal, het.time_limit) == (11, 1, 15, None)
    assert classify(het) is Outcome.USER_FAILED
    assert ours.comment == f"{PREFIX}tok job=a|b" and ours.nodes == ("ovs1", "ovs2")
    with pytest.raises(SlurmParseError):
        parse_sacct_parsable(parsable(JobIDRaw="1", ExitCode="x"))
    with pytest.raises(SlurmParseError):
        parse_sacct_parsable(parsable(JobIDRaw="1", Submit="2026-11-27T19:40:44"))  # not epoch seconds


# ---- the provider -----------------------------------------------------------------------------------------------


def squeue_job(job_id: int, state: str, comment: str) -> dict[str, object]:
    return {
        "job_id": job_id,
        "name": "ovs-tok",
        "job_state": state,
        "state_reason": "None",
        "partition": "gpu",
        "user_name": "tenant-acme",
        "tres_per_node": "gres:gpu:a100:1",
        "node_count": 1,
        "submit_time": 1_700_000_000,
        "start_time": 1_700_000_100,
        "time_limit": 60,
        "comment": comment,
    }


def runner(
    queue: list[dict[str, object]], accounted: list[dict[str, object]], *, sacct_json: tuple[int, str] | None = None
) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": queue}), "")
        if argv[0] == "sacct":
            if sacct_json is not None:
                return subprocess.CompletedProcess(argv, sacct_json[0], "", sacct_json[1])
            wanted = set(argv[argv.index("-j") + 1].split(","))
            return subprocess.CompletedProcess(
                argv, 0, json.dumps({"jobs": [a for a in accounted if str(a["job_id"]) in wanted]}), ""
            )
        if argv[:3] == ["env", "SLURM_TIME_FORMAT=%s", "sacct"]:
            lines = [
                parsable(
                    JobIDRaw="22", JobID="22", JobName="ovs-tok", User="tenant-acme", State="FAILED", ExitCode="4:0"
                )
            ]
            return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    run.calls = calls  # type: ignore[attr-defined]
    return run


def provider(run: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> SlurmProvider:
    return SlurmProvider(
        broker_id=BROKER,
        partitions={"gpu": PartitionInfo("A100", Decimal("1"), 4)},
        queue_model=QueueModel,
        run=run,
        submit_as={"t": "tenant-acme"},
    )


def test_get_many_reads_squeue_once_and_accounting_once_for_what_left_it() -> None:
    mine = f"{PREFIX}tok job=j placement=p"
    queue = [squeue_job(20, "RUNNING", mine), squeue_job(21, "PENDING", mine), squeue_job(30, "RUNNING", "x")]
    accounted = [
        v40(22, "FAILED", code=3, comment={"job": mine}),
        v40(23, "TIMEOUT", signal=15, comment={"job": mine}),
        v40(24, "NODE_FAIL", comment={"job": mine}),
        v40(25, "COMPLETED", comment={"job": "overspill:other:tok"}),  # another broker's job: not ours
        v40(26, "COMPLETED", comment=None, user="tenant-acme"),  # comments not stored: name + identity say ours
        v40(27, "RUNNING", comment={"job": mine}),  # left squeue, accounting not caught up: ask again later
    ]
    run = runner(queue, accounted)
    p = provider(run)
    p.begin_tick(datetime.now(UTC))
    ids = [str(i) for i in range(20, 29)]
    got = p.get_many(ids)
    assert p.get_many(ids).keys() == got.keys()  # a second read in the same tick is served from the snapshot
    p.end_tick()
    commands = [c[0] for c in run.calls]  # type: ignore[attr-defined]
    assert commands == ["squeue", "sacct", "sacct"]  # one squeue per tick; sacct only for jobs that left it
    assert got["20"].state is InstanceState.RUNNING and got["21"].state is InstanceState.PENDING
    assert (got["22"].state, got["22"].outcome, got["22"].detail) == (
        InstanceState.FAILED,
        Outcome.USER_FAILED,
        "FAILED, exit 3",
    )
    assert (got["23"].state, got["23"].outcome) == (InstanceState.FAILED, Outcome.USER_FAILED)
    assert (got["24"].state, got["24"].outcome) == (InstanceState.FAILED, Outcome.INFRA_FAILED)
    assert got["26"].state is InstanceState.SUCCEEDED
    assert isinstance(got["27"], Exception) and "asking again" in str(got["27"])
    assert {"25", "28"}.isdisjoint(got) and "30" not in got


def test_accounting_falls_back_to_the_parsable_format_and_to_notfound_without_slurmdbd() -> None:
    run = runner([], [], sacct_json=(1, "sacct: error: unrecognized option '--json'"))
    got = provider(run).get_many(["22"])
    assert (got["22"].state, got["22"].outcome, got["22"].detail) == (  # type: ignore[union-attr]
        InstanceState.FAILED,
        Outcome.USER_FAILED,
        "FAILED, exit 4",
    )
    off = runner([], [], sacct_json=(1, "sacct: error: Slurm accounting storage is disabled"))
    with pytest.raises(NotFound):
        provider(off).get("22")
    down = runner([], [], sacct_json=(1, "sacct: error: Problem talking to the database: Connection refused"))
    answer = provider(down).get_many(["22"])["22"]
    assert isinstance(answer, Exception) and not isinstance(answer, NotFound)  # unknown now, not gone


def sinfo_doc() -> str:
    node = {
        "name": "ovs1",
        "state": "mixed",
        "state_flags": [],
        "partitions": ["gpu"],
        "gres": "gpu:a100:4",
        "gres_used": "gpu:a100:1(IDX:0)",
        "cpus": 8,
        "real_memory": 8000,
    }
    return json.dumps({"nodes": [node]})


def test_one_squeue_and_one_sinfo_per_tick_for_every_step() -> None:
    """Pressure, offerings, the burst step's queue and model, sync's get_many and the orphan sweep's listing all
    share the tick's reads; a launch's own fresh read becomes the snapshot; a new tick reads again."""
    mine = f"{PREFIX}tok job=j placement=p"
    queue = [squeue_job(20, "RUNNING", mine), {**squeue_job(21, "PENDING", ""), "state_reason": "Resources"}]
    calls: list[str] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        command = next(a for a in argv if a in ("squeue", "sinfo", "sbatch", "sacct"))
        calls.append(command)
        if command == "sinfo":
            return subprocess.CompletedProcess(argv, 0, sinfo_doc(), "")
        if command == "sbatch":
            comment = next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))
            queue.append({**squeue_job(22, "PENDING", comment), "state_reason": "Priority"})
            return subprocess.CompletedProcess(argv, 0, "22\n", "")
        return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": queue}), "")

    p = provider(run)
    now = datetime.now(UTC)
    p.begin_tick(now)
    p.pressure(now)
    offerings = p.offerings(now)
    p.queued_jobs()
    p.model().expected_wait_hours("A100", 2, now)
    p.get_many(["20"])
    p.list_instances()
    assert calls == ["squeue", "sinfo"]
    launched = p.launch(ContractEnv(provider=p, offering=offerings[0]).request(token="tok-new"))
    assert launched.id == "22" and calls[2:] == ["sbatch", "squeue"]  # the duplicate check reads afresh
    assert p.get_many(["20", "22"]).keys() == {"20", "22"} and len(calls) == 4  # ...and that read is the snapshot
    p.end_tick()
    p.begin_tick(now + timedelta(seconds=10))
    p.get_many(["20"])
    p.pressure(now)
    assert calls[4:] == ["squeue", "sinfo"]
    p.end_tick()
    p.get_many(["20"])
    p.get_many(["20"])
    assert calls[6:] == ["squeue", "squeue"]  # outside a tick every read is fresh


def test_accounting_asks_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("providers.slurm.provider.SACCT_BATCH", 2)
    mine = f"{PREFIX}tok job=j placement=p"
    run = runner([], [v40(i, "COMPLETED", comment={"job": mine}) for i in range(50, 55)])
    got = provider(run).get_many([str(i) for i in range(50, 55)])
    assert sorted(got) == ["50", "51", "52", "53", "54"]
    asked = [c[c.index("-j") + 1] for c in run.calls if c[0] == "sacct"]  # type: ignore[attr-defined]
    assert asked == ["50,51", "52,53", "54"]
