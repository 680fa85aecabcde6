"""Read Slurm's per-line "fallback" listings: `squeue -h -o '<json template>'` / `sinfo -h -o ...` output, one JSON
object per line, as exporters print when a Slurm build has no `--json`. Pure: no subprocess, no I/O.

Role: a lenient second reader beside `providers.slurm.json_api`, yielding the same domain types
(`providers.model.BatchJob` / `BatchNode`) with what such a line carries. The line shapes are those of the real
captures in `fixtures/slurm-json/*_fallback.txt` (the Rivos prometheus-slurm-exporter templates):
- jobs: `{"a": account, "id": job id, "end_time": "2023-09-21T00:21:42" | "N/A" | "NONE", "state": "PENDING",
  "p": partition, "cpu": n, "mem": "128G", "array_id": "N/A" | array job id, "r": nodes, or "(Reason)" when
  pending}`; optional `"u"` user, `"b"` GRES request (`%b`, e.g. `gres:gpu:a100:2`), `"k"` comment.
- nodes: `{"s": "mixed", "mem": MiB, "n": name, "l": load, "p": partition, "fmem": free MiB, "cstate":
  "alloc/idle/other/total" CPUs, "w": weight}`; optional `"g"` GRES (`%G`); one line per node and partition,
  merged per node.
Times carry no zone; they are read as UTC. A line that is not a JSON object with the required keys (`id`/`state`,
`n`/`s`), or has a malformed value, is skipped and reported in `FallbackRead.skipped` (line number and why), never
fatal: one odd line must not hide the rest of the queue. Comment lines (`#`) and blank lines are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from providers.model import BatchJob, BatchNode
from providers.slurm.json_api import JOB_BASE_STATES, SlurmParseError, expand_hostlist, parse_gres, parse_tres_gpus

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FallbackRead(Generic[T]):
    """What a fallback listing held: the records read, and the lines skipped as (line number, reason)."""

    records: list[T]
    skipped: list[tuple[int, str]] = field(default_factory=list)


def _lines(text: str) -> list[tuple[int, Mapping[str, Any] | str]]:
    out: list[tuple[int, Mapping[str, Any] | str]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            out.append((n, f"not JSON: {exc.msg}"))
            continue
        out.append((n, obj if isinstance(obj, Mapping) else "not a JSON object"))
    return out


def parse_squeue_lines(text: str) -> FallbackRead[BatchJob]:
    """Jobs of a per-line squeue listing (module docstring)."""
    jobs: list[BatchJob] = []
    skipped: list[tuple[int, str]] = []
    for n, obj in _lines(text):
        if isinstance(obj, str):
            skipped.append((n, obj))
            continue
        try:
            jobs.append(_job(obj, f"line {n}"))
        except (SlurmParseError, ValueError, TypeError) as exc:
            skipped.append((n, str(exc)))
    return FallbackRead(jobs, skipped)


def _job(obj: Mapping[str, Any], where: str) -> BatchJob:
    job_id = obj.get("id")
    if not isinstance(job_id, int) or isinstance(job_id, bool):
        raise ValueError(f"{where}: 'id' must be a job number, got {job_id!r}")
    state = str(obj.get("state") or "").upper()
    if not state:
        raise ValueError(f"{where}: missing 'state'")
    if state not in JOB_BASE_STATES and state not in ("COMPLETING", "CONFIGURING", "REQUEUED"):
        raise ValueError(f"{where}: unknown state {state!r}")
    r = str(obj.get("r") or "")
    pending = state == "PENDING"
    reason = r[1:-1] if pending and r.startswith("(") and r.endswith(")") else ""
    nodes = () if pending or not r or r.startswith("(") else expand_hostlist(r, field=f"{where}.r")
    array = obj.get("array_id")
    array_id = int(array) if isinstance(array, int) or (isinstance(array, str) and array.isdigit()) else None
    return BatchJob(
        job_id=job_id,
        name=str(obj.get("name") or ""),
        state=state,
        state_reason="" if reason == "None" else reason,
        partition=str(obj.get("p") or ""),
        user=str(obj.get("u") or ""),
        gpus=parse_tres_gpus(str(obj.get("b") or ""), field=f"{where}.b"),
        node_count=max(len(nodes), 1),
        submit_time=None,
        start_time=None,
        time_limit=None,
        comment=str(obj.get("k") or ""),
        end_time=_when(obj.get("end_time"), f"{where}.end_time"),
        nodes=nodes,
        account=str(obj.get("a") or ""),
        array_job_id=array_id if array_id != job_id else None,
    )


def _when(value: object, where: str) -> datetime | None:
    if value is None or value in ("N/A", "NONE", "Unknown", ""):
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a time, got {value!r}")
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def parse_sinfo_lines(text: str) -> FallbackRead[BatchNode]:
    """Nodes of a per-line sinfo listing, one per node with its partitions merged (module docstring)."""
    nodes: dict[str, BatchNode] = {}
    skipped: list[tuple[int, str]] = []
    for n, obj in _lines(text):
        if isinstance(obj, str):
            skipped.append((n, obj))
            continue
        try:
            node = _node(obj, f"line {n}")
        except (SlurmParseError, ValueError, TypeError) as exc:
            skipped.append((n, str(exc)))
            continue
        seen = nodes.get(node.name)
        if seen is not None:
            parts = seen.partitions + tuple(p for p in node.partitions if p not in seen.partitions)
            node = BatchNode(
                seen.name, seen.state, parts, seen.gres, seen.gres_used, seen.flags, seen.cpus, seen.real_memory_mib
            )
        nodes[node.name] = node
    return FallbackRead(list(nodes.values()), skipped)


def _node(obj: Mapping[str, Any], where: str) -> BatchNode:
    name = obj.get("n")
    raw_state = obj.get("s")
    if not isinstance(name, str) or not name or not isinstance(raw_state, str) or not raw_state:
        raise ValueError(f"{where}: needs a node name 'n' and a state 's'")
    base, *flags = raw_state.upper().rstrip("*~#!%$@^-").split("+")
    cstate = str(obj.get("cstate") or "")
    parts = cstate.split("/")
    cpus = int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else 0
    mem = obj.get("mem")
    partition = obj.get("p")
    return BatchNode(
        name=name,
        state=base,
        partitions=(partition,) if isinstance(partition, str) and partition else (),
        gres=parse_gres(str(obj.get("g") or ""), field=f"{where}.g"),
        gres_used={},
        flags=frozenset(flags),
        cpus=cpus,
        real_memory_mib=mem if isinstance(mem, int) and not isinstance(mem, bool) else 0,
    )
