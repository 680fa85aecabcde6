"""The broker/agent contract and the agent's pure parts: spec and report round trips, signatures, hostile specs and
manifests, checkpoint snapshots that never follow links, secret redaction, exit classification, the notice
watchers against tests/metadata_server.py, and the wheel (standard library only, reproducible)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent import protocol as p
from agent.bootstrap import startup_script
from agent.checkpoints import Checkpointer, CheckpointError, parse_manifest, safe_relative_path
from agent.identity import Identities
from agent.logship import LogShipper, Redactor
from agent.main import classify, parse_signal
from agent.notices import NoticeWatcher
from agent.reports import Reporter
from agent.runtime import ContainerWorkload, Launch, LaunchError, check_env
from agent.stores import FileStore, StoreError
from agent.wheel import build_wheel
from tests.metadata_server import MetadataServer

pytest_plugins = ["tests.agent_fixtures"]
KEY = "ab" * 32
AGENT_DIR = Path(__file__).resolve().parents[1] / "agent"


def _spec(**overrides: object) -> p.AttemptSpec:
    spec = p.AttemptSpec(
        job_id="job-1",
        placement_id="pl_1",
        tenant="acme",
        command=("python", "train.py", "--lr", "0.1"),
        runtime=p.Runtime.PODMAN,
        checkpoint=p.CheckpointSpec("s3://b/ckpt/job-1/", resume=True, interval_seconds=600),
        logs_uri="s3://b/logs/pl_1/",
        mailbox_uri="s3://b/mailbox/acme/",
        report_key=KEY,
        image="127.0.0.1:5055/acme/train:1",
        env={"EPOCHS": "3"},
        secrets=(p.SecretRef("DB", p.SecretSource.GCP_SECRET_MANAGER, "projects/x/secrets/db", "password"),),
        gpu_count=2,
        shm_size_gb="16",
        registry=p.RegistryAuth(
            p.RegistryAuthKind.SECRET, "127.0.0.1:5055", p.SecretRef("R", p.SecretSource.AWS_SECRETS_MANAGER, "reg")
        ),
        notice=p.NoticeSpec(p.NoticeSource.AZURE, "SIGUSR2", 15),
        callback_url="https://broker.example/v1/placements/pl_1/reports",
        heartbeat_seconds=120,
    )
    return replace(spec, **overrides)  # type: ignore[arg-type]


def test_spec_round_trip() -> None:
    spec = _spec()
    assert p.AttemptSpec.from_json(spec.to_json()) == spec
    assert p.AttemptSpec.from_json(_spec(runtime=p.Runtime.PROCESS, image="").to_json()).image == ""


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: "not json", "not JSON"),
        (lambda d: [], "JSON object"),
        (lambda d: {**d, "version": 2}, "spec.version"),
        (lambda d: {k: v for k, v in d.items() if k != "report_key"}, "report_key"),
        (lambda d: {**d, "runtime": "lxc"}, "lxc"),
        (lambda d: {**d, "logs_uri": "s3://b/logs"}, "spec.logs_uri"),
        (lambda d: {**d, "mailbox_uri": "s3://b/m"}, "spec.mailbox_uri"),
        (lambda d: {**d, "image": ""}, "spec.image"),
        (lambda d: {**d, "secrets": [{"env": "X", "source": "vault", "ref": "r"}]}, "vault"),
        (lambda d: {**d, "gpu_count": "many"}, "many"),
        (lambda d: {**d, "checkpoint": {"uri": "s3://b/c/", "bogus": 1}}, "bogus"),
    ],
)
def test_hostile_specs_are_refused_naming_the_field(mutate: object, field: str) -> None:
    doc = json.loads(_spec().to_json())
    bad = mutate(doc)  # type: ignore[operator]
    data = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(p.ProtocolError, match=field):
        p.AttemptSpec.from_json(data)


def test_reports_are_signed_and_tampering_shows() -> None:
    report = p.Report(
        placement_id="pl_1", seq=17, kind=p.ReportKind.FINAL, at="2026-11-02T08:00:00.000Z",
        outcome=p.Outcome.USER_FAILED, exit_code=3, detail="x", progress=p.Progress(5, 10, 4), checkpointed=0.4,
        notice=p.Notice(p.NoticeSource.AWS, "preempt", "t", "d"), log_tail="tail",
    ).signed(KEY)  # fmt: skip
    back = p.Report.from_json(report.to_json())
    assert back == report and back.verify(KEY)
    assert not back.verify("cd" * 32)
    forged = replace(back, outcome=p.Outcome.SUCCEEDED, exit_code=0)  # a lost callback replayed as a success
    assert not forged.verify(KEY)
    assert p.parse_mailbox_entry_name(p.mailbox_entry_name(report)) == ("pl_1", 17, "final")
    assert p.parse_mailbox_entry_name("../pl_1-00000000000000000017-final.json") is None
    assert p.parse_log_chunk_name(p.log_chunk_name(1 << 40)) == 1 << 40


def test_exit_classification() -> None:
    assert classify(0, container=True, preempted=False).outcome is p.Outcome.SUCCEEDED
    assert classify(125, container=True, preempted=False).outcome is p.Outcome.INFRA_FAILED
    assert classify(125, container=False, preempted=False).outcome is p.Outcome.USER_FAILED
    for code in (1, 3, 126, 127, 137, 139):
        assert classify(code, container=True, preempted=False).outcome is p.Outcome.USER_FAILED
    for code in (0, 1, 143):  # after a notice the attempt is preempted whatever the exit: never a false success
        assert classify(code, container=False, preempted=True).outcome is p.Outcome.PREEMPTED
    assert parse_signal("SIGUSR2").name == "SIGUSR2" and parse_signal("usr1").name == "SIGUSR1"
    assert parse_signal("SIGNOPE").name == "SIGUSR1"


# ------------------------------------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "a//b", "./a", "", "a\\..\\b", "a/\0b", 7, None])
def test_manifest_paths_must_stay_inside_the_directory(path: object) -> None:
    with pytest.raises(CheckpointError):
        safe_relative_path(path)


def _manifest(files: list[dict[str, object]]) -> bytes:
    return json.dumps({"version": 1, "files": files}).encode()


def test_hostile_manifests_are_refused() -> None:
    good = {"path": "a.bin", "size": 1, "sha256": "0" * 64}
    assert parse_manifest(_manifest([good])).files[0].path == "a.bin"
    for files in ([{**good, "size": -1}], [{**good, "sha256": "XYZ"}], [good, good], [{**good, "size": True}], ["x"]):
        with pytest.raises(CheckpointError):
            parse_manifest(_manifest(files))  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="version"):
        parse_manifest(json.dumps({"version": 9, "files": []}).encode())


def test_checkpoint_manifest_path_dotdot_cannot_write_outside_the_directory(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of b""
    store.put(f"ck/data/{digest}", b"")
    store.put("ck/MANIFEST.json", _manifest([{"path": "../../escaped", "size": 0, "sha256": digest}]))
    ckpt = Checkpointer(
        store, "ck/", tmp_path / "w" / "checkpoint", tmp_path / "w" / "staging", job_id="j", placement_id="p"
    )
    with pytest.raises(CheckpointError):
        ckpt.restore()
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "w" / "escaped").exists()


def test_checkpoint_symlink_to_a_host_file_is_never_uploaded(tmp_path: Path) -> None:
    host_secret = tmp_path / "host-credentials"
    host_secret.write_text("aws_secret_access_key=HOST-ONLY")
    directory = tmp_path / "checkpoint"
    (directory / "sub").mkdir(parents=True)
    (directory / "weights.bin").write_bytes(b"w" * 10)
    (directory / "sub" / "opt.bin").write_bytes(b"o" * 5)
    (directory / "creds").symlink_to(host_secret)  # planted by the workload (in a container: a host path)
    (directory / "linkdir").symlink_to(tmp_path)
    (directory / "partial.tmp").write_bytes(b"half")
    (directory / ".hidden").write_bytes(b"x")
    store = FileStore(tmp_path / "store")
    ckpt = Checkpointer(store, "ck/", directory, tmp_path / "staging", job_id="j", placement_id="p")
    manifest = ckpt.snapshot(p.Progress(5, 10, 5))
    assert manifest is not None and sorted(f.path for f in manifest.files) == ["sub/opt.bin", "weights.bin"]
    for key in store.list("ck/"):
        assert b"HOST-ONLY" not in (store.get(key) or b"")
    # restore into a fresh directory gives the same files back, verified
    again = Checkpointer(store, "ck/", tmp_path / "restored", tmp_path / "staging2", job_id="j", placement_id="q")
    restored = again.restore()
    assert restored is not None and restored.checkpoint == 5
    assert (tmp_path / "restored" / "sub" / "opt.bin").read_bytes() == b"o" * 5
    assert sorted(x.name for x in (tmp_path / "restored").iterdir()) == ["sub", "weights.bin"]


def test_snapshots_send_only_changed_files_and_collect_old_ones(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    store = FileStore(tmp_path / "store")
    ckpt = Checkpointer(store, "ck/", directory, tmp_path / "staging", job_id="j", placement_id="p")
    (directory / "frozen.bin").write_bytes(b"f" * 100)
    for step in range(1, 5):
        (directory / "state.bin").write_bytes(bytes([step]) * 50)
        ckpt.snapshot(p.Progress(step, 10, step))
    objects = store.list("ck/data/")
    # frozen.bin once, and state.bin of the last two snapshots only (older ones collected)
    assert len(objects) == 3
    corrupt = store.list("ck/data/")[0]
    store.put(corrupt, b"bit rot")
    with pytest.raises(CheckpointError, match=r"does not match|missing"):
        Checkpointer(store, "ck/", tmp_path / "r", tmp_path / "s2", job_id="j", placement_id="q").restore()


# ---------------------------------------------------------------------------------------------------- redaction


def test_redaction_catches_values_split_across_reads() -> None:
    redactor = Redactor(["hunter2-secret", "xy"])  # too short to mask without wrecking the log
    stream = b"pw=hunter2-secret ok; again hunter2-sec" + b"ret; partial hunter2 end; xy"
    out = b""
    for i in range(0, len(stream), 5):
        out += redactor.feed(stream[i : i + 5])
    out += redactor.flush()
    assert out == b"pw=[redacted] ok; again [redacted]; partial hunter2 end; xy"


class _DownStore(FileStore):
    down = True

    def put(self, key: str, data: bytes, *, content_type: str = "application/octet-stream") -> None:
        if self.down:
            raise StoreError("the store is down")
        super().put(key, data)


def test_the_log_spool_is_bounded_and_says_what_it_dropped(tmp_path: Path) -> None:
    store = _DownStore(tmp_path / "store")
    shipper = LogShipper(store, "logs/", tmp_path / "spool", flush_seconds=60, chunk_bytes=1000, spool_limit=5000)
    for i in range(20):
        shipper.write(f"{i:04d}".encode() * 250)  # 1000 bytes each: one chunk per write
    assert shipper.dropped_bytes >= 15000
    store.down = False
    assert shipper.close(timeout=20)
    names = store.list("logs/")
    assert [p.parse_log_chunk_name(n.removeprefix("logs/")) for n in names] == [i * 1000 for i in range(20)]
    first, last = store.get(names[0]) or b"", store.get(names[-1]) or b""
    assert first.startswith(b"[overspill-agent] dropped 1000 bytes") and last == b"0019" * 250


def test_report_seq_only_grows_across_an_agent_restart(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    first = Reporter(placement_id="pl", key_hex=KEY, store=store, mailbox_prefix="mb/", spool_dir=tmp_path / "spool")
    a = first.send(p.ReportKind.STARTED)
    b = first.send(p.ReportKind.HEARTBEAT)
    assert first.close(5)
    (tmp_path / "spool" / "seq").write_text(str(b.seq + 10**9))  # as if the clock had been ahead before a restart
    second = Reporter(placement_id="pl", key_hex=KEY, store=store, mailbox_prefix="mb/", spool_dir=tmp_path / "spool")
    c = second.send(p.ReportKind.HEARTBEAT)
    assert second.close(5)
    assert a.seq < b.seq < c.seq and c.seq > b.seq + 10**9
    assert [n.split("-")[1] for n in store.list("mb/")] == sorted(n.split("-")[1] for n in store.list("mb/"))


# -------------------------------------------------------------------------------------------------- runtime


def test_environment_names_and_values_are_checked() -> None:
    check_env({"OK_1": "a b\tc"}, container=True)
    for env in ({"A=B": "x"}, {"1X": "x"}, {"X": "a\0b"}):
        with pytest.raises(LaunchError) as err:
            check_env(env, container=False)
        assert err.value.outcome is p.Outcome.USER_FAILED
    with pytest.raises(LaunchError, match="line break"):
        check_env({"PEM": "-----BEGIN\nKEY"}, container=True)
    check_env({"PEM": "-----BEGIN\nKEY"}, container=False)


def test_container_command_line_holds_no_environment_value(tmp_path: Path) -> None:
    launch = Launch(
        name="ovs-pl", command=["python", "t.py"], env={"DB": "hunter2-secret"}, checkpoint_dir=tmp_path / "c",
        run_dir=tmp_path / "r", private_dir=tmp_path, gpu_count=2, image="img:1", shm_size_gb="0.5",
    )  # fmt: skip
    podman = ContainerWorkload("podman", launch, ["0", "1"]).create_args(tmp_path / "env")
    docker = ContainerWorkload("/usr/bin/docker", launch, ["0", "1"]).create_args(tmp_path / "env")
    assert "hunter2-secret" not in " ".join(podman + docker)
    assert podman[-3:] == ["img:1", "python", "t.py"] and "--shm-size=512m" in podman and "--ipc=host" not in podman
    assert podman.count("--device") == 2 and "nvidia.com/gpu=1" in podman
    assert docker[docker.index("--gpus") + 1] == '"device=0,1"'
    no_gpu = ContainerWorkload("podman", replace(launch, shm_size_gb=None), []).create_args(tmp_path / "env")
    assert "--ipc=host" in no_gpu and "--gpus" not in no_gpu and "--device" not in no_gpu


# -------------------------------------------------------------------------------------------------- notices


def _watch(source: p.NoticeSource, metadata: MetadataServer) -> tuple[NoticeWatcher, list[p.Notice], threading.Event]:
    seen: list[p.Notice] = []
    got = threading.Event()

    def on_notice(notice: p.Notice) -> None:
        seen.append(notice)
        got.set()

    watcher = NoticeWatcher(source, Identities({"OVERSPILL_METADATA_URL": metadata.url}), on_notice, poll_seconds=0.1)
    watcher.start()
    return watcher, seen, got


def test_aws_notices_from_imdsv2(metadata: MetadataServer) -> None:
    watcher, seen, got = _watch(p.NoticeSource.AWS, metadata)
    try:
        time.sleep(0.3)
        assert seen == [] and metadata.hits["PUT /latest/api/token"] >= 1
        metadata.issue_aws_rebalance()
        assert got.wait(10) and seen[0].kind == "rebalance" and seen[0].deadline is None
        got.clear()
        metadata.issue_aws_interruption(in_seconds=120)
        assert got.wait(10)
        deadline = datetime.fromisoformat(seen[1].deadline.replace("Z", "+00:00"))  # type: ignore[union-attr]
        assert seen[1].kind == "preempt" and timedelta(seconds=110) < deadline - datetime.now(UTC) < timedelta(
            seconds=121
        )
        time.sleep(0.3)
        assert len(seen) == 2  # each notice once
    finally:
        watcher.stop()


def test_gcp_notice_arrives_through_the_long_poll(metadata: MetadataServer) -> None:
    watcher, seen, got = _watch(p.NoticeSource.GCP, metadata)
    watcher.poll = 30.0  # no polling: only wait_for_change can bring it quickly
    try:
        time.sleep(0.3)
        metadata.issue_gcp_preemption()
        assert got.wait(15), "the watcher polls every 30 s: only the long poll can bring the notice this soon"
        assert seen[0].kind == "preempt" and seen[0].deadline
    finally:
        watcher.stop()


def test_azure_preempt_for_this_vm_only_and_acknowledged(metadata: MetadataServer) -> None:
    watcher, seen, got = _watch(p.NoticeSource.AZURE, metadata)
    try:
        metadata.issue_azure_preempt(resources=["another-vm"])
        time.sleep(0.5)
        assert seen == []
        event_id = metadata.issue_azure_preempt(not_before_seconds=30)
        assert got.wait(10) and seen[0].kind == "preempt"
        watcher.acknowledge()
        assert metadata.acknowledged == [event_id]
    finally:
        watcher.stop()


# ---------------------------------------------------------------------------------------------------- wheel


def test_the_agent_imports_only_the_standard_library() -> None:
    for path in AGENT_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top == "agent" or top in sys.stdlib_module_names or top == "__future__", f"{path.name}: {name}"


def test_the_wheel_is_reproducible_and_complete(tmp_path: Path) -> None:
    one, digest_one = build_wheel(tmp_path / "a")
    _, digest_two = build_wheel(tmp_path / "b")
    assert digest_one == digest_two
    names = zipfile.ZipFile(one).namelist()
    assert {f"agent/{f.name}" for f in AGENT_DIR.glob("*.py")} <= set(names)
    assert any(n.endswith(".dist-info/RECORD") for n in names)


# ------------------------------------------------------------------------------------------ start-up script, CLI


def _tool_dir(path: Path) -> str:
    """A PATH with just what the script uses (python3 as this interpreter; no systemd-run)."""
    path.mkdir()
    (path / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (path / "python3").chmod(0o755)
    for tool in ("sh", "mkdir", "setsid", "nohup"):
        (path / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    return str(path)


def test_the_start_up_script_fetches_the_pinned_wheel_and_runs_the_agent(tmp_path: Path) -> None:
    from tests.agent_harness import FileReader, final_report, make_spec, publish_spec

    wheel, digest = build_wheel(tmp_path / "dist")
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader, env={"TRAIN_STEPS": "5"})
    script = startup_script(
        wheel_url=f"file://{wheel}", wheel_sha256=digest, spec_uri=publish_spec(reader, spec),
        root=str(tmp_path / "root"), env={"OVERSPILL_METADATA_URL": "http://127.0.0.1:9"},
        agent_args=("--log-flush-seconds", "0.2"),
    )  # fmt: skip
    assert spec.report_key not in script
    env = {"PATH": _tool_dir(tmp_path / "bin"), "HOME": str(tmp_path)}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_for_final = time.monotonic() + 60
    while not reader.list("mailbox/") or not any(k.endswith("-final.json") for k in reader.list("mailbox/")):
        assert time.monotonic() < wait_for_final, (tmp_path / "root" / "agent.log").read_text()
        time.sleep(0.2)
    assert final_report(reader, spec).outcome is p.Outcome.SUCCEEDED
    assert (tmp_path / "root" / f"overspill_agent-{digest[:16]}.whl").read_bytes() == wheel.read_bytes()
    # a wheel that does not match its digest is refused, and nothing runs
    bad = startup_script(wheel_url=f"file://{wheel}", wheel_sha256="0" * 64, spec_uri="file:///nowhere/spec.json",
                         root=str(tmp_path / "root2"))  # fmt: skip
    done = subprocess.run(["sh", "-c", bad], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "does not match its SHA-256" in done.stderr
    with pytest.raises(ValueError):
        startup_script(wheel_url="x", wheel_sha256=digest, spec_uri="x", env={"BAD NAME": "x"})


def test_overspill_agent_subcommand_runs_the_agent(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from broker.cli.main import app

    result = CliRunner().invoke(app, ["agent", "build-wheel", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(list(tmp_path.glob("overspill_agent-*.whl"))) == 1
