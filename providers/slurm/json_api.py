"""Parse Slurm's JSON job and node listings into typed records. Pure: no subprocess, no clock, no I/O.

Role: the one place that knows Slurm's JSON shapes. It yields the domain types `providers.model.BatchJob` and
`BatchNode` (also exported here as `SlurmJob` and `SlurmNode`), so the provider (`providers.slurm.provider`) and the
queue-pressure model (`federation.pressure`, which imports nothing from here) work on those only.

Shapes handled (a document may mix them field by field, as real captures do, so every field is read leniently):
- v0.0.37 / v0.0.38 (Slurm 21.08 / 22.05 `squeue --json`, `sinfo --json`, slurmrestd `GET /slurm/v0.0.38/jobs`
  and `/nodes`): `job_state` a string ("PENDING", or a flag name such as "COMPLETING"), numbers plain (`time_limit`
  null when INFINITE), node `state` a lower-case base state plus `state_flags`, GPU requests in `tres_per_node` /
  `tres_per_job` / `tres_per_task` as `gres:gpu:a100:4`.
- v0.0.40+ (Slurm 23.11+): `job_state` a list (`["RUNNING", "COMPLETING"]`: the base state first, then flags),
  numbers as `{"set", "infinite", "number"}`, TRES strings as `gres/gpu:a100=4`, node `state` a list. Nodes come
  either flat (`{"nodes": [...]}` from `scontrol show nodes --json` or slurmrestd) or as `sinfo --json` records
  (`{"sinfo": [{"nodes": {"nodes": [...]}, "node": {"state": [...]}, "partition": {"name"}, "gres": {...}}]}`).

Conventions: times are tz-aware UTC datetimes, None when Slurm reports 0 / unset; `time_limit` is minutes, None
when unlimited or unset; GPU counts are keyed by Slurm's GPU type name exactly as configured ("a100"), "" for an
untyped request (`--gres=gpu:2`, `--gpus=2`). A job's `gpus` are the job's total over all its nodes (and array
tasks are not multiplied in: `array_tasks` says how many tasks a pending array record stands for).

Malformed input raises `SlurmParseError`, whose message and `field` name the offending field and job or node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from providers.model import BatchJob, BatchNode
from providers.model import expand_task_ids as _expand_task_ids

JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
NODE_BASE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
_NO_VAL32 = 0xFFFFFFFE  # NO_VAL / INFINITE sentinels of the plain-number shapes (>= this means unset)


class SlurmParseError(ValueError):
    """Slurm JSON that does not have the expected shape. `field` is the dotted path of the offending field."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


SlurmJob = BatchJob  # the names this module had before the types moved to the domain model
SlurmNode = BatchNode


# ---- documents ------------------------------------------------------------------------------------------------


def load_document(data: str | bytes | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """A decoded JSON document (text or already decoded); Slurm-reported `errors` raise `SlurmParseError`."""
    if isinstance(data, str | bytes):
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as exc:
            raise SlurmParseError(f"{what}: not JSON: {exc}", field="") from exc
    else:
        doc = data
    if not isinstance(doc, Mapping):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(doc).__name__}", field="")
    errors = doc.get("errors") or []
    if not isinstance(errors, list):
        raise SlurmParseError(f"{what}: 'errors' must be a list", field="errors")
    if errors:
        messages = [
            str(e.get("error") or e.get("description") or e) if isinstance(e, Mapping) else str(e) for e in errors
        ]
        raise SlurmParseError(f"{what}: Slurm reported errors: {'; '.join(messages)}", field="errors")
    return doc


def data_version(doc: Mapping[str, Any]) -> str:
    """The plugin / data_parser version a document was written by ("v0.0.38", "v0.0.40"...), "" if unknown."""
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        return ""
    plugin = meta.get("plugin")
    candidates: list[object] = []
    if isinstance(plugin, Mapping):
        candidates += [plugin.get("type"), plugin.get("data_parser")]
    plugins = meta.get("plugins")
    if isinstance(plugins, Mapping):
        candidates.append(plugins.get("data_parser"))
    for value in candidates:
        if isinstance(value, str) and "/" in value:
            return value.rsplit("/", 1)[1]
    return ""


def parse_squeue(data: str | bytes | Mapping[str, Any]) -> list[SlurmJob]:
    """Jobs of a `squeue --json` (or slurmrestd `GET .../jobs`) document, in Slurm's order."""
    doc = load_document(data, "squeue")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError("squeue: missing 'jobs' list", field="jobs")
    return [parse_job(job, where=f"jobs[{i}]") for i, job in enumerate(jobs)]


def parse_sinfo(data: str | bytes | Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes of a `sinfo --json` / `scontrol show nodes --json` / slurmrestd `GET .../nodes` document.

    23.11+ `sinfo --json` records (one per partition and node group) are merged per node name.
    """
    doc = load_document(data, "sinfo")
    if isinstance(doc.get("nodes"), list):
        return [parse_node(node, where=f"nodes[{i}]") for i, node in enumerate(doc["nodes"])]
    if isinstance(doc.get("sinfo"), list):
        merged: dict[str, SlurmNode] = {}
        for i, record in enumerate(doc["sinfo"]):
            for node in _sinfo_record_nodes(record, where=f"sinfo[{i}]"):
                seen = merged.get(node.name)
                if seen is not None:
                    parts = seen.partitions + tuple(p for p in node.partitions if p not in seen.partitions)
                    node = SlurmNode(
                        seen.name,
                        seen.state,
                        parts,
                        seen.gres,
                        seen.gres_used,
                        seen.flags,
                        seen.cpus,
                        seen.real_memory_mib,
                    )
                merged[node.name] = node
        return list(merged.values())
    raise SlurmParseError("sinfo: missing 'nodes' (or 23.11+ 'sinfo') list", field="nodes")


# ---- jobs -----------------------------------------------------------------------------------------------------


def parse_job(obj: object, *, where: str = "job") -> SlurmJob:
    """One job object of any supported shape."""
    if not isinstance(obj, Mapping):
        raise SlurmParseError(f"{where}: expected an object, got {type(obj).__name__}", field=where)
    job_id = _number(obj, "job_id", where)
    if job_id is None:
        raise SlurmParseError(f"{where}.job_id: missing", field=f"{where}.job_id")
    where = f"{where} (job {int(job_id)})"
    state, flags = _state(obj, "job_state", where, JOB_BASE_STATES, required=True)
    reason = _string(obj, "state_reason", where)
    node_count = _int(obj, "node_count", where) or 1
    tasks = _int(obj, "tasks", where) or 1
    gpus = _job_gpus(obj, where, node_count, tasks)
    user = _string(obj, "user_name", where)
    if not user and obj.get("user_id") is not None:
        user = str(_int(obj, "user_id", where))
    limit = _int(obj, "time_limit", where)
    code, signal = exit_status(obj, where, state)
    het_job = _int(obj, "het_job_id", where) or None  # 0: not a heterogeneous job
    return SlurmJob(
        job_id=int(job_id),
        name=_string(obj, "name", where),
        state=state,
        state_reason="" if reason == "None" else reason,
        partition=_string(obj, "partition", where),
        user=user,
        gpus=gpus,
        node_count=node_count,
        submit_time=_time(obj, "submit_time", where),
        start_time=_time(obj, "start_time", where),
        time_limit=limit,
        comment=_string(obj, "comment", where),
        state_flags=flags,
        end_time=_time(obj, "end_time", where),
        nodes=expand_hostlist(_string(obj, "nodes", where), field=f"{where}.nodes"),
        admin_comment=_string(obj, "admin_comment", where),
        priority=_int(obj, "priority", where),
        restart_count=_int(obj, "restart_cnt", where) or 0,
        exit_code=code,
        exit_signal=signal,
        array_tasks=_array_tasks(obj, where),
        account=_string(obj, "account", where),
        qos=_string(obj, "qos", where),
        dependency=_string(obj, "dependency", where),
        array_job_id=_int(obj, "array_job_id", where) or None,  # 0: not an array
        array_task_id=_int(obj, "array_task_id", where),
        array_task_string=_string(obj, "array_task_string", where),
        het_job_id=het_job,
        het_job_offset=_int(obj, "het_job_offset", where) if het_job else None,
    )


def _job_gpus(obj: Mapping[str, Any], where: str, node_count: int, tasks: int) -> dict[str, int]:
    """Total GPUs requested per type: per-job, else per-node x nodes, else per-task x tasks, else the TRES strings."""
    per_job = parse_tres_gpus(_string(obj, "tres_per_job", where), field=f"{where}.tres_per_job")
    if per_job:
        return per_job
    per_node = parse_tres_gpus(_string(obj, "tres_per_node", where), field=f"{where}.tres_per_node")
    if per_node:
        return {t: n * node_count for t, n in per_node.items()}
    per_task = parse_tres_gpus(_string(obj, "tres_per_task", where), field=f"{where}.tres_per_task")
    if per_task:
        return {t: n * tasks for t, n in per_task.items()}
    for key in ("tres_alloc_str", "tres_req_str"):
        found = parse_tres_gpus(_string(obj, key, where), field=f"{where}.{key}")
        if found:
            return found
    return {}


_TRES_SPLIT = re.compile(r"[,;]")


def parse_tres_gpus(text: str, *, field: str = "tres") -> dict[str, int]:
    """GPUs per type in a TRES/GRES request string; non-GPU entries are ignored.

    Accepts `gres:gpu:a100:4`, `gres:gpu:4`, `gres:gpu` (one), `gpu:a100:4`, `gres/gpu:a100=4`, `gres/gpu=4` and
    full TRES strings such as `cpu=1,mem=4G,node=1,gres/gpu=4,gres/gpu:a100=4`, where Slurm lists the untyped
    total next to the typed counts: when any typed entry is present, untyped ones are left out.
    """
    typed: dict[str, int] = {}
    untyped = 0
    for raw in _TRES_SPLIT.split(text or ""):
        entry = raw.strip()
        if not entry:
            continue
        if "=" in entry:  # TRES form: gres/gpu[:type]=count
            key, _, value = entry.partition("=")
            key = key.strip()
            if key.startswith("gres/"):
                key = key[len("gres/") :]
            name, _, gpu_type = key.partition(":")
            if name != "gpu":
                continue
            count = _count(value, field, entry)
        else:  # GRES form: [gres:]gpu[:type][:count]
            parts = entry.split(":")
            if parts[0] == "gres":
                parts = parts[1:]
            if not parts or parts[0] != "gpu":
                continue
            gpu_type, count = _gres_tail(parts[1:], field, entry)
        if gpu_type:
            typed[gpu_type] = typed.get(gpu_type, 0) + count
        else:
            untyped += count
    if typed:
        return typed
    return {"": untyped} if untyped else {}


def _gres_tail(parts: list[str], field: str, entry: str) -> tuple[str, int]:
    """(type, count) from what follows `gpu` in `gpu:a100:4` / `gpu:4` / `gpu:a100` / `gpu`."""
    if not parts:
        return "", 1
    if len(parts) == 1:
        return ("", _count(parts[0], field, entry)) if parts[0].strip().isdigit() else (parts[0], 1)
    return ":".join(parts[:-1]), _count(parts[-1], field, entry)


def _count(value: str, field: str, entry: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise SlurmParseError(f"{field}: bad GPU count {value!r} in {entry!r}", field=field)
    return int(text)


def _array_tasks(obj: Mapping[str, Any], where: str) -> int:
    """How many array tasks a record stands for: 1 unless it is a pending array record (`array_task_string`)."""
    text = _string(obj, "array_task_string", where)
    if not text or _int(obj, "array_task_id", where) is not None:
        return 1
    return max(len(expand_task_ids(text, field=f"{where}.array_task_string")), 1)


def expand_task_ids(text: str, *, field: str = "array_task_string") -> list[int]:
    """Task ids of an array task string such as `0-3`, `1,4-9:2` or `0-99%10` (the `%` limit is dropped);
    at most `MAX_ARRAY_TASKS` per range. Raises `SlurmParseError` naming `field`."""
    try:
        return _expand_task_ids(text)
    except ValueError as exc:
        raise SlurmParseError(f"{field}: {exc}", field=field) from exc


def exit_status(obj: Mapping[str, Any], where: str, state: str = "") -> tuple[int | None, int | None]:
    """(return code, signal) of a job; None for what is not reported.

    v0.0.37/38 print a plain waitpid status (`768`: exit 3; `9`: killed by signal 9); dbv0.0.38 and v0.0.40+ an
    object `{"status", "return_code", "signal": {"signal_id" | "id", "name"}}` whose numbers may be
    `{set, infinite, number}`. 22.05's accounting writes a FAILED job's exit as SUCCESS/0 (the real code is lost):
    a FAILED job claiming exit 0 without a signal is read as unknown, never as 0."""
    value = obj.get("exit_code")
    if value is None:
        return None, None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = int(value)
        if number < 0 or number >= _NO_VAL32:
            return None, None
        return (number >> 8) & 0xFF, (number & 0x7F) or None
    if not isinstance(value, Mapping):
        raise SlurmParseError(f"{where}.exit_code: expected an object, got {value!r}", field=f"{where}.exit_code")
    status = value.get("status")
    statuses = {status} if isinstance(status, str) else set(status) if isinstance(status, list) else set()
    code = _number(value, "return_code", f"{where}.exit_code")
    signal_obj = value.get("signal")
    signal: int | float | None = None
    if isinstance(signal_obj, Mapping):
        key = "signal_id" if "signal_id" in signal_obj else "id"
        signal = _number(signal_obj, key, f"{where}.exit_code.signal")
    if signal is not None and "SIGNALED" not in statuses and signal == 0:
        signal = None
    code_int = None if code is None else int(code)
    if state == "FAILED" and not signal and code_int == 0:
        code_int = None
    return code_int, int(signal) if signal else None


# ---- nodes ----------------------------------------------------------------------------------------------------


def parse_node(obj: object, *, where: str = "node") -> SlurmNode:
    """One flat node object (v0.0.37/38 sinfo and slurmrestd, v0.0.40+ scontrol/slurmrestd)."""
    if not isinstance(obj, Mapping):
        raise SlurmParseError(f"{where}: expected an object, got {type(obj).__name__}", field=where)
    name = _string(obj, "name", where)
    if not name:
        raise SlurmParseError(f"{where}.name: missing", field=f"{where}.name")
    where = f"{where} (node {name})"
    state, flags = _state(obj, "state", where, NODE_BASE_STATES, required=True)
    extra = obj.get("state_flags") or []
    if not isinstance(extra, list) or not all(isinstance(f, str) for f in extra):
        raise SlurmParseError(f"{where}.state_flags: expected a list of strings", field=f"{where}.state_flags")
    partitions = obj.get("partitions") or []
    if isinstance(partitions, str):
        partitions = [p for p in partitions.split(",") if p]
    if not isinstance(partitions, list) or not all(isinstance(p, str) for p in partitions):
        raise SlurmParseError(f"{where}.partitions: expected a list of names", field=f"{where}.partitions")
    return SlurmNode(
        name=name,
        state=state,
        partitions=tuple(partitions),
        gres=parse_gres(_string(obj, "gres", where), field=f"{where}.gres"),
        gres_used=parse_gres(_string(obj, "gres_used", where), field=f"{where}.gres_used"),
        flags=flags | {f.upper() for f in extra},
        cpus=_int(obj, "cpus", where) or 0,
        real_memory_mib=_int(obj, "real_memory", where) or 0,
    )


def _sinfo_record_nodes(record: object, *, where: str) -> list[SlurmNode]:
    """The nodes of one 23.11+ `sinfo --json` record (best read with `sinfo -N`: one node per record)."""
    if not isinstance(record, Mapping):
        raise SlurmParseError(f"{where}: expected an object", field=where)
    names = _path(record, ("nodes", "nodes"), where)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SlurmParseError(f"{where}.nodes.nodes: expected a list of node names", field=f"{where}.nodes.nodes")
    node = record.get("node") or {}
    if not isinstance(node, Mapping):
        raise SlurmParseError(f"{where}.node: expected an object", field=f"{where}.node")
    state, flags = _state(node, "state", f"{where}.node", NODE_BASE_STATES, required=True)
    partition = _path(record, ("partition", "name"), where)
    gres = record.get("gres") or {}
    if not isinstance(gres, Mapping):
        raise SlurmParseError(f"{where}.gres: expected an object", field=f"{where}.gres")
    total = parse_gres(_string(gres, "total", f"{where}.gres"), field=f"{where}.gres.total")
    used = parse_gres(_string(gres, "used", f"{where}.gres"), field=f"{where}.gres.used")
    cpus = _path(record, ("cpus", "maximum"), where)
    memory = _path(record, ("memory", "maximum"), where)
    return [
        SlurmNode(
            name=name,
            state=state,
            partitions=(partition,) if isinstance(partition, str) and partition else (),
            gres=total,
            gres_used=used,
            flags=flags,
            cpus=cpus if isinstance(cpus, int) else 0,
            real_memory_mib=memory if isinstance(memory, int) else 0,
        )
        for name in names
    ]


def parse_gres(text: str, *, field: str = "gres") -> dict[str, int]:
    """GPUs per type in a node GRES string such as `gpu:a100:4(S:0-1),gpu:v100:2` or `gpu:a100:2(IDX:0,2)`.

    Non-GPU GRES (`tmpsize:7T`) are ignored; "(null)" and "" mean none.
    """
    out: dict[str, int] = {}
    for entry in _split_top_level(text or "", ","):
        entry = entry.strip()
        if not entry or entry == "(null)":
            continue
        base = entry.split("(", 1)[0]
        parts = base.split(":")
        if parts[0] == "gres":
            parts = parts[1:]
        if not parts or parts[0] != "gpu":
            continue
        gpu_type, count = _gres_tail(parts[1:], field, entry)
        out[gpu_type] = out.get(gpu_type, 0) + count
    return out


# ---- host lists -----------------------------------------------------------------------------------------------


def expand_hostlist(text: str, *, field: str = "nodes") -> tuple[str, ...]:
    """Expand a Slurm host list: `n[01-03,07],gpu5` -> (n01, n02, n03, n07, gpu5); zero padding is kept."""
    out: list[str] = []
    for item in _split_top_level(text.strip(), ","):
        item = item.strip()
        if item:
            out.extend(_expand_one(item, field))
    return tuple(out)


def _expand_one(item: str, field: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        if "]" in item:
            raise SlurmParseError(f"{field}: unbalanced brackets in {item!r}", field=field)
        return [item]
    end = item.find("]", start)
    if end < 0:
        raise SlurmParseError(f"{field}: unbalanced brackets in {item!r}", field=field)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_one(rest, field) if rest else [""]
    out: list[str] = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise SlurmParseError(f"{field}: bad range {part!r} in {item!r}", field=field)
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{i:0{width}d}{tail}" for tail in tails)
    return out


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets and parentheses (`gpu:a100:2(IDX:0,2)`, `n[1,3]`)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


# ---- field readers --------------------------------------------------------------------------------------------


def _path(obj: Mapping[str, Any], keys: Sequence[str], where: str) -> object:
    value: object = obj
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, Mapping) and "number" in value:
        return _number(value, "number", f"{where}.{'.'.join(keys)}") if value.get("set", True) else None
    return value


def _string(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmParseError(
            f"{where}.{key}: expected a string, got {type(value).__name__} {value!r}", field=f"{where}.{key}"
        )
    return value


def _number(obj: Mapping[str, Any], key: str, where: str) -> int | float | None:
    """A plain number or a v0.0.40 `{"set", "infinite", "number"}`; None when unset, infinite or NO_VAL."""
    value = obj.get(key)
    name = f"{where}.{key}"
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "number" not in value:
            raise SlurmParseError(f"{name}: expected a number or {{set, infinite, number}}, got {value!r}", field=name)
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value["number"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SlurmParseError(f"{name}: expected a number, got {type(value).__name__} {value!r}", field=name)
    if isinstance(value, int) and value >= _NO_VAL32 and key not in ("job_id", "priority"):
        return None
    return value


def _int(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    value = _number(obj, key, where)
    return None if value is None else int(value)


def _time(obj: Mapping[str, Any], key: str, where: str) -> datetime | None:
    value = _number(obj, key, where)
    if value is None or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise SlurmParseError(f"{where}.{key}: not a Unix time: {value!r}", field=f"{where}.{key}") from exc


def _state(
    obj: Mapping[str, Any], key: str, where: str, bases: frozenset[str], *, required: bool
) -> tuple[str, frozenset[str]]:
    """(base state, extra flags) from a string (v0.0.38) or a list of flags (v0.0.40+), upper-cased."""
    value = obj.get(key)
    name = f"{where}.{key}"
    if isinstance(value, str) and value:
        return value.upper(), frozenset()
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        upper = [v.upper() for v in value]
        base = next((v for v in upper if v in bases), upper[0])
        return base, frozenset(v for v in upper if v != base)
    if value is None and not required:
        return "", frozenset()
    raise SlurmParseError(f"{name}: expected a state string or a non-empty list, got {value!r}", field=name)
