"""Settling step helper: a burst that ran in the cloud gets its log written back to the Slurm job's `--output` (and
`--error`) path on the site's filesystem, before the held job is ended (so an `afterok` dependent reading it finds
it there).

Contract: `write_back(rt, job, now)` reads the log every attempt of the broker job shipped to the store (the agent's
offset-named chunks under `<attempt prefix>logs/`, attempts in order, a one-line separator between them) and
streams it into `OVERSPILL_SLURM_OUTPUT_WRITER` (default `sudo -n -u {user} -- /usr/bin/tee --`, a sudoers rule
limited to tee) with the path appended: the file is written as the job's Slurm user, never as root nor as the
broker, so the kernel decides what that user may write (a symlink to a file they cannot write fails like it would
on-prem). Before that the broker refuses paths that are not absolute and normal (`..`, `.`, control characters),
any `%` pattern Slurm left unexpanded that it cannot expand (`%j %A %a %u %x %%` are), and a user that is root or no
plausible unix name. `/dev/null` is honoured: nothing is written. With a distinct `--error` path, the merged log
goes to `--output` and the error file says where stderr went (the agent ships one merged stream).

Whatever goes wrong (path refused, writer failed, store unreadable), the log stays in the object store and the job
gets an event `onprem_output_in_store` with the store URI and the reason; success is `onprem_output_written`; a run
that shipped no log (a provider without the agent) writes nothing (`onprem_output_none`). Never raises: settling
goes on either way.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from agent.protocol import LOGS_DIR
from broker.runtime import Runtime
from broker.services.job_logs import read_log
from broker.services.jobs import add_event
from broker.slurm.job import is_clean_path
from broker.store.tables import Job, Placement
from providers.storage.base import StorageError

log = logging.getLogger(__name__)

_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}\$?$")
_PATTERN_RE = re.compile(r"%(\d*)([%jAauxN])")
WRITE_TIMEOUT_S = 300.0


class OutputRefused(ValueError):
    """The path or user cannot be written to; the message says why."""


def expand(path: str, *, job_id: str, target: str, user: str, name: str) -> str:
    """A Slurm filename pattern expanded as Slurm would for this job (`%j %A %a %u %x %N %%`, with `%<n>`
    zero padding); `OutputRefused` for any other `%` pattern."""
    array, sep, task = target.partition("_")

    def one(m: re.Match[str]) -> str:
        width, code = m.group(1), m.group(2)
        value = {
            "%": "%",
            "j": job_id,
            "A": array if sep else job_id,
            "a": task if sep else "4294967294",
            "u": user,
            "x": name,
            "N": "cloud",
        }[code]
        return value.zfill(int(width)) if width and code in "jAa" else value

    out = _PATTERN_RE.sub(one, path)
    if "%" in _PATTERN_RE.sub("", path):
        raise OutputRefused(f"{path[:200]!r} holds a % pattern the broker does not expand")
    return out


def checked_path(path: str) -> str:
    if not is_clean_path(path):
        raise OutputRefused(f"{path[:200]!r} is not an absolute, normal path (no '..', '.', control characters)")
    return path


def write_back(rt: Runtime, job: Job, now: datetime) -> bool:
    """Write the burst's log to its Slurm job's output path(s) as its user; True when written (see the module doc)."""
    slurm = job.spec.get("slurm") or {}
    output, error = str(slurm.get("output") or ""), str(slurm.get("error") or "")
    if not output:
        return False
    with Session(rt.engine) as session:
        attempts = [
            a
            for a in session.exec(
                select(Placement.attempt_uri).where(Placement.job_id == job.id).order_by(col(Placement.created_at))
            ).all()
            if a
        ]
    if not attempts:  # a provider whose instances run no agent ships no log: nothing to write, nothing to truncate
        _event(rt, job, now, "onprem_output_none", f"the cloud run shipped no log; {output} is left as it is")
        return False
    where = ", ".join(a + LOGS_DIR for a in attempts)
    user = str(slurm.get("user") or "")
    try:
        if not _USER_RE.match(user) or user == "root":
            raise OutputRefused(f"Slurm user {user[:40]!r} is not an unprivileged unix user: no file is written")
        env = job.spec.get("env") or {}
        names = {"job_id": str(env.get("SLURM_JOB_ID") or slurm.get("target", "")), "user": user}
        names.update(target=str(slurm.get("target", "")), name=str(env.get("SLURM_JOB_NAME") or job.name))
        out_path = checked_path(expand(output, **names))
        err_path = checked_path(expand(error, **names)) if error else out_path
        if out_path != "/dev/null":
            _write(rt, user, out_path, _log_stream(rt, attempts))
        if err_path not in (out_path, "/dev/null"):
            note = f"overspill: this job ran in the cloud as {job.id}; its stderr is merged into {out_path}\n"
            _write(rt, user, err_path, iter([note.encode()]))
    except (OutputRefused, StorageError, OSError, subprocess.SubprocessError) as exc:
        reason = str(exc)[:500]
        log.warning("the log of %s stays in the store (%s): %s", job.id, where, reason)
        _event(rt, job, now, "onprem_output_in_store", f"the job's log stays at {where}: {reason}", uri=where)
        return False
    _event(rt, job, now, "onprem_output_written", f"the job's log was written to {out_path} as {user}", path=out_path)
    return True


def _log_stream(rt: Runtime, attempts: list[str]) -> Iterator[bytes]:
    for i, attempt in enumerate(attempts):
        if i:
            yield f"\n--- overspill: attempt {i + 1} (the job resumed on another instance) ---\n".encode()
        offset = 0
        while True:  # the log API's reader: chunks in order, a MiB at a time, up to the first gap
            data, offset = read_log(rt.checkpoint_stores, attempt, offset)
            if not data:
                break
            yield data


def _write(rt: Runtime, user: str, path: str, data: Iterator[bytes]) -> None:
    argv = [part.replace("{user}", user) for part in rt.settings.slurm_output_writer] + [path]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        for piece in data:
            proc.stdin.write(piece)
        proc.stdin.close()
        proc.stdin = None  # closed: communicate() must not flush it
    except BrokenPipeError:
        proc.stdin = None
        pass  # the writer gave up (permission): its exit status says why
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    try:
        _, err = proc.communicate(timeout=WRITE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        text = (err or b"").decode("utf-8", "replace").strip()[:300]
        raise OutputRefused(f"writing {path} as {user} failed ({proc.returncode}): {text}")


def _event(rt: Runtime, job: Job, now: datetime, kind: str, message: str, **data: Any) -> None:
    with Session(rt.engine) as session:
        row = session.get(Job, job.id)
        if row is not None:
            add_event(session, row, now, kind, message, **data)
            session.commit()
