"""Finished Slurm jobs from accounting (`sacct`), and how each one ended. Pure: no subprocess, no clock, no I/O.

Role: slurmctld forgets a finished job `MinJobAge` seconds after it ends (300 by default); slurmdbd keeps it. The
provider asks `sacct` for the jobs it placed that left `squeue` (or ended in it), and this module turns the answer
into `providers.model.BatchJob`s and classifies each ending as the instance agent classifies its workload's exit
(`classify`, an `providers.model.Outcome`).

Shapes read (leniently, field by field):
- `sacct --json` of 22.05 (`openapi/dbv0.0.38`): `state: {"current": "FAILED", "reason": "None"}`,
  `exit_code: {"status": "SUCCESS"|"SIGNALED"|..., "return_code": 0, "signal": {"signal_id": 9, "name": ..}}`,
  `time: {"submission", "start", "end", "limit"}` (limit minutes), `comment: {"job": ..}` (null unless the site sets
  `AccountingStoreFlags=job_comment`), `array: {"job_id", "task_id"}`, `het: {"job_id", "job_offset"}`, `tres:
  {"allocated": [{"type": "gres", "name": "gpu:a100", "count": 2}, ..]}`. 22.05 writes a FAILED job's
  `exit_code` as SUCCESS/0 (its non-zero return code is lost; `sacct -P` has it): a FAILED record claiming exit 0
  is read as exit code unknown.
- data_parser v0.0.40+ (23.11 to 25.x): `state.current` a list of flags, numbers as `{"set", "infinite",
  "number"}`, `exit_code.return_code` such a number, `exit_code.signal.id` such a number, `exit_code.status` a list.
- The fallback `sacct -P -n -X -a -j IDS --format=<FIELDS>` (run with `SLURM_TIME_FORMAT=%s` so times are epoch
  seconds): one `|`-separated line per job in `PARSABLE_FIELDS` order, the comment last (it may contain `|`);
  `State` may read `CANCELLED by 1000`, `ExitCode` is `<return code>:<signal>`, `Timelimit` `[D-]HH:MM:SS`,
  `UNLIMITED` or `Partition_Limit`.

Classification (`classify(job)`; None while the job has not ended):
COMPLETED -> succeeded. FAILED (the batch script exited non-zero or was killed by a signal it got on its own),
OUT_OF_MEMORY, TIMEOUT, DEADLINE and SPECIAL_EXIT -> user_failed: final for the job, re-running it would fail the
same way. A FAILED job that exited 125 (a container runtime's own failure, as in the agent) -> infra_failed.
NODE_FAIL and BOOT_FAIL -> infra_failed (run it again elsewhere). PREEMPTED -> preempted (run it again).
CANCELLED and REVOKED -> cancelled (someone ended it; the broker decides).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.model import BatchJob, Outcome
from providers.slurm.json_api import (
    JOB_BASE_STATES,
    SlurmParseError,
    _int,
    _state,
    _string,
    _time,
    exit_status,
    expand_hostlist,
    load_document,
)

PARSABLE_FIELDS = (
    "JobIDRaw",
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "Timelimit",
    "Partition",
    "User",
    "Account",
    "QOS",
    "NodeList",
    "Comment",
)
CONTAINER_RUNTIME_FAILED = 125  # docker/podman's own failure, as the agent classifies it

_OUTCOMES: dict[str, Outcome] = {
    "COMPLETED": Outcome.SUCCEEDED,
    "FAILED": Outcome.USER_FAILED,
    "OUT_OF_MEMORY": Outcome.USER_FAILED,
    "TIMEOUT": Outcome.USER_FAILED,
    "DEADLINE": Outcome.USER_FAILED,
    "SPECIAL_EXIT": Outcome.USER_FAILED,
    "NODE_FAIL": Outcome.INFRA_FAILED,
    "BOOT_FAIL": Outcome.INFRA_FAILED,
    "PREEMPTED": Outcome.PREEMPTED,
    "CANCELLED": Outcome.CANCELLED,
    "REVOKED": Outcome.CANCELLED,
}


def classify(job: BatchJob) -> Outcome | None:
    """How the job ended (module docstring), or None when it has not ended."""
    outcome = _OUTCOMES.get(job.state)
    if outcome is Outcome.USER_FAILED and job.state == "FAILED" and job.exit_code == CONTAINER_RUNTIME_FAILED:
        return Outcome.INFRA_FAILED
    return outcome


def describe_ending(job: BatchJob) -> str:
    """A short human account of the ending: `TIMEOUT`, `FAILED, exit 3`, `FAILED, signal 9`."""
    text = job.state
    if job.exit_signal:
        text += f", signal {job.exit_signal}"
    elif job.exit_code:
        text += f", exit {job.exit_code}"
    elif job.state == "FAILED":
        text += ", exit code not reported"
    return text


# ---- sacct --json ---------------------------------------------------------------------------------------------


def parse_sacct(data: str | bytes | Mapping[str, Any]) -> list[BatchJob]:
    """Jobs of a `sacct --json` (or slurmrestd `GET /slurmdb/.../jobs`) document; steps are ignored."""
    doc = load_document(data, "sacct")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError("sacct: missing 'jobs' list", field="jobs")
    return [parse_accounted_job(job, where=f"jobs[{i}]") for i, job in enumerate(jobs)]


def parse_accounted_job(obj: object, *, where: str = "job") -> BatchJob:
    """One accounting job record of any supported shape (module docstring)."""
    if not isinstance(obj, Mapping):
        raise SlurmParseError(f"{where}: expected an object, got {type(obj).__name__}", field=where)
    job_id = _int(obj, "job_id", where)
    if job_id is None:
        raise SlurmParseError(f"{where}.job_id: missing", field=f"{where}.job_id")
    where = f"{where} (job {job_id})"
    state_obj = _mapping(obj, "state", where)
    state, flags = _state(state_obj, "current", f"{where}.state", JOB_BASE_STATES, required=True)
    reason = _string(state_obj, "reason", f"{where}.state")
    times = _mapping(obj, "time", where)
    array = _mapping(obj, "array", where)
    het = _mapping(obj, "het", where)
    comment = _mapping(obj, "comment", where)
    code, signal = exit_status(obj, where, state)
    array_job = _int(array, "job_id", f"{where}.array")
    het_job = _int(het, "job_id", f"{where}.het")
    return BatchJob(
        job_id=job_id,
        name=_string(obj, "name", where),
        state=state,
        state_reason="" if reason == "None" else reason,
        partition=_string(obj, "partition", where),
        user=_string(obj, "user", where),
        gpus=_tres_gpus(obj, where),
        node_count=_int(obj, "allocation_nodes", where) or 1,
        submit_time=_time(times, "submission", f"{where}.time"),
        start_time=_time(times, "start", f"{where}.time"),
        time_limit=_int(times, "limit", f"{where}.time"),
        comment=_string(comment, "job", f"{where}.comment"),
        state_flags=flags,
        end_time=_time(times, "end", f"{where}.time"),
        nodes=_nodes(obj, where),
        priority=_int(obj, "priority", where),
        restart_count=_int(obj, "restart_cnt", where) or 0,
        exit_code=code,
        exit_signal=signal,
        account=_string(obj, "account", where),
        qos=_string(obj, "qos", where),
        array_job_id=array_job or None,
        array_task_id=_int(array, "task_id", f"{where}.array") if array_job else None,
        het_job_id=het_job or None,
        het_job_offset=_int(het, "job_offset", f"{where}.het") if het_job else None,
    )


def _mapping(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SlurmParseError(f"{where}.{key}: expected an object, got {value!r}", field=f"{where}.{key}")
    return value


def _tres_gpus(obj: Mapping[str, Any], where: str) -> dict[str, int]:
    tres = _mapping(obj, "tres", where)
    for key in ("allocated", "requested"):
        entries = tres.get(key)
        if not isinstance(entries, list):
            continue
        found: dict[str, int] = {}
        for entry in entries:
            if not isinstance(entry, Mapping) or entry.get("type") != "gres":
                continue
            name = entry.get("name") or ""
            count = _int(entry, "count", f"{where}.tres.{key}") or 0
            if isinstance(name, str) and (name == "gpu" or name.startswith("gpu:")) and count > 0:
                gpu_type = name.partition(":")[2]
                found[gpu_type] = found.get(gpu_type, 0) + count
        if found:
            typed = {t: n for t, n in found.items() if t}
            return typed or found
    return {}


def _nodes(obj: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = obj.get("nodes")
    if isinstance(value, str):
        return expand_hostlist("" if value in ("None assigned", "(null)") else value, field=f"{where}.nodes")
    return ()


# ---- sacct -P -------------------------------------------------------------------------------------------------


def parsable_argv(ids: list[str]) -> list[str]:
    """The fallback command: `env SLURM_TIME_FORMAT=%s sacct -P -n -X -a -j IDS --format=...`."""
    return [
        "env",
        "SLURM_TIME_FORMAT=%s",
        "sacct",
        "-P",
        "-n",
        "-X",
        "-a",
        "-j",
        ",".join(ids),
        f"--format={','.join(PARSABLE_FIELDS)}",
    ]


def parse_sacct_parsable(text: str) -> list[BatchJob]:
    """Jobs of `sacct -P -n --format=<PARSABLE_FIELDS>` output (module docstring); steps (`123.batch`) skipped."""
    out: list[BatchJob] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", len(PARSABLE_FIELDS) - 1)
        if len(parts) != len(PARSABLE_FIELDS):
            raise SlurmParseError(f"sacct line {n}: {len(parts)} fields, expected {len(PARSABLE_FIELDS)}", field="")
        row = dict(zip(PARSABLE_FIELDS, parts, strict=True))
        where = f"sacct line {n}"
        raw = row["JobIDRaw"].strip()
        if not raw.isdigit():
            continue  # a step
        shown = row["JobID"].strip()
        array_job = array_task = het_job = het_offset = None
        if "_" in shown and "[" not in shown:
            head, _, tail = shown.partition("_")
            if head.isdigit() and tail.isdigit():
                array_job, array_task = int(head), int(tail)
        elif "+" in shown:
            head, _, tail = shown.partition("+")
            if head.isdigit() and tail.isdigit():
                het_job, het_offset = int(head), int(tail)
        state = row["State"].strip().split(" ", 1)[0].upper()
        if not state:
            raise SlurmParseError(f"{where}: empty State", field=f"{where}.State")
        code, signal = _parsable_exit(row["ExitCode"], where)
        out.append(
            BatchJob(
                job_id=int(raw),
                name=row["JobName"],
                state=state,
                state_reason="",
                partition=row["Partition"],
                user=row["User"],
                gpus={},
                node_count=1,
                submit_time=_epoch(row["Submit"], f"{where}.Submit"),
                start_time=_epoch(row["Start"], f"{where}.Start"),
                time_limit=_limit(row["Timelimit"], f"{where}.Timelimit"),
                comment=row["Comment"],
                end_time=_epoch(row["End"], f"{where}.End"),
                nodes=_nodes({"nodes": row["NodeList"]}, where),
                exit_code=code,
                exit_signal=signal,
                account=row["Account"],
                qos=row["QOS"],
                array_job_id=array_job,
                array_task_id=array_task,
                het_job_id=het_job,
                het_job_offset=het_offset,
            )
        )
    return out


def _parsable_exit(text: str, where: str) -> tuple[int | None, int | None]:
    code, _, signal = text.strip().partition(":")
    if not code.isdigit() or (signal and not signal.isdigit()):
        raise SlurmParseError(f"{where}.ExitCode: cannot read {text!r}", field=f"{where}.ExitCode")
    return int(code), int(signal) if signal and int(signal) else None


def _epoch(text: str, field: str) -> Any:
    value = text.strip()
    if value in ("", "Unknown", "None", "0"):
        return None
    if not value.isdigit():
        raise SlurmParseError(f"{field}: not epoch seconds (SLURM_TIME_FORMAT=%s): {text!r}", field=field)
    return _time({"t": int(value)}, "t", field)


def _limit(text: str, field: str) -> int | None:
    """Minutes of a `[D-]HH:MM:SS` / `MM:SS` limit; None for UNLIMITED, Partition_Limit or empty."""
    value = text.strip()
    if not value or not value[0].isdigit():
        return None
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if not (days == "" or days.isdigit()) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        raise SlurmParseError(f"{field}: cannot read {text!r}", field=field)
    nums = [int(p) for p in parts]
    h, m, s = ([0] * (3 - len(nums)) + nums) if len(nums) > 1 else (0, nums[0], 0)
    total = int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)
    return total
