"""The instance agent on the old system Pythons of cloud GPU images: Ubuntu 20.04 (3.8), Amazon Linux 2023 and
Debian 11 / GCP Deep Learning VM images (3.9), Ubuntu 22.04 (3.10). The rest of the project needs 3.11; the agent's
floor is 3.8 (agent/compat.py holds what it uses from newer standard libraries).

For each interpreter of those found (`python3.X` on PATH, pyenv's versions directory, and any listed in
`OVERSPILL_AGENT_PYTHONS`, os.pathsep-separated, which .ci/run sets when it had to install one), the agent's built
wheel, on `PYTHONPATH` alone as instances run it:

- answers `python -m agent --help`; every module in it byte-compiles (`compileall`) and imports with no site
  packages (`-S`): standard library only, and nothing newer than that interpreter's;
- computes the same wire bytes as 3.11 (spec, signed report, mailbox and log names, progress parsing, timestamps);
- runs one real attempt of the numpy training job with the process runtime and a file store to `succeeded`, and
  one that an AWS interruption notice (tests/metadata_server.py) preempts after a checkpoint, with signed reports
  in the mailbox that 3.11 re-serializes to the same bytes.

With no old interpreter found the tests skip, which fails CI (OVERSPILL_REQUIRE_INTEGRATION=1): .ci/run makes sure
there is one.
"""

from __future__ import annotations

import enum
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from agent import compat, net
from agent import protocol as p
from tests.agent_harness import (
    EVERY,
    STEPS,
    FileReader,
    agent_env,
    checkpoint_file,
    final_report,
    log_chunks,
    log_text,
    make_spec,
    manifest,
    publish_spec,
    reports,
    start_agent,
    wait_for,
)
from tests.local_server import LocalServer
from tests.metadata_server import MetadataServer

pytest_plugins = ["tests.agent_fixtures"]

OLD_VERSIONS = ("3.8", "3.9", "3.10")
ENV_PYTHONS = "OVERSPILL_AGENT_PYTHONS"


def _version_of(python: str) -> str | None:
    """ "X.Y" of the interpreter at `python`, or None when it does not run (e.g. a pyenv shim for a version pyenv
    has not activated)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@lru_cache(maxsize=1)
def old_pythons() -> tuple[tuple[str, str], ...]:
    """(version, path) of the first working interpreter found for each of OLD_VERSIONS."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    listed = [c for c in os.environ.get(ENV_PYTHONS, "").split(os.pathsep) if c]
    found: dict[str, str] = {}
    for version in OLD_VERSIONS:
        candidates = [*listed, shutil.which(f"python{version}") or ""]
        candidates += sorted(glob.glob(str(pyenv / f"{version}.*" / "bin" / "python3")), reverse=True)
        for candidate in candidates:
            if candidate and _version_of(candidate) == version:
                found[version] = candidate
                break
    return tuple(found.items())


def _params() -> list[object]:
    found = old_pythons()
    if not found:
        reason = f"no Python {', '.join(OLD_VERSIONS)} found (PATH, pyenv, ${ENV_PYTHONS}); .ci/run installs one"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none")]
    return [pytest.param(path, id=f"python{version}") for version, path in found]


old_python = pytest.mark.parametrize("python", _params())


def _run_old(python: str, args: list[str], wheel: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `python args...` with the wheel as its only addition to sys.path, outside the repository."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(wheel), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([python, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------- compat, on this Python


class _Colour(compat.StrEnum):
    RED = "red"


class _Reference(enum.StrEnum):
    RED = "red"


def test_the_str_enum_stand_in_behaves_as_enum_strenum() -> None:
    for member in (_Colour.RED, _Reference.RED):
        assert member == "red" and hash(member) == hash("red") and isinstance(member, str)
        assert (str(member), f"{member}", f"{member:>5}", "%s" % member) == ("red", "red", "  red", "red")  # noqa: UP031
        assert json.dumps({"c": member, member: 1}) == '{"c": "red", "red": 1}'
        assert type(member)("red") is member and member.value == "red"
    assert p.Outcome.SUCCEEDED == "succeeded" and str(p.ReportKind.FINAL) == "final"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-02T08:00:00Z", datetime(2026, 11, 2, 8, tzinfo=UTC)),
        ("2026-11-02T08:00:00.123Z", datetime(2026, 11, 2, 8, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-02T08:00:00.5Z", datetime(2026, 11, 2, 8, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-02T08:00:00.123456789Z", datetime(2026, 11, 2, 8, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-02T08:00:00+0200", datetime(2026, 11, 2, 8, tzinfo=timezone(timedelta(hours=2)))),
        ("2026-11-02 08:00:00-05:30", datetime(2026, 11, 2, 8, tzinfo=timezone(-timedelta(hours=5, minutes=30)))),
        ("2026-11-02T08:00:00", datetime(2026, 11, 2, 8)),
    ],
)
def test_parse_iso8601_reads_what_providers_send(text: str, expected: datetime) -> None:
    assert compat.parse_iso8601(text) == expected
    assert compat.parse_iso8601(text).utcoffset() == expected.utcoffset()
    assert compat.parse_iso8601(text) == datetime.fromisoformat(text)  # 3.11's reading


@pytest.mark.parametrize("text", ["", "tomorrow", "2026-11-02T08:00:00Zulu", "2026-13-02T08:00:00Z"])
def test_parse_iso8601_refuses_what_is_not_a_timestamp(text: str) -> None:
    with pytest.raises(ValueError):
        compat.parse_iso8601(text)


class _RecordingReader(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, n: int | None = -1) -> bytes:
        self.asked.append(-1 if n is None else n)
        return super().read(n)


@pytest.mark.parametrize("limit", [1, net.READ_PIECE, 3 * net.READ_PIECE, 64 * net.READ_PIECE + 1])
def test_read_at_most_reads_in_bounded_pieces(limit: int) -> None:
    """Python 3.8/3.9's HTTPResponse.read(n) zero-fills n bytes up front: never ask for more than a piece."""
    data = bytes(range(256)) * (10 * 1024)  # 2.5 MiB
    fp = _RecordingReader(data)
    assert net.read_at_most(fp, limit) == data[:limit]
    assert fp.asked and max(fp.asked) <= net.READ_PIECE and min(fp.asked) > 0


class _Blob(LocalServer):
    def __init__(self, body: bytes) -> None:
        self.body = body

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._serve(Handler)


def test_net_request_reads_whole_answers_and_refuses_oversized_ones() -> None:
    body = os.urandom(2 * net.READ_PIECE + 123)
    with _Blob(body) as server:
        assert net.request("GET", server.url + "/x", direct=True).body == body
        assert net.request("GET", server.url + "/x", direct=True, max_bytes=len(body)).body == body
        with pytest.raises(net.HTTPStatusError, match="answer over"):
            net.request("GET", server.url + "/x", direct=True, max_bytes=len(body) - 1)


# ---------------------------------------------------------------------------------- under the old interpreters

# Prints, as one JSON document, what the agent computes for the wire: run under 3.11 and an old Python, the two
# outputs must be identical.
_WIRE_PROBE = r"""
import json, sys
from agent import compat, protocol as p

spec = p.AttemptSpec(
    job_id="job1", placement_id="pl1", tenant="acme", command=("python", "train.py"), runtime=p.Runtime.PODMAN,
    checkpoint=p.CheckpointSpec("s3://b/c/", resume=True), logs_uri="s3://b/l/", mailbox_uri="s3://b/m/",
    report_key="5e" * 32, image="img:1", env={"A": "1"},
    secrets=(p.SecretRef("DB", p.SecretSource.AWS_SECRETS_MANAGER, "arn:x", "password"),),
    shm_size_gb="8", registry=p.RegistryAuth(p.RegistryAuthKind.ECR, "1.dkr.ecr.us-east-1.amazonaws.com"),
    notice=p.NoticeSpec(p.NoticeSource.AWS), callback_url="https://broker/v1/placements/pl1/reports",
)
assert p.AttemptSpec.from_json(spec.to_json()) == spec
report = p.Report(
    "pl1", 1700000000000001, p.ReportKind.FINAL, "2026-11-02T08:00:00.000Z", outcome=p.Outcome.PREEMPTED,
    exit_code=0, detail="d", progress=p.parse_progress(b'{"done": 3, "total": 4.5, "checkpoint": 2}'),
    checkpointed=0.25, notice=p.Notice(p.NoticeSource.AWS, "preempt", "2026-11-02T08:00:00Z", "2026-11-02T08:02:00Z"),
    log_tail="tail \u00e9",
).signed("5e" * 32)
assert p.Report.from_json(report.to_json()) == report and report.verify("5e" * 32)
md5 = compat.md5()
md5.update(b"abc")
times = ["2026-11-02T08:00:00Z", "2026-11-02T08:00:00.5Z", "2026-11-02T08:00:00.123456789+0100"]
print(json.dumps({
    "spec": spec.to_json().decode(),
    "report": report.to_json().decode(),
    "canonical": report.canonical().decode(),
    "mailbox": p.mailbox_entry_name(report),
    "parsed": p.parse_mailbox_entry_name(p.mailbox_entry_name(report)),
    "chunk": [p.log_chunk_name(12345), p.parse_log_chunk_name("0000000000012345.log")],
    "enums": [str(p.Outcome.SUCCEEDED), "%s" % p.Runtime.PROCESS, "{}".format(p.NoticeSource.GCP),
              p.Outcome.USER_FAILED == "user_failed", json.dumps([p.ReportKind.HEARTBEAT])],
    "times": [compat.parse_iso8601(t).isoformat() for t in times],
    "remove_prefix": [compat.remove_prefix("SIGUSR1", "SIG"), compat.remove_prefix("USR1", "SIG")],
    "md5": md5.hexdigest(),
}, sort_keys=True))
"""


@pytest.mark.integration
@old_python
def test_the_wheel_runs_help_compiles_and_imports_on_old_python(python: str, agent_wheel: Path, tmp_path: Path) -> None:
    done = _run_old(python, ["-m", "agent", "--help"], agent_wheel, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout and "build-wheel" in done.stdout
    done = _run_old(python, ["-m", "agent", "run", "--help"], agent_wheel, tmp_path)
    assert done.returncode == 0 and "--spec" in done.stdout, done.stderr

    # byte-compile every module of the wheel with this interpreter
    src = tmp_path / "src"
    with zipfile.ZipFile(agent_wheel) as whl:
        modules = sorted(n for n in whl.namelist() if n.startswith("agent/") and n.endswith(".py"))
        whl.extractall(src, members=modules)
    assert "agent/compat.py" in modules and "agent/main.py" in modules
    done = subprocess.run(
        [python, "-m", "compileall", "-q", "-f", str(src / "agent")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tag = _run_old(python, ["-c", "import sys; print(sys.implementation.cache_tag)"], agent_wheel, tmp_path)
    compiled = {f.name.split(".")[0] for f in (src / "agent" / "__pycache__").glob(f"*.{tag.stdout.strip()}.pyc")}
    assert compiled == {Path(m).stem for m in modules}

    # import every module from the wheel, with no site-packages at all: standard library only
    names = [f"agent.{Path(m).stem}" for m in modules if not m.endswith("__main__.py")]
    script = (
        "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\nprint('ok', len(sys.argv) - 1)"
    )
    done = _run_old(python, ["-S", "-c", script, *names], agent_wheel, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ok {len(names)}"


@pytest.mark.integration
@old_python
def test_the_wire_bytes_are_the_same_on_old_python(python: str, agent_wheel: Path, tmp_path: Path) -> None:
    old = _run_old(python, ["-S", "-c", _WIRE_PROBE], agent_wheel, tmp_path)
    assert old.returncode == 0, old.stderr
    new = _run_old(sys.executable, ["-S", "-c", _WIRE_PROBE], agent_wheel, tmp_path)
    assert new.returncode == 0, new.stderr
    assert json.loads(old.stdout) == json.loads(new.stdout)
    assert old.stdout == new.stdout


def _assert_mailbox_bytes_round_trip(reader: FileReader, spec: p.AttemptSpec) -> None:
    """What the old agent wrote to the mailbox is what 3.11 writes for the same report, byte for byte."""
    prefix = "mailbox/acme/"
    entries = reader.list(prefix + spec.placement_id + "-")
    assert entries
    for key in entries:
        data = reader.get(key)
        assert data is not None and data == p.Report.from_json(data).to_json(), key


@pytest.mark.integration
@old_python
def test_an_attempt_succeeds_with_the_agent_on_old_python(python: str, agent_wheel: Path, tmp_path: Path) -> None:
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader, env={"TRAIN_STEPS": str(2 * EVERY)})
    run = start_agent(publish_spec(reader, spec), spec, tmp_path / "work", agent_env(agent_wheel), python=python)
    assert run.wait(90) == 0, run.stderr()
    final = final_report(reader, spec)
    assert (final.outcome, final.exit_code) == (p.Outcome.SUCCEEDED, 0), final.detail
    assert final.progress == p.Progress(2 * EVERY, 2 * EVERY, 2 * EVERY) and final.checkpointed == 1.0
    kinds = [r.kind for r in reports(reader, spec)]
    assert kinds[0] is p.ReportKind.STARTED and kinds[-1] is p.ReportKind.FINAL and p.ReportKind.PROGRESS in kinds
    _assert_mailbox_bytes_round_trip(reader, spec)
    steps = [line for line in log_text(reader, spec).splitlines() if line.startswith("step ") and "loss" in line]
    assert len(steps) == 2 * EVERY
    assert manifest(reader, spec).checkpoint == 2 * EVERY and checkpoint_file(reader, spec, "final.npy")
    assert p.AttemptSpec.from_json((run.work_dir / "agent" / p.SPEC_NAME).read_bytes()) == spec


@pytest.mark.integration
@old_python
def test_an_aws_notice_preempts_the_agent_on_old_python(
    python: str, agent_wheel: Path, metadata: MetadataServer, tmp_path: Path
) -> None:
    reader = FileReader(tmp_path / "store")
    spec = make_spec(reader, notice=p.NoticeSpec(p.NoticeSource.AWS), env={"TRAIN_STEP_SECONDS": "0.02"})
    env = agent_env(agent_wheel, {"OVERSPILL_METADATA_URL": metadata.url})
    run = start_agent(publish_spec(reader, spec), spec, tmp_path / "work", env, "--notice-poll-seconds", "0.3",
                      python=python)  # fmt: skip

    def step_20_logged() -> bool:
        return "step 20 loss" in b"".join(d for _, d in log_chunks(reader, spec)).decode(errors="replace")

    wait_for(step_20_logged, 30, "step 20 in the stored log")
    metadata.issue_aws_interruption(in_seconds=120)
    assert run.wait(60) == 0, run.stderr()
    final = final_report(reader, spec)
    assert final.outcome is p.Outcome.PREEMPTED, final.detail
    assert final.notice is not None and final.notice.source is p.NoticeSource.AWS and final.notice.deadline
    deadline = compat.parse_iso8601(final.notice.deadline)
    assert timedelta(seconds=60) < deadline - datetime.now(UTC) < timedelta(seconds=121)
    saved = manifest(reader, spec)
    assert saved is not None and saved.checkpoint >= 20 and final.checkpointed == saved.checkpoint / STEPS
    _assert_mailbox_bytes_round_trip(reader, spec)
