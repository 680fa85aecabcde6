"""Slurm JSON parsing (real 21.08 captures, real 22.05 v0.0.38 shapes, hand-written v0.0.40+) and the pure
queue-pressure model of `federation.pressure`."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from federation import pressure
from federation.pressure import QueueModel
from providers.slurm.json_api import (
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    data_version,
    expand_hostlist,
    load_document,
    parse_gres,
    parse_sinfo,
    parse_squeue,
    parse_tres_gpus,
)
from providers.slurm.text import parse_sinfo_lines, parse_squeue_lines
from tests.data import shared_file

NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
T = int(NOW.timestamp())


def v38_job(job_id: int, state: str = "PENDING", reason: str = "Resources", **over: Any) -> dict[str, Any]:
    """A job as Slurm 22.05 `squeue --json` prints it (fields trimmed to those we read)."""
    job: dict[str, Any] = {
        "job_id": job_id,
        "name": f"j{job_id}",
        "job_state": state,
        "state_reason": reason,
        "partition": "gpu",
        "user_name": "alice",
        "tres_per_node": "gres:gpu:a100:4",
        "tres_per_job": "",
        "tres_per_task": "",
        "tres_req_str": "cpu=1,mem=100M,node=1,billing=1",
        "node_count": 1,
        "tasks": 1,
        "nodes": "",
        "submit_time": T - 600,
        "start_time": 0,
        "end_time": 0,
        "time_limit": 60,
        "comment": "",
        "admin_comment": "",
        "priority": 4294901000 - job_id,
        "array_task_string": "",
        "array_task_id": None,
    }
    job.update(over)
    return job


def v38_node(name: str, used: int, gpu_type: str = "a100", total: int = 4, **over: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "name": name,
        "state": "mixed" if used else "idle",
        "state_flags": [],
        "partitions": ["gpu"],
        "gres": f"gpu:{gpu_type}:{total}",
        "gres_used": f"gpu:{gpu_type}:{used}(IDX:{'0-' + str(used - 1) if used else 'N/A'})",
        "cpus": 8,
        "real_memory": 8000,
    }
    node.update(over)
    return node


def num(n: int, *, infinite: bool = False, set_: bool = True) -> dict[str, Any]:
    return {"set": set_, "infinite": infinite, "number": n}


# ---- real captures --------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_real_squeue_capture_mixes_plain_and_set_number_fields() -> None:
    doc = json.loads(shared_file("fixtures/slurm-json/squeue_out.json").read_text())
    assert data_version(doc) == "v0.0.37"
    running, pending = parse_squeue(doc)
    assert (running.job_id, running.state, running.state_reason, running.partition) == (
        26515966,
        "RUNNING",
        "",
        "hw-l",
    )
    assert running.user == "bkd" and running.nodes == ("cs75",) and running.time_limit == 30240
    assert running.start_time == datetime.fromtimestamp(1684114921, UTC)
    assert running.end_time == running.start_time + timedelta(seconds=2518912)
    assert running.gpus == {} and running.holds_resources
    # the second record uses the v0.0.40 {set, infinite, number} numbers inside an otherwise v0.0.37 document
    assert (pending.job_id, pending.state, pending.state_reason) == (58948420, "PENDING", "Dependency")
    assert pending.time_limit == 1439 and pending.node_count == 1 and pending.priority == 1368
    assert pending.start_time is None and pending.array_tasks == 10


@pytest.mark.integration
def test_real_sinfo_capture() -> None:
    nodes = parse_sinfo(shared_file("fixtures/slurm-json/sinfo_out.json").read_bytes())
    by_name = {n.name.split(".")[0]: n for n in nodes}
    assert [by_name[k].state for k in ("cs2", "cs3", "cs4", "cs5")] == ["MIXED", "IDLE", "ALLOCATED", "DOWN"]
    assert [by_name[k].usable for k in ("cs2", "cs3", "cs4", "cs5")] == [True, True, True, False]
    assert by_name["cs2"].partitions == ("hw",) and by_name["cs2"].gres == {} and by_name["cs2"].cpus == 64


# ---- 22.05 (v0.0.38) and 23.11+ (v0.0.40) shapes ---------------------------------------------------------------


def test_v38_gpu_job_and_node() -> None:
    doc = {
        "meta": {"plugin": {"type": "openapi/v0.0.38"}},
        "errors": [],
        "jobs": [
            v38_job(1, "RUNNING", "None", nodes="ovs1", start_time=T, end_time=T + 1800, time_limit=30),
            v38_job(2, tres_per_node="", tres_per_job="gres:gpu:2"),
            v38_job(3, tres_per_node="", tres_per_task="gres:gpu:1", tasks=3),
            v38_job(4, "PENDING", "Dependency", array_task_string="1-10:2%2"),
            v38_job(5, "COMPLETING", "None", time_limit=None),
        ],
    }
    assert data_version(doc) == "v0.0.38"
    jobs = parse_squeue(json.dumps(doc))
    assert [j.gpus for j in jobs] == [{"a100": 4}, {"": 2}, {"": 3}, {"a100": 4}, {"a100": 4}]
    assert jobs[0].state_reason == "" and jobs[0].end_time == NOW + timedelta(minutes=30)
    assert jobs[3].array_tasks == 5
    assert jobs[4].state == "COMPLETING" and jobs[4].holds_resources and jobs[4].time_limit is None
    node = parse_sinfo({"nodes": [v38_node("ovs1", 4)]})[0]
    assert (node.state, node.gres, node.gres_used, node.usable) == ("MIXED", {"a100": 4}, {"a100": 4}, True)
    drained = parse_sinfo({"nodes": [v38_node("ovs2", 0, state_flags=["DRAIN"])]})[0]
    assert not drained.usable and drained.free_gpus("a100") == 0


def test_v40_job_shapes() -> None:
    job = {
        "job_id": 77,
        "name": "train",
        "job_state": ["RUNNING", "COMPLETING"],
        "state_reason": "None",
        "partition": "gpu,gpu-low",
        "user_name": "bob",
        "tres_per_node": "gres/gpu:h100=8",
        "node_count": num(2),
        "tasks": num(2),
        "nodes": "gn[01-02]",
        "submit_time": num(T - 60),
        "start_time": num(T),
        "end_time": num(T + 3600),
        "time_limit": num(60),
        "priority": num(1000),
        "exit_code": {"status": ["SUCCESS"], "return_code": num(0)},
        "comment": "x",
    }
    unlimited = {**job, "job_id": 78, "job_state": ["PENDING"], "time_limit": num(0, infinite=True)}
    unset_start = {**unlimited, "job_id": 79, "start_time": num(0, set_=False), "tres_per_node": ""}
    unset_start["tres_req_str"] = "cpu=2,mem=4G,node=1,billing=2,gres/gpu=1,gres/gpu:l40s=1,gres/tmpsize=1"
    parsed = parse_squeue({"meta": {"plugin": {"data_parser": "data_parser/v0.0.40"}}, "jobs": [job, unlimited]})
    first = parsed[0]
    assert (first.state, first.state_flags) == ("RUNNING", frozenset({"COMPLETING"}))
    assert first.partitions == ("gpu", "gpu-low")
    assert first.gpus == {"h100": 16} and first.nodes == ("gn01", "gn02") and first.exit_code == 0
    assert first.time_limit == 60 and first.start_time == NOW and first.priority == 1000
    assert parsed[1].time_limit is None and parsed[1].pending
    third = parse_squeue({"jobs": [unset_start]})[0]
    assert third.start_time is None and third.gpus == {"l40s": 1}


def test_v40_nodes_from_scontrol_and_sinfo_records() -> None:
    flat = {
        "name": "gn01",
        "state": ["IDLE", "DRAIN"],
        "partitions": ["gpu"],
        "gres": "gpu:h100:8(S:0-1)",
        "gres_used": "gpu:h100:0(IDX:N/A)",
        "cpus": 96,
        "real_memory": 1000000,
    }
    node = parse_sinfo({"nodes": [flat]})[0]
    assert (node.state, node.flags, node.gres, node.usable) == ("IDLE", frozenset({"DRAIN"}), {"h100": 8}, False)

    def record(partition: str) -> dict[str, Any]:
        return {
            "partition": {"name": partition},
            "node": {"state": ["MIXED"]},
            "nodes": {"nodes": ["gn02"], "total": 1},
            "gres": {"total": "tmpsize:7T,gpu:l40s:4(S:0-1)", "used": "gpu:l40s:1(IDX:0),tmpsize:10737418240"},
            "cpus": {"maximum": 64},
            "memory": {"maximum": 500000},
        }

    merged = parse_sinfo({"sinfo": [record("gpu"), record("debug")]})
    assert len(merged) == 1
    gn02 = merged[0]
    assert gn02.partitions == ("gpu", "debug") and gn02.gres == {"l40s": 4} and gn02.free_gpus("l40s") == 3
    assert gn02.cpus == 64 and gn02.real_memory_mib == 500000


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gres:gpu:a100:4", {"a100": 4}),
        ("gres:gpu:4", {"": 4}),
        ("gres:gpu", {"": 1}),
        ("gpu:a100:2", {"a100": 2}),
        ("gres/gpu:a100=4", {"a100": 4}),
        ("gres/gpu=4", {"": 4}),
        ("gres:gpu:a100:2,gres:gpu:v100:1", {"a100": 2, "v100": 1}),
        ("gres/gpu=3,gres/gpu:a100=1,gres/gpu:v100=2", {"a100": 1, "v100": 2}),
        ("cpu=1,mem=100M,node=1,billing=1", {}),
        ("gres:shard:2;gres:gpu:a100:1", {"a100": 1}),
        ("", {}),
    ],
)
def test_tres_gpu_requests(text: str, want: dict[str, int]) -> None:
    assert parse_tres_gpus(text) == want


def test_gres_and_hostlists() -> None:
    assert parse_gres("gpu:a100:4(S:0-1),gpu:v100:2(IDX:0,2),tmpsize:7T") == {"a100": 4, "v100": 2}
    assert parse_gres("(null)") == {} and parse_gres("gpu:2") == {"": 2}
    assert expand_hostlist("n[01-03,07],gpu5") == ("n01", "n02", "n03", "n07", "gpu5")
    assert expand_hostlist("a[1-2]b[3-4]") == ("a1b3", "a1b4", "a2b3", "a2b4")


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"jobs": [{"job_id": 5, "name": "x"}]}, "jobs[0] (job 5).job_state"),
        ({"jobs": [v38_job(6, time_limit="1:00:00")]}, "jobs[0] (job 6).time_limit"),
        ({"jobs": [v38_job(7, tres_per_node="gres:gpu:a100:lots")]}, "jobs[0] (job 7).tres_per_node"),
        ({"jobs": [v38_job(8, nodes="n[1-")]}, "jobs[0] (job 8).nodes"),
        ({"jobs": [v38_job(9, time_limit={"set": True})]}, "jobs[0] (job 9).time_limit"),
        ({"jobs": [{"name": "no id", "job_state": "PENDING"}]}, "jobs[0].job_id"),
        ({"jobs": {}}, "jobs"),
        ({"errors": [{"error": "boom"}], "jobs": []}, "errors"),
    ],
)
def test_malformed_jobs_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(SlurmParseError) as err:
        parse_squeue(doc)
    assert err.value.field == field and field in str(err.value)


def test_malformed_nodes_name_the_field() -> None:
    with pytest.raises(SlurmParseError) as err:
        parse_sinfo({"nodes": [v38_node("ovs1", 0, gres="gpu:a100:many")]})
    assert err.value.field == "nodes[0] (node ovs1).gres"
    with pytest.raises(SlurmParseError, match="not JSON"):
        parse_sinfo("{")


# ---- pressure model -------------------------------------------------------------------------------------------


def cluster(jobs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> tuple[list[SlurmJob], list[SlurmNode]]:
    return parse_squeue({"jobs": jobs}), parse_sinfo({"nodes": nodes})


def running(job_id: int, node: str, gpus: int, minutes_left: int, gpu_type: str = "a100") -> dict[str, Any]:
    end = T + minutes_left * 60
    return v38_job(
        job_id,
        "RUNNING",
        "None",
        nodes=node,
        tres_per_node=f"gres:gpu:{gpu_type}:{gpus}",
        start_time=end - 3600,
        end_time=end,
        time_limit=60,
    )


def test_pressure_counts_only_resources_and_priority() -> None:
    jobs, nodes = cluster(
        [
            running(1, "a1", 4, 30),
            running(2, "a2", 4, 90),
            v38_job(3, reason="Resources", tres_per_node="gres:gpu:a100:2"),
            v38_job(4, reason="Priority", tres_per_node="gres:gpu:a100:1", array_task_string="1-3"),
            v38_job(5, reason="JobHeldUser"),
            v38_job(6, reason="Dependency"),
            v38_job(7, reason="QOSMaxGRESPerUser", tres_per_node="gres:gpu:v100:1"),
            v38_job(8, reason="Priority", tres_per_node="", tres_per_job="gres:gpu:2", partition="v"),
            v38_job(9, "COMPLETED", "None", tres_per_node="gres:gpu:a100:4"),
        ],
        [v38_node("a1", 4), v38_node("a2", 4), v38_node("v1", 0, "v100", 2, partitions=["v"])],
    )
    by_acc = {p.accelerator: p for p in QueueModel(jobs, nodes).pressure(NOW)}
    a100, v100 = by_acc["A100"], by_acc["V100"]
    assert (a100.total_gpus, a100.free_gpus, a100.running_jobs, a100.running_gpus) == (8, 0, 2, 8)
    assert (a100.pending_jobs, a100.pending_gpus) == (2, 5)  # 2 GPUs + 3 array tasks x 1 GPU
    assert (a100.blocked_jobs, a100.blocked_gpus) == (2, 8)
    assert a100.blocked_reasons == {"Dependency": 1, "JobHeldUser": 1}
    assert (v100.total_gpus, v100.free_gpus, v100.pending_jobs, v100.pending_gpus) == (2, 2, 1, 2)  # untyped -> V100
    assert v100.blocked_reasons == {"QOSMaxGRESPerUser": 1}
    sample = a100.sample(NOW, "slurm")
    assert (sample.pending_jobs, sample.pending_gpus, sample.source) == (2, 5, "slurm")


def test_wait_from_running_end_times_and_queue_ahead() -> None:
    # a1 frees at +30 min, a2 at +90 min; job 3 (4 GPUs, 60 min, no Slurm estimate) takes a1 from +30 to +90
    jobs, nodes = cluster(
        [running(1, "a1", 4, 30), running(2, "a2", 4, 90), v38_job(3, time_limit=60)],
        [v38_node("a1", 4), v38_node("a2", 4)],
    )
    model = QueueModel(jobs, nodes)
    assert model.expected_wait_hours("A100", 1, NOW) == 1.5
    assert model.expected_wait_hours("a100", 4, NOW) == 1.5
    assert model.expected_wait_hours("A100", 8, NOW) == math.inf  # no node has 8
    assert model.expected_wait_hours("H100", 1, NOW) == math.inf
    assert QueueModel(jobs[:2], nodes).expected_wait_hours("A100", 2, NOW) == 0.5
    idle = QueueModel([], parse_sinfo({"nodes": [v38_node("a1", 1)]}))
    assert idle.expected_wait_hours("A100", 3, NOW) == 0.0 and idle.expected_wait_hours("A100", 4, NOW) == math.inf


def test_wait_uses_slurms_estimated_start() -> None:
    # Slurm says job 3 starts at +2 h (it knows something we do not, e.g. a reservation): the new job waits for it
    jobs, nodes = cluster(
        [running(1, "a1", 4, 30), v38_job(3, tres_per_node="gres:gpu:a100:1", start_time=T + 7200, time_limit=30)],
        [v38_node("a1", 4)],
    )
    assert QueueModel(jobs, nodes).expected_wait_hours("A100", 1, NOW) == 2.0
    # held and dependent jobs are not ahead in the queue
    jobs, nodes = cluster(
        [running(1, "a1", 4, 30), v38_job(3, reason="JobHeldAdmin"), v38_job(4, reason="Dependency")],
        [v38_node("a1", 4)],
    )
    assert QueueModel(jobs, nodes).expected_wait_hours("A100", 4, NOW) == 0.5


def test_partition_scope_and_unusable_nodes() -> None:
    jobs, nodes = cluster(
        [running(1, "a1", 4, 60)],
        [
            v38_node("a1", 4),
            v38_node("a2", 0, state="down"),
            v38_node("b1", 0, partitions=["other"]),
        ],
    )
    scoped = QueueModel(jobs, nodes, partitions=["gpu"])
    (a100,) = scoped.pressure(NOW)
    assert (a100.total_gpus, a100.free_gpus, a100.expected_wait_hours) == (8, 0, 1.0)
    assert QueueModel(jobs, nodes).expected_wait_hours("A100", 2, NOW) == 0.0
    assert QueueModel(jobs, nodes).expected_wait_hours("A100", 2, NOW, partition="gpu") == 1.0


def test_exit_status_and_heterogeneous_components_across_versions() -> None:
    """22.05 squeue prints a waitpid status and het fields as 0 for a plain job (captured on the test cluster);
    v0.0.40+ an exit object and `{set, number}` het fields; a het job lists one record per component."""
    plain = v38_job(1, "FAILED", "NonZeroExitCode", exit_code=768, het_job_id=0, het_job_offset=0)
    killed = v38_job(2, "FAILED", "None", exit_code=9)
    leader = v38_job(3, het_job_id=3, het_job_offset=0, het_job_id_set="3-4")
    member = v38_job(4, het_job_id=3, het_job_offset=1, het_job_id_set="3-4", tres_per_node="gres:gpu:a100:1")
    v40 = {
        **v38_job(5, "FAILED", "None"),
        "job_state": ["FAILED"],
        "exit_code": {"status": ["SIGNALED"], "return_code": num(0, set_=False), "signal": {"id": num(11)}},
        "het_job_id": num(5),
        "het_job_offset": num(2),
    }
    jobs = parse_squeue({"jobs": [plain, killed, leader, member, v40]})
    assert [(j.exit_code, j.exit_signal) for j in jobs] == [(3, None), (0, 9), (None, None), (None, None), (None, 11)]
    assert [(j.het_job_id, j.het_job_offset) for j in jobs] == [(None, None), (None, None), (3, 0), (3, 1), (5, 2)]
    assert jobs[3].gpus == {"a100": 1} and jobs[3].target == "4"


@pytest.mark.integration
def test_sdiag_capture_names_its_data_parser() -> None:
    """The 23.02 `sdiag --json` capture: its version sits in `meta.plugins.data_parser` (v0.0.39), a key the
    older documents do not have; errors in it are refused like any document's."""
    doc = json.loads(shared_file("fixtures/slurm-json/sdiag.json").read_text())
    assert data_version(doc) == "v0.0.39"
    assert load_document(doc, "sdiag") is doc
    with pytest.raises(SlurmParseError) as exc:
        load_document({**doc, "errors": [{"error": "Access denied", "error_number": 1}]}, "sdiag")
    assert "Access denied" in str(exc.value)


def test_a_deep_queue_beyond_the_simulated_depth_is_charged_as_gpu_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten 4-GPU one-hour jobs queue on one idle 4-GPU node: simulated one by one the new job waits 10 h; with only
    3 placed one by one, the other 7 add their 28 GPU-hours over the node's 4 GPUs: the same 10 h, for a bounded
    cost. The simulation is shared by every question to the model."""
    jobs, nodes = cluster([v38_job(i, time_limit=60) for i in range(1, 11)], [v38_node("a1", 0)])
    assert QueueModel(jobs, nodes).expected_wait_hours("A100", 4, NOW) == 10.0
    monkeypatch.setattr(pressure, "MAX_SIMULATED_QUEUE", 3)
    model = QueueModel(jobs, nodes)
    assert model.expected_wait_hours("A100", 4, NOW) == 10.0
    assert model.expected_wait_hours("A100", 1, NOW) == 10.0
    runs: list[object] = []
    monkeypatch.setattr(model, "_run_queue", lambda *a: runs.append(a))
    model.expected_wait_hours("A100", 2, NOW)
    assert runs == []  # answered from the simulation already made for this type and time


@pytest.mark.integration
def test_squeue_fallback_capture_reads_what_it_can_and_reports_the_rest() -> None:
    read = parse_squeue_lines(shared_file("fixtures/slurm-json/squeue_fallback.txt").read_text())
    by_id = {j.job_id: j for j in read.records}
    assert sorted(by_id) == [18804, 26515966, 50580016, 51447051, 51447052, 51447053]
    running = by_id[26515966]
    assert (running.state, running.partition, running.account, running.nodes) == (
        "RUNNING",
        "hw-h",
        "account1",
        ("cs10",),
    )
    assert running.end_time == datetime(2023, 9, 21, 0, 21, 42, tzinfo=UTC) and running.holds_resources
    assert by_id[51447051].state_reason == "Dependency" and by_id[18804].state_reason == "Priority"
    assert by_id[51447052].state_reason.startswith("(ReqNodeNotAvail")
    assert by_id[18804].end_time is None and by_id[18804].pending
    assert [n for n, _ in read.skipped] == [8, 9]  # the two lines with `"cpu": xx`, not JSON


@pytest.mark.integration
def test_sinfo_fallback_capture_merges_partitions_per_node() -> None:
    read = parse_sinfo_lines(shared_file("fixtures/slurm-json/sinfo_fallback.txt").read_text())
    by_name = {n.name: n for n in read.records}
    assert sorted(by_name) == ["cs156", "cs25", "cs31", "cs53"] and read.skipped == []
    assert by_name["cs25"].partitions == ("hw", "hw-l", "hw-m", "hw-h", "cdn")
    assert [by_name[k].state for k in ("cs156", "cs25", "cs31", "cs53")] == ["COMPLETING", "ALLOCATED", "IDLE", "MIXED"]
    assert by_name["cs31"].usable and by_name["cs25"].cpus == 64 and by_name["cs25"].real_memory_mib == 1000000


def test_v40_array_records_and_tasks() -> None:
    """23.11+ array shapes: a pending record standing for its tasks (`array_task_id` unset, `array_task_string`
    with a `%` limit) and a running task (`array_task_id` set), ids as `{set, number}`."""
    record = {
        **v38_job(40),
        "job_state": ["PENDING"],
        "array_job_id": num(40),
        "array_task_id": num(0, set_=False),
        "array_task_string": "2-5%2",
        "array_max_tasks": num(2),
    }
    task = {
        **v38_job(41, "RUNNING", "None", nodes="ovs1"),
        "job_state": ["RUNNING"],
        "array_job_id": num(40),
        "array_task_id": num(1),
        "array_task_string": "",
    }
    doc = {"meta": {"plugins": {"data_parser": "data_parser/v0.0.41"}}, "jobs": [record, task]}
    assert data_version(doc) == "v0.0.41"
    pending, running = parse_squeue(doc)
    assert (pending.array_job_id, pending.array_task_id, pending.array_task_ids, pending.array_tasks) == (
        40,
        None,
        (2, 3, 4, 5),
        4,
    )
    assert pending.target == "40" and running.target == "40_1" and running.array_tasks == 1
    model = QueueModel([pending, running], parse_sinfo({"nodes": [v38_node("ovs1", 4), v38_node("ovs2", 0)]}))
    (demand,) = model.demands()
    assert demand.gpus == 16  # 4 tasks x 4 GPUs
