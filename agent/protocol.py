"""The contract between the broker and the instance agent: the attempt spec, the workload's files, the reports and
how reports are signed. Standard library only: the broker, the agent and tests all import this one module.

One job attempt (a placement) runs under one agent process on one instance:

1. The broker writes the attempt's `AttemptSpec` as JSON to `<attempt prefix>spec.json` in the job's checkpoint
   store before it launches the instance, and gives the instance only that URI (in its start-up script). The agent
   reads it, keeps it in memory and in a root-only file outside anything the workload can see, and deletes the
   remote copy before the workload starts: the workload never sees the spec (its `report_key` signs reports).
2. The workload gets a checkpoint directory, a progress file and a notice file (environment variables
   `OVERSPILL_CHECKPOINT_DIR`, `OVERSPILL_PROGRESS_FILE`, `OVERSPILL_NOTICE_FILE`), its own environment and
   secrets (resolved by the agent at start, never stored by the broker), `OVERSPILL_RESUME=1` when the directory
   was filled from an earlier attempt's checkpoint, and `OVERSPILL_JOB_ID` / `OVERSPILL_CHECKPOINT_INTERVAL_SECONDS`.
   It needs no cloud credentials: the agent moves checkpoints between the directory and the store.
3. Workload -> agent, the progress file (`ProgressFile`): a JSON object the workload replaces atomically (write a
   temporary file, rename it over) whenever it likes, e.g. `{"done": 1200, "total": 5000, "checkpoint": 1000}`:
   `done` units of work of the whole job are finished out of `total` (any unit: steps, samples), and the files in
   the checkpoint directory hold the state after `checkpoint` units. When `checkpoint` grows, the agent snapshots
   the directory and uploads it (`MANIFEST.json` last, so a half-uploaded checkpoint is never used), then reports
   it. Checkpoint files must be written atomically too (temporary file + rename).
4. Agent -> workload, a notice (`Notice`): when the provider announces an interruption, the agent writes the
   notice file and sends the configured signal (default SIGUSR1) to the workload, then waits until the workload
   reports a new checkpoint or the notice's deadline nears, uploads it and reports `preempted`.
5. Agent -> broker, reports (`Report`): signed JSON objects written to the tenant's mailbox in the store
   (`mailbox_entry_name`), read and deleted by the broker's sync step, and also POSTed to `callback_url` when the
   broker has one. Every report carries the placement id and a sequence number that only grows, so the broker
   applies each once whichever path brings it first. Kinds: `started`, `heartbeat`, `progress` (with the durable
   checkpoint), `notice`, `final` (with the `Outcome`, exit code, and the log tail).
6. Logs: the workload's stdout and stderr, merged in arrival order, go to `<attempt prefix>logs/` as chunks named
   by their byte offset in the stream (`log_chunk_name`), so a reader concatenates them in name order and can
   start at any offset.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.bounded import HostileInput, finite, load_json
from agent.compat import StrEnum

PROTOCOL_VERSION = 1

SPEC_NAME = "spec.json"
LOGS_DIR = "logs/"
MANIFEST_NAME = "MANIFEST.json"

ENV_CHECKPOINT_DIR = "OVERSPILL_CHECKPOINT_DIR"
ENV_PROGRESS_FILE = "OVERSPILL_PROGRESS_FILE"
ENV_NOTICE_FILE = "OVERSPILL_NOTICE_FILE"
ENV_RESUME = "OVERSPILL_RESUME"
ENV_JOB_ID = "OVERSPILL_JOB_ID"
ENV_CHECKPOINT_INTERVAL = "OVERSPILL_CHECKPOINT_INTERVAL_SECONDS"


class ProtocolError(ValueError):
    """A spec, report or file that does not follow this contract; the message names the field."""


class Outcome(StrEnum):
    """How an attempt ended, as the agent classifies it.

    succeeded: the workload exited 0. user_failed: the workload itself failed (non-zero exit, killed by its own
    signal, a command that does not exist in its image): final for the job. infra_failed: the attempt could not run
    through no fault of the workload (image pull or registry login failed after retries, no GPU driver, the
    container runtime failed, the checkpoint could not be restored): retried elsewhere. preempted: the provider
    took the instance back (a notice came, or the OS shut down under the workload).
    """

    SUCCEEDED = "succeeded"
    USER_FAILED = "user_failed"
    INFRA_FAILED = "infra_failed"
    PREEMPTED = "preempted"


class ReportKind(StrEnum):
    STARTED = "started"
    HEARTBEAT = "heartbeat"
    PROGRESS = "progress"
    NOTICE = "notice"
    FINAL = "final"


class Runtime(StrEnum):
    """How the agent runs the workload: a container (`docker`, `podman`) or a plain process (`process`: bare metal,
    Slurm nodes, tests)."""

    DOCKER = "docker"
    PODMAN = "podman"
    PROCESS = "process"


class NoticeSource(StrEnum):
    """Which provider's interruption notice the agent watches."""

    AWS = "aws"  # IMDSv2 spot/instance-action and events/recommendations/rebalance
    GCP = "gcp"  # metadata instance/preempted?wait_for_change=true
    AZURE = "azure"  # Scheduled Events, Preempt (acknowledged)
    NONE = "none"


class SecretSource(StrEnum):
    AWS_SECRETS_MANAGER = "aws-secretsmanager"  # ref: secret ARN or name
    GCP_SECRET_MANAGER = "gcp-secretmanager"  # ref: projects/<p>/secrets/<s>[/versions/<v>]
    AZURE_KEY_VAULT = "azure-keyvault"  # ref: https://<vault>.vault.azure.net/secrets/<name>[/<version>]


class RegistryAuthKind(StrEnum):
    NONE = "none"
    ECR = "ecr"  # the instance role's ECR authorization token
    GCP = "gcp"  # Artifact Registry / GCR with the metadata server's access token (user oauth2accesstoken)
    ACR = "acr"  # Azure Container Registry through the managed identity (AAD token exchanged for an ACR token)
    SECRET = "secret"  # a named secret holding {"username": ..., "password": ...}


@dataclass(frozen=True)
class SecretRef:
    """One secret the workload receives as environment variable `env`: a reference, never the value."""

    env: str
    source: SecretSource
    ref: str
    field: str | None = None  # for a JSON secret: the key whose value to use


@dataclass(frozen=True)
class RegistryAuth:
    kind: RegistryAuthKind = RegistryAuthKind.NONE
    server: str = ""  # e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com, europe-docker.pkg.dev, acme.azurecr.io
    secret: SecretRef | None = None  # for kind=secret


@dataclass(frozen=True)
class CheckpointSpec:
    """Where the job's checkpoint lives (a store prefix ending in `/`), and whether to restore it first."""

    uri: str
    resume: bool = False
    interval_seconds: int = 1800


@dataclass(frozen=True)
class NoticeSpec:
    source: NoticeSource = NoticeSource.NONE
    signal: str = "SIGUSR1"  # sent to the workload on a notice
    # how long before the provider's deadline the agent stops waiting for the workload's checkpoint and uploads
    upload_reserve_seconds: int = 20


@dataclass(frozen=True)
class AttemptSpec:
    """Everything the agent needs to run one attempt. Built by the broker, read by the agent; see module doc."""

    job_id: str
    placement_id: str
    tenant: str
    command: tuple[str, ...]
    runtime: Runtime
    checkpoint: CheckpointSpec
    logs_uri: str  # the attempt's log prefix, ending in `/`
    mailbox_uri: str  # the tenant's mailbox prefix, ending in `/`
    report_key: str  # hex HMAC-SHA256 key that signs this attempt's reports
    image: str = ""  # empty for the process runtime
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[SecretRef, ...] = ()
    gpu_count: int = 0
    shm_size_gb: str | None = None  # None: share the host's IPC namespace (--ipc=host)
    registry: RegistryAuth = field(default_factory=RegistryAuth)
    notice: NoticeSpec = field(default_factory=NoticeSpec)
    callback_url: str | None = None  # https://<broker>/v1/placements/<id>/reports, when the broker has a public URL
    heartbeat_seconds: int = 600
    version: int = PROTOCOL_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> AttemptSpec:
        """Parse and check a spec; raises ProtocolError naming the bad field."""
        try:
            raw = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"spec is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ProtocolError("spec must be a JSON object")
        if raw.get("version") != PROTOCOL_VERSION:
            raise ProtocolError(f"spec.version {raw.get('version')!r} is not {PROTOCOL_VERSION}")
        try:
            secrets = tuple(
                SecretRef(s["env"], SecretSource(s["source"]), s["ref"], s.get("field")) for s in raw.get("secrets", ())
            )
            reg = raw.get("registry") or {}
            reg_secret = reg.get("secret")
            registry = RegistryAuth(
                RegistryAuthKind(reg.get("kind", "none")),
                reg.get("server", ""),
                SecretRef(
                    reg_secret["env"], SecretSource(reg_secret["source"]), reg_secret["ref"], reg_secret.get("field")
                )
                if reg_secret
                else None,
            )
            notice = raw.get("notice") or {}
            spec = cls(
                job_id=str(raw["job_id"]),
                placement_id=str(raw["placement_id"]),
                tenant=str(raw["tenant"]),
                command=tuple(str(c) for c in raw["command"]),
                runtime=Runtime(raw["runtime"]),
                checkpoint=CheckpointSpec(**raw["checkpoint"]),
                logs_uri=str(raw["logs_uri"]),
                mailbox_uri=str(raw["mailbox_uri"]),
                report_key=str(raw["report_key"]),
                image=str(raw.get("image", "")),
                env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
                secrets=secrets,
                gpu_count=int(raw.get("gpu_count", 0)),
                shm_size_gb=raw.get("shm_size_gb"),
                registry=registry,
                notice=NoticeSpec(
                    NoticeSource(notice.get("source", "none")),
                    str(notice.get("signal", "SIGUSR1")),
                    int(notice.get("upload_reserve_seconds", 20)),
                ),
                callback_url=raw.get("callback_url"),
                heartbeat_seconds=int(raw.get("heartbeat_seconds", 600)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"spec field missing or invalid: {exc}") from exc
        for name in ("logs_uri", "mailbox_uri"):
            if not getattr(spec, name).endswith("/"):
                raise ProtocolError(f"spec.{name} must end with '/'")
        if spec.runtime is not Runtime.PROCESS and not spec.image:
            raise ProtocolError(f"spec.image is required with the {spec.runtime} runtime")
        if not spec.command and spec.runtime is Runtime.PROCESS:
            raise ProtocolError("spec.command is required with the process runtime")
        return spec


@dataclass(frozen=True)
class Progress:
    """What the workload last wrote to its progress file: `done` and `checkpoint` units of `total`."""

    done: float
    total: float
    checkpoint: float | None = None

    @property
    def fraction_done(self) -> float:
        return min(1.0, max(0.0, self.done / self.total)) if self.total > 0 else 0.0

    @property
    def fraction_checkpointed(self) -> float | None:
        if self.checkpoint is None or self.total <= 0:
            return None
        return min(1.0, max(0.0, self.checkpoint / self.total))


def parse_progress(data: bytes | str) -> Progress:
    """Read a progress file's content; raises ProtocolError naming the bad field (the agent then ignores it)."""
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"progress file is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProtocolError("progress file must hold a JSON object")
    values: dict[str, float | None] = {}
    for name in ("done", "total", "checkpoint"):
        v = raw.get(name)
        if v is None and name == "checkpoint":
            values[name] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
            raise ProtocolError(f"progress.{name} must be a finite number")
        if v < 0:
            raise ProtocolError(f"progress.{name} must not be negative")
        values[name] = float(v)
    done, total = values["done"], values["total"]
    assert done is not None and total is not None
    return Progress(done=done, total=total, checkpoint=values["checkpoint"])


@dataclass(frozen=True)
class Notice:
    """An interruption notice as the agent hands it to the workload (the notice file) and to the broker."""

    source: NoticeSource
    kind: str  # "preempt" (the instance will stop at `deadline`) or "rebalance" (elevated risk, no deadline)
    received_at: str  # ISO 8601 UTC
    deadline: str | None = None  # ISO 8601 UTC, when the provider will stop the instance


@dataclass(frozen=True)
class Report:
    """One signed message from the agent to the broker. `seq` grows strictly for one placement (microseconds of
    the agent's clock, bumped past the previous one), so the broker can apply each report once."""

    placement_id: str
    seq: int
    kind: ReportKind
    at: str  # ISO 8601 UTC, the agent's clock
    outcome: Outcome | None = None  # final reports only
    exit_code: int | None = None
    detail: str = ""
    progress: Progress | None = None
    checkpointed: float | None = None  # fraction of the job's work held by the last durable checkpoint
    notice: Notice | None = None
    log_tail: str = ""
    signature: str = ""

    def signed(self, key_hex: str) -> Report:
        """This report with its signature set."""
        return _replace_signature(self, sign(key_hex, self.canonical()))

    def canonical(self) -> bytes:
        """The bytes the signature covers: every field but the signature, as sorted compact JSON."""
        body = asdict(self)
        body.pop("signature")
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str, *, max_bytes: int = 64 * 1024) -> Report:
        """Parse (not verify) a report; raises ProtocolError naming the field. Reports over `max_bytes` or nested
        deeper than a report ever is are refused before the parser sees them (`agent.bounded.load_json`); numbers
        must be finite and in range, text fields within their limits (kept as signed: the broker cleans what it
        stores, `agent.bounded.clean_text`)."""
        try:
            raw = load_json(data, source="report", max_bytes=max_bytes, max_depth=REPORT_MAX_DEPTH)
        except HostileInput as exc:
            raise ProtocolError(str(exc)) from None
        if not isinstance(raw, dict):
            raise ProtocolError("report must be a JSON object")
        try:
            progress = raw.get("progress")
            notice = raw.get("notice")
            return cls(
                placement_id=_text(raw["placement_id"], "report.placement_id", 64),
                seq=_integer(raw["seq"], "report.seq", 0, 2**63 - 1),
                kind=ReportKind(raw["kind"]),
                at=_text(raw["at"], "report.at", 64),
                outcome=Outcome(raw["outcome"]) if raw.get("outcome") is not None else None,
                exit_code=_integer(raw["exit_code"], "report.exit_code", -(2**31), 2**31 - 1)
                if raw.get("exit_code") is not None
                else None,
                detail=_text(raw.get("detail", ""), "report.detail", max_bytes),
                progress=_progress(progress) if progress is not None else None,
                checkpointed=_fraction(raw["checkpointed"]) if raw.get("checkpointed") is not None else None,
                notice=_notice(notice) if notice is not None else None,
                log_tail=_text(raw.get("log_tail", ""), "report.log_tail", max_bytes),
                signature=_text(raw.get("signature", ""), "report.signature", 128),
            )
        except ProtocolError:
            raise
        except HostileInput as exc:
            raise ProtocolError(str(exc)) from None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"report field missing or invalid: {exc}") from exc

    def verify(self, key_hex: str) -> bool:
        """True when the signature is this report's, made with `key_hex` (constant-time compare)."""
        return bool(self.signature) and hmac.compare_digest(self.signature, sign(key_hex, self.canonical()))


REPORT_MAX_DEPTH = 4  # a report is an object holding objects (progress, notice) of scalars


def _text(value: Any, field: str, max_chars: int) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ProtocolError(f"{field} must be a string")
    text = str(value)
    if len(text) > max_chars:
        raise ProtocolError(f"{field} is longer than {max_chars} characters")
    return text


def _integer(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ProtocolError(f"{field} must be an integer")
    number = int(value)
    if not lo <= number <= hi:
        raise ProtocolError(f"{field} {number} is outside [{lo}, {hi}]")
    return number


def _fraction(value: Any) -> float:
    """report.checkpointed as parsed (an int 1 stays 1, for the signature), finite and within [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("report.checkpointed must be a number")
    return finite(value, "report.checkpointed", 0, 1)  # type: ignore[no-any-return]


def _progress(raw: Any) -> Progress:
    if not isinstance(raw, dict):
        raise ProtocolError("report.progress must be an object")
    values: dict[str, Any] = {}  # kept as parsed (an int stays an int): the signature covers them re-serialised
    for name in ("done", "total", "checkpoint"):
        v = raw.get(name)
        if v is None and name == "checkpoint":
            values[name] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProtocolError(f"report.progress.{name} must be a number")
        values[name] = finite(v, f"report.progress.{name}", 0, 1e18)
    return Progress(done=values["done"], total=values["total"], checkpoint=values["checkpoint"])


def _notice(raw: Any) -> Notice:
    if not isinstance(raw, dict):
        raise ProtocolError("report.notice must be an object")
    deadline = raw.get("deadline")
    if deadline is not None and not isinstance(deadline, str):
        raise ProtocolError("report.notice.deadline must be an ISO 8601 string")
    return Notice(
        NoticeSource(raw["source"]),
        _text(raw["kind"], "report.notice.kind", 32),
        _text(raw["received_at"], "report.notice.received_at", 64),
        _text(deadline, "report.notice.deadline", 64) if deadline is not None else None,
    )


def _replace_signature(report: Report, signature: str) -> Report:
    values = asdict(report)
    values["signature"] = signature
    values["progress"] = report.progress
    values["notice"] = report.notice
    return Report(**values)


def sign(key_hex: str, payload: bytes) -> str:
    return hmac.new(bytes.fromhex(key_hex), payload, hashlib.sha256).hexdigest()


_MAILBOX_RE = re.compile(r"^(?P<placement>[A-Za-z0-9_]{1,40})-(?P<seq>[0-9]{20})-(?P<kind>[a-z]{1,16})\.json$")


def mailbox_entry_name(report: Report) -> str:
    """The object name of `report` inside the tenant's mailbox prefix: `<placement>-<seq, 20 digits>-<kind>.json`,
    so one placement's reports list in the order they were made."""
    return f"{report.placement_id}-{report.seq:020d}-{report.kind.value}.json"


def parse_mailbox_entry_name(name: str) -> tuple[str, int, str] | None:
    """(placement id, seq, kind) of a mailbox object name, or None for a name this contract never makes."""
    m = _MAILBOX_RE.match(name)
    return (m["placement"], int(m["seq"]), m["kind"]) if m else None


def log_chunk_name(offset: int) -> str:
    """The name, inside the attempt's log prefix, of the chunk that starts at byte `offset` of the log stream."""
    return f"{offset:016d}.log"


def parse_log_chunk_name(name: str) -> int | None:
    """The byte offset a log chunk name stands for, or None."""
    m = re.fullmatch(r"([0-9]{16})\.log", name)
    return int(m[1]) if m else None
