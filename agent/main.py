"""One attempt from start to final report: the agent's orchestration and its exit classification.

Order of work (each step's failure ends the attempt with the outcome in brackets):
1. Read the spec from `--spec`, keep a 0600 copy in the private directory, delete the remote object (best effort).
   Without a spec nothing can be reported: the agent exits 2.
2. Start the log shipper, the reporter and the notice watcher (a notice during the pull still counts).
3. Resolve the secrets [user_failed when missing or refused, infra_failed when the service does not answer], check
   the GPUs [infra_failed], log in to the registry and pull [infra_failed], restore the checkpoint when the spec asks
   [infra_failed].
4. Start the workload [user_failed for a command that cannot run, infra_failed for the runtime's own failure] and
   report `started`; then, until it exits: forward progress, snapshot the checkpoint whenever the progress file's
   `checkpoint` grows (reporting `progress` once durable), heartbeat every `heartbeat_seconds`.
5. On a `preempt` notice (or SIGTERM to the agent: the OS is shutting down, with `--sigterm-grace-seconds` left):
   write the notice file and send the workload the spec's signal at once (from the watcher's thread), report
   `notice`, wait until the workload reports a newer checkpoint or exits or the deadline minus
   `upload_reserve_seconds` comes, then stop it (SIGTERM, then SIGKILL) and upload the checkpoint.
   A `rebalance` notice only writes the notice file and signals (the workload may checkpoint early).
6. Classify (`classify`), upload the final checkpoint (succeeded, preempted), drain the log, send the `final`
   report with the last 4 KiB of the log, acknowledge Azure's event, and wait for the mailbox to take every report.

Exit classification: a notice or shutdown -> preempted; exit 0 -> succeeded (infra_failed instead if its final
checkpoint could not be stored); 125 from docker/podman -> infra_failed; anything else (126/127 included) ->
user_failed. The agent never reports succeeded unless the workload exited 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from agent import protocol as p
from agent.checkpoints import Checkpointer, CheckpointError, Manifest
from agent.compat import UTC, parse_iso8601
from agent.identity import Identities
from agent.logship import LogShipper, Redactor
from agent.notices import NoticeWatcher
from agent.registry import Client, RegistryError, login_for
from agent.reports import Reporter
from agent.runtime import (
    CONTAINER_CHECKPOINT_DIR,
    CONTAINER_RUN_DIR,
    Launch,
    LaunchError,
    Workload,
    make_workload,
    select_gpus,
)
from agent.secrets import SecretError, resolve
from agent.stores import StoreError, open_uri

log = logging.getLogger("overspill.agent")
PROGRESS_NAME = "progress.json"
NOTICE_NAME = "notice.json"
TAIL_BYTES = 4096
EXIT_REPORTED, EXIT_UNREPORTED, EXIT_NO_SPEC = 0, 1, 2
# `missing`: use an image the host's runtime already holds instead of pulling it (the local pool sets it: a user's
# own machine runs images built there, never pushed); unset: always pull, as on a fresh cloud instance
ENV_PULL_POLICY = "OVERSPILL_AGENT_PULL_POLICY"


class SpecUnavailable(Exception):
    """The spec could not be read or is invalid; nothing can be reported."""


@dataclass
class Options:
    spec_uri: str
    work_dir: Path
    log_flush_seconds: float = 5.0
    notice_poll_seconds: float | None = None
    retry_attempts: int = 5
    retry_base_seconds: float = 2.0
    spec_wait_seconds: float = 300.0
    sigterm_grace_seconds: float = 25.0
    stop_grace_seconds: float = 10.0
    drain_seconds: float = 600.0
    progress_poll_seconds: float = 0.5
    progress_report_seconds: float = 60.0
    runtime_binary: str | None = None


@dataclass
class Final:
    outcome: p.Outcome
    exit_code: int | None = None
    detail: str = ""


@dataclass
class _State:
    progress: p.Progress | None = None
    progress_stamp: tuple[int, int] | None = None
    preempt: p.Notice | None = None
    notices: list[p.Notice] = field(default_factory=list)
    signalled_at: list[float] = field(default_factory=list)
    # the workload's checkpoint when it was told of the preemption (-1: none yet): one after it is the notice's
    checkpoint_at_preempt: float | None = None


def classify(code: int, *, container: bool, preempted: bool) -> Final:
    """The outcome of a workload that exited with `code` (128+N for signal N)."""
    if preempted:
        return Final(p.Outcome.PREEMPTED, code, "the provider interrupted the instance")
    if code == 0:
        return Final(p.Outcome.SUCCEEDED, 0, "")
    if container and code == 125:
        return Final(p.Outcome.INFRA_FAILED, code, "the container runtime failed (exit 125)")
    if code == 126:
        return Final(p.Outcome.USER_FAILED, code, "the command could not be executed (exit 126)")
    if code == 127:
        return Final(p.Outcome.USER_FAILED, code, "the command was not found (exit 127)")
    if code > 128:
        return Final(p.Outcome.USER_FAILED, code, f"the workload was killed by signal {code - 128} (exit {code})")
    return Final(p.Outcome.USER_FAILED, code, f"the workload exited with {code}")


_NOT_FOUND = re.compile(r"command that was not found|executable file not found|failed to exec pid1: No such file")
_NOT_EXECUTABLE = re.compile(r"failed to exec pid1: Permission denied|permission denied: OCI permission denied")


def _exec_failure(final: Final, tail: str) -> Final:
    """A container whose command could not be executed: runc's start error (exit 125 from `start`) or the init's
    ("failed to exec pid1", exit 1) is the job's fault, like 126/127 from a shell."""
    if _NOT_FOUND.search(tail):
        return Final(p.Outcome.USER_FAILED, final.exit_code, "the command was not found in the image")
    if _NOT_EXECUTABLE.search(tail):
        return Final(p.Outcome.USER_FAILED, final.exit_code, "the command in the image is not executable")
    return final


def parse_signal(name: str) -> signal.Signals:
    name = name.upper()
    try:
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except KeyError:
        log.warning("unknown notice signal %r, using SIGUSR1", name)
        return signal.SIGUSR1


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


class Agent:
    def __init__(self, options: Options, env: Mapping[str, str] | None = None) -> None:
        self.opts = options
        self.env = os.environ if env is None else env
        self.identities = Identities(self.env)
        work = options.work_dir
        work.mkdir(parents=True, exist_ok=True)
        os.chmod(work, 0o700)
        self.private = work / "agent"
        self.private.mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.private, 0o700)
        self.checkpoint_dir = work / "checkpoint"
        self.run_dir = work / "run"
        self.state = _State()
        self._lock = threading.Lock()
        self._preempt_event = threading.Event()
        self._shutdown_at: float | None = None
        self.workload: Workload | None = None
        self.spec: p.AttemptSpec | None = None

    # --------------------------------------------------------------------------------------------------- spec

    def load_spec(self) -> p.AttemptSpec:
        local = self.private / p.SPEC_NAME
        try:
            store, key = open_uri(self.opts.spec_uri, self.identities, self.env)
        except ValueError as exc:
            raise SpecUnavailable(str(exc)) from None
        deadline = time.monotonic() + self.opts.spec_wait_seconds
        delay = 1.0
        while True:
            try:
                data = store.get(key, max_bytes=1024 * 1024)
                break
            except StoreError as exc:  # e.g. the instance role is not usable yet on a fresh instance
                if time.monotonic() + delay > deadline:
                    if local.exists():
                        data = None
                        break
                    raise SpecUnavailable(f"reading the spec: {exc}") from None
                log.warning("reading the spec failed, retrying in %.0fs: %s", delay, exc)
                time.sleep(delay)
                delay = min(30.0, delay * 2)
        if data is None:
            if not local.exists():
                raise SpecUnavailable(f"the spec {self.opts.spec_uri} does not exist")
            log.info("the spec is gone from the store; using the copy an earlier run of this agent kept")
            data = local.read_bytes()
        try:
            spec = p.AttemptSpec.from_json(data)
        except p.ProtocolError as exc:
            raise SpecUnavailable(str(exc)) from None
        if not local.exists():
            _write_atomic(local, data, 0o600)
        try:
            store.delete(key)
        except StoreError as exc:
            log.warning("could not delete the spec from the store (allow the instance to delete it): %s", exc)
        return spec

    # ---------------------------------------------------------------------------------------------------- run

    def run(self) -> int:
        try:
            spec = self.spec = self.load_spec()
        except SpecUnavailable as exc:
            log.error("no usable spec, nothing can be reported: %s", exc)
            return EXIT_NO_SPEC
        try:
            mailbox_store, mailbox_prefix = open_uri(spec.mailbox_uri, self.identities, self.env)
            log_store, log_prefix = open_uri(spec.logs_uri, self.identities, self.env)
            ckpt_store, ckpt_prefix = open_uri(spec.checkpoint.uri, self.identities, self.env)
        except ValueError as exc:
            log.error("the spec names a store the agent cannot use, nothing can be reported: %s", exc)
            return EXIT_NO_SPEC
        if not ckpt_prefix.endswith("/") and ckpt_prefix:
            ckpt_prefix += "/"
        self.redactor = Redactor()
        self.reporter = Reporter(
            placement_id=spec.placement_id,
            key_hex=spec.report_key,
            store=mailbox_store,
            mailbox_prefix=mailbox_prefix,
            spool_dir=self.private / "reports",
            callback_url=spec.callback_url,
        )
        self.logs = LogShipper(
            log_store,
            log_prefix,
            self.private / "logs",
            redactor=self.redactor,
            flush_seconds=self.opts.log_flush_seconds,
            tail_bytes=TAIL_BYTES,
        )
        self.checkpointer = Checkpointer(
            ckpt_store,
            ckpt_prefix,
            self.checkpoint_dir,
            self.private / "staging",
            job_id=spec.job_id,
            placement_id=spec.placement_id,
        )
        self.watcher = NoticeWatcher(
            spec.notice.source, self.identities, self._on_notice, poll_seconds=self.opts.notice_poll_seconds
        )
        self.notice_signal = parse_signal(spec.notice.signal)
        old = {s: signal.signal(s, self._on_shutdown) for s in (signal.SIGTERM, signal.SIGINT)}
        self.watcher.start()
        final = Final(p.Outcome.INFRA_FAILED, None, "the agent stopped before classifying the attempt")
        try:
            final = self._attempt(spec)
        except Exception as exc:  # the agent's own bug must still end in a report, never in silence
            log.exception("agent error")
            final = Final(p.Outcome.INFRA_FAILED, None, f"agent error: {type(exc).__name__}: {exc}")
        finally:
            if self.workload is not None:
                self.workload.cleanup()
            self.watcher.stop()
            for s, handler in old.items():
                signal.signal(s, handler)
        return self._finish(final)

    def _finish(self, final: Final) -> int:
        log.info("attempt ended: %s (exit %s) %s", final.outcome, final.exit_code, final.detail)
        self.logs.note(f"attempt ended: {final.outcome} (exit code {final.exit_code}) {final.detail}".rstrip())
        if not self.logs.close(timeout=min(60.0, self.opts.drain_seconds)):
            log.warning("the log could not all be stored (the rest stays in %s)", self.logs.spool)
        last = self.checkpointer.last
        self.reporter.send(
            p.ReportKind.FINAL,
            outcome=final.outcome,
            exit_code=final.exit_code,
            detail=final.detail[:2000],
            progress=self.state.progress,
            checkpointed=last.fraction_checkpointed if last else None,
            notice=self.state.preempt,
            log_tail=self.logs.tail(),
        )
        delivered = self.reporter.close(self.opts.drain_seconds)
        self.watcher.acknowledge()
        if not delivered:
            log.error("the mailbox did not take every report; they stay in %s", self.reporter.spool)
        return EXIT_REPORTED if delivered else EXIT_UNREPORTED

    # ------------------------------------------------------------------------------------------------ notices

    def _on_notice(self, notice: p.Notice) -> None:
        """Called from the watcher's thread: tell the workload at once, then the broker."""
        with self._lock:
            self.state.notices.append(notice)
            if notice.kind == "preempt" and self.state.preempt is None:
                self.state.preempt = notice
                # read before the signal: a workload that saves and exits at once must not have its checkpoint
                # taken for the one it had before (that race lost the note from the log)
                self.state.checkpoint_at_preempt = self._peek_checkpoint()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            body = json.dumps(
                {"source": notice.source.value, "kind": notice.kind, "received_at": notice.received_at,
                 "deadline": notice.deadline}
            ).encode()  # fmt: skip
            _write_atomic(self.run_dir / NOTICE_NAME, body)
        except OSError as exc:
            log.warning("could not write the notice file: %s", exc)
        workload = self.workload
        detail = "the workload has not started yet"
        if workload is not None:
            workload.signal(self.notice_signal)
            self.state.signalled_at.append(time.time())
            detail = f"the workload was sent {self.notice_signal.name}"
        self.reporter.send(p.ReportKind.NOTICE, notice=notice, progress=self.state.progress, detail=detail)
        self.logs.note(f"interruption notice from {notice.source}: {notice.kind}, deadline {notice.deadline}")
        if notice.kind == "preempt":
            self._preempt_event.set()

    def _on_shutdown(self, signum: int, _frame: object) -> None:
        if self._shutdown_at is None:
            self._shutdown_at = time.time()
            self._preempt_event.set()

    def _shutdown_notice(self) -> None:
        """Turn a SIGTERM to the agent into a preempt notice (outside the signal handler)."""
        assert self._shutdown_at is not None and self.spec is not None
        at = datetime.fromtimestamp(self._shutdown_at, UTC)
        deadline = datetime.fromtimestamp(self._shutdown_at + self.opts.sigterm_grace_seconds, UTC)
        iso = lambda d: d.isoformat(timespec="milliseconds").replace("+00:00", "Z")  # noqa: E731
        with self._lock:
            known = self.state.preempt is not None
        if not known:
            self._on_notice(p.Notice(self.spec.notice.source, "preempt", iso(at), iso(deadline)))

    # ---------------------------------------------------------------------------------------------- attempt

    def _attempt(self, spec: p.AttemptSpec) -> Final:
        container = spec.runtime is not p.Runtime.PROCESS
        self.logs.note(f"attempt {spec.placement_id} of job {spec.job_id} on the {spec.runtime} runtime")
        env: dict[str, str] = dict(spec.env)
        try:
            for ref in spec.secrets:
                value = resolve(ref, self.identities, self.env)
                self.redactor.add(value)
                env[ref.env] = value
        except SecretError as exc:
            return self._early(
                Final(p.Outcome.USER_FAILED if exc.user_fault else p.Outcome.INFRA_FAILED, None, str(exc))
            )
        try:
            gpus = select_gpus(spec.gpu_count, self.env)
        except LaunchError as exc:
            return self._early(Final(exc.outcome, None, exc.detail))
        auth_dir = self.private / "registry"
        auth_dir.mkdir(exist_ok=True, mode=0o700)
        binary = self.opts.runtime_binary or spec.runtime.value
        client = Client(binary, str(auth_dir), self.env, self.opts.retry_attempts, self.opts.retry_base_seconds)
        if container:
            try:
                login = login_for(
                    spec.registry, self.identities, lambda ref: resolve(ref, self.identities, self.env), self.env
                )
                if login is not None:
                    self.redactor.add(login.password)
                    self.logs.note(f"logging in to {login.server} as {login.username}")
                    client.login(login)
                try:
                    if self.env.get(ENV_PULL_POLICY) == "missing" and client.has_image(spec.image):
                        self.logs.note(f"using the local image {spec.image} (pull policy: missing)")
                    else:
                        self.logs.note(f"pulling {spec.image}")
                        client.pull(spec.image)
                finally:
                    if login is not None:  # the credentials are not needed any more
                        client.logout(login.server)
                        shutil.rmtree(auth_dir, ignore_errors=True)
                        auth_dir.mkdir(mode=0o700)
            except (RegistryError, SecretError) as exc:
                return self._early(Final(p.Outcome.INFRA_FAILED, None, str(exc)))
        resumed = False
        if self.checkpoint_dir.exists():
            shutil.rmtree(self.checkpoint_dir)
        if spec.checkpoint.resume:
            try:
                manifest = self.checkpointer.restore()
            except CheckpointError as exc:
                return self._early(Final(p.Outcome.INFRA_FAILED, None, f"restoring the checkpoint: {exc}"))
            resumed = manifest is not None
            self.logs.note(
                f"restored checkpoint at {manifest.checkpoint} ({len(manifest.files)} files)"
                if manifest
                else "no checkpoint to resume from: starting from scratch"
            )
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (PROGRESS_NAME, NOTICE_NAME):
            (self.run_dir / stale).unlink(missing_ok=True)
        if container:  # the image may run as any user
            os.chmod(self.checkpoint_dir, 0o777)
            os.chmod(self.run_dir, 0o777)
        ckpt_path = CONTAINER_CHECKPOINT_DIR if container else str(self.checkpoint_dir)
        run_path = CONTAINER_RUN_DIR if container else str(self.run_dir)
        env.pop(p.ENV_RESUME, None)
        env.update(
            {
                p.ENV_CHECKPOINT_DIR: ckpt_path,
                p.ENV_PROGRESS_FILE: f"{run_path}/{PROGRESS_NAME}",
                p.ENV_NOTICE_FILE: f"{run_path}/{NOTICE_NAME}",
                p.ENV_JOB_ID: spec.job_id,
                p.ENV_CHECKPOINT_INTERVAL: str(spec.checkpoint.interval_seconds),
            }
        )
        if resumed:
            env[p.ENV_RESUME] = "1"
        if self._shutdown_at is not None:
            self._shutdown_notice()
        if self._preempt_event.is_set():
            return self._early(Final(p.Outcome.PREEMPTED, None, "interrupted before the workload started"))
        launch = Launch(
            name=f"ovs-{spec.placement_id}",
            command=list(spec.command),
            env=env,
            checkpoint_dir=self.checkpoint_dir,
            run_dir=self.run_dir,
            private_dir=self.private,
            gpu_count=spec.gpu_count,
            image=spec.image,
            shm_size_gb=spec.shm_size_gb,
            runtime_env=client.run_env() if container else {},
        )
        workload = make_workload(spec.runtime, launch, gpus, binary)
        try:
            workload.start()
        except LaunchError as exc:
            return self._early(Final(exc.outcome, exc.exit_code, exc.detail))
        self.workload = workload
        self.logs.follow(workload.output)
        self.reporter.send(p.ReportKind.STARTED, detail=f"{spec.runtime} {spec.image}".strip())
        if self.state.preempt is not None:  # a notice came while starting: the workload must hear it too
            workload.signal(self.notice_signal)
        code = self._supervise(workload, spec)
        preempted = self._preempt_event.is_set()
        final = classify(code, container=container, preempted=preempted)
        if container and not preempted and code != 0:
            final = _exec_failure(final, self.logs.tail())
        self._wait_uploader()
        progress = self._read_progress()
        declared = progress.checkpoint if progress else None
        durable = self.checkpointer.last.checkpoint if self.checkpointer.last else None
        # a checkpoint the workload declared but the agent had not stored yet is stored whatever the outcome
        pending = declared is not None and (durable is None or declared > durable)
        if final.outcome in (p.Outcome.SUCCEEDED, p.Outcome.PREEMPTED) or pending:
            try:
                manifest = self.checkpointer.snapshot(self.state.progress)
                if manifest is not None:
                    self._report_checkpoint(manifest)
            except CheckpointError as exc:
                self.logs.note(f"the final checkpoint could not be stored: {exc}")
                if final.outcome is p.Outcome.SUCCEEDED:
                    return Final(
                        p.Outcome.INFRA_FAILED,
                        code,
                        f"the workload succeeded but its results could not be stored: {exc}",
                    )
        return final

    def _early(self, final: Final) -> Final:
        self.logs.note(f"the attempt could not start: {final.detail}")
        return final

    # -------------------------------------------------------------------------------------------- supervision

    def _supervise(self, workload: Workload, spec: p.AttemptSpec) -> int:
        now = time.monotonic()
        every = max(1, spec.heartbeat_seconds)
        next_heartbeat = now + every
        last_progress_report = now
        reported_done: float | None = None
        requested_checkpoint: float | None = None
        self._upload_request = threading.Event()
        self._uploader = threading.Thread(target=self._upload_loop, name="checkpoint-upload", daemon=True)
        self._uploader_stop = False
        self._uploader.start()
        try:
            while True:
                code = workload.wait(self.opts.progress_poll_seconds)
                if code is not None:
                    return code
                if self._shutdown_at is not None:
                    self._shutdown_notice()
                if self._preempt_event.is_set():
                    return self._preempted(workload, spec)
                progress = self._read_progress()
                now = time.monotonic()
                if progress is not None:
                    if progress.checkpoint is not None and progress.checkpoint != requested_checkpoint:
                        requested_checkpoint = progress.checkpoint
                        self._upload_request.set()
                    if (
                        progress.done != reported_done
                        and now - last_progress_report >= self.opts.progress_report_seconds
                    ):
                        reported_done, last_progress_report = progress.done, now
                        self._send_progress()
                if now >= next_heartbeat:
                    next_heartbeat = now + every
                    last = self.checkpointer.last
                    self.reporter.send(
                        p.ReportKind.HEARTBEAT,
                        progress=self.state.progress,
                        checkpointed=last.fraction_checkpointed if last else None,
                    )
        finally:
            self._uploader_stop = True
            self._upload_request.set()

    def _preempted(self, workload: Workload, spec: p.AttemptSpec) -> int:
        """Give the workload until its next checkpoint (or the deadline minus the upload reserve), then stop it."""
        notice = self.state.preempt
        assert notice is not None
        deadline = time.time() + 30.0
        if notice.deadline:
            with contextlib.suppress(ValueError):
                deadline = parse_iso8601(notice.deadline).timestamp()
        give_up = deadline - spec.notice.upload_reserve_seconds
        # set by `_on_notice` with the preempt notice, which always comes first (a SIGTERM becomes one too)
        base = self.state.checkpoint_at_preempt if self.state.checkpoint_at_preempt is not None else -1.0
        self.logs.note(f"waiting up to {max(0.0, give_up - time.time()):.0f}s for the workload's checkpoint")
        while time.time() < give_up:
            code = workload.wait(min(self.opts.progress_poll_seconds, 0.2))
            # read the progress even when the workload has just exited: a workload that saves on the signal and
            # exits within one poll must still have its checkpoint in the log
            progress = self._read_progress()
            if progress is not None and progress.checkpoint is not None and progress.checkpoint > base:
                self.logs.note(f"the workload checkpointed at {progress.checkpoint}")
                if code is not None:
                    return code
                break
            if code is not None:
                return code
        grace = max(
            1.0, min(self.opts.stop_grace_seconds, deadline - time.time() - spec.notice.upload_reserve_seconds / 2)
        )
        return workload.stop(grace)

    def _peek_checkpoint(self) -> float:
        """The checkpoint the progress file declares now (-1 for none), leaving the agent's view of it alone (this
        runs on the watcher's thread)."""
        try:
            progress: p.Progress | None = p.parse_progress((self.run_dir / PROGRESS_NAME).read_bytes())
        except (OSError, p.ProtocolError):
            progress = self.state.progress
        return progress.checkpoint if progress is not None and progress.checkpoint is not None else -1.0

    def _read_progress(self) -> p.Progress | None:
        path = self.run_dir / PROGRESS_NAME
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self.state.progress_stamp:
                return self.state.progress
            data = path.read_bytes()
        except OSError:
            return self.state.progress
        try:
            progress = p.parse_progress(data)
        except p.ProtocolError as exc:
            if self.state.progress_stamp != stamp:
                log.info("ignoring the progress file: %s", exc)
            self.state.progress_stamp = stamp
            return self.state.progress
        self.state.progress_stamp = stamp
        self.state.progress = progress
        return progress

    def _send_progress(self) -> None:
        last = self.checkpointer.last
        self.reporter.send(
            p.ReportKind.PROGRESS,
            progress=self.state.progress,
            checkpointed=last.fraction_checkpointed if last else None,
        )

    def _report_checkpoint(self, manifest: Manifest) -> None:
        self.reporter.send(
            p.ReportKind.PROGRESS,
            progress=self.state.progress,
            checkpointed=manifest.fraction_checkpointed,
            detail=f"checkpoint at {manifest.checkpoint} stored ({len(manifest.files)} files)",
        )

    def _upload_loop(self) -> None:
        while True:
            self._upload_request.wait()
            self._upload_request.clear()
            if self._uploader_stop:
                return
            try:
                manifest = self.checkpointer.snapshot(self.state.progress)
            except CheckpointError as exc:
                log.warning("checkpoint upload failed (the previous one stays durable): %s", exc)
                self.logs.note(f"checkpoint upload failed: {exc}")
                continue
            if manifest is not None:
                self._report_checkpoint(manifest)

    def _wait_uploader(self) -> None:
        uploader = getattr(self, "_uploader", None)
        if uploader is not None:
            uploader.join()
