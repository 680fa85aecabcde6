"""How `providers.slurm.provider.SlurmProvider` talks to Slurm: the transport interface, its command-line
implementation, and
the typed errors every transport raises.

Contract:
- `SlurmTransport` is the seam: read every job (`jobs`, squeue's view) and every node (`nodes`, sinfo's), read
  accounting records (`accounting`, sacct's), change a job (`update_job`: Comment, Dependency, Priority; `hold`;
  `release`; `cancel`; `requeue`), submit (`submit`: an sbatch argv, run through the site's submit wrapper as the
  tenant's own user), and ask the cluster's PriorityType (`priority_type`). `run` is the command runner the other
  readers of a held job use (`providers.slurm.script.read_job`: batch script, `scontrol show job`, environment),
  since no transport here has a batch-script read of its own. Targets are `123` or `123_4` (an array task).
- `CliTransport(run, name)` is the Slurm tools through a runner (argv -> CompletedProcess): `squeue --json --all
  --states=all`, `sinfo --json -N --all`, `sacct --json -a -j ..` (else `sacct -P`, see
  `providers.slurm.accounting`), `scontrol update|hold|release|requeue`, `scancel`, `sbatch`. It is what the
  provider always did, command for command.
- `providers.slurm.rest.RestTransport` is the slurmrestd implementation.
- Errors: controller (or slurmrestd) unreachable -> `SlurmUnavailable` (retryable, provider-wide); an unknown job
  -> `NotFound`; bad partition/GRES/shape -> `InvalidRequest`; QOS/association limits -> `QuotaExceeded`;
  permission -> `AuthError`; busy -> `Throttled`; no accounting -> `AccountingDisabled`; anything else
  `SlurmCommandError`. `classify(message, text, name)` maps Slurm's own error text (the same strings whether a
  tool printed it or slurmrestd returned it) onto them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Protocol

from providers.base import AuthError, InvalidRequest, NotFound, ProviderError, QuotaExceeded, Scope, Throttled
from providers.slurm.accounting import parsable_argv, parse_sacct, parse_sacct_parsable
from providers.slurm.json_api import SlurmJob, SlurmNode, SlurmParseError, parse_sinfo, parse_squeue

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


class SlurmUnavailable(ProviderError):
    """slurmctld cannot be reached (or the tools are missing): the whole provider is out for now."""

    scope = Scope.PROVIDER
    retryable = True


class SlurmCommandError(ProviderError):
    """A Slurm command failed for a reason with no better-typed error."""


class AccountingDisabled(SlurmCommandError):
    """The cluster keeps no job accounting (no slurmdbd): a job that left squeue cannot be looked up."""


_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "munge",
    "problem talking to the database",  # sacct while slurmdbd is down
)
_DENIED = ("access/permission denied", "access denied", "permission denied", "not authorized", "sudo:")
_QUOTA = ("qos", "association", "assoc", "job violates accounting", "maxsubmit")
_INVALID = (
    "invalid partition",
    "invalid generic resource",
    "invalid gres",
    "requested node configuration is not available",
    "invalid time limit",
    "invalid",
)


def classify(message: str, text: str, name: str) -> ProviderError:
    """The typed error for Slurm's error `text` (as a tool prints it or slurmrestd returns it)."""
    low = text.lower()
    if "invalid job id" in low:
        return NotFound(message, provider=name, detail=text)
    if any(s in low for s in _UNAVAILABLE):
        return SlurmUnavailable(message, provider=name, detail=text)
    if any(s in low for s in _DENIED):
        return AuthError(message, provider=name, detail=text)
    if any(s in low for s in _QUOTA):
        return QuotaExceeded(message, provider=name, detail=text)
    if "temporarily unable" in low or "resource temporarily unavailable" in low:
        return Throttled(message, provider=name, detail=text)
    if any(s in low for s in _INVALID):
        return InvalidRequest(message, provider=name, detail=text)
    return SlurmCommandError(message, provider=name, detail=text)


def accounting_off(text: str) -> bool:
    """Whether Slurm's error text says the cluster keeps no accounting."""
    low = text.lower()
    return "accounting storage is disabled" in low or "slurm accounting storage is disabled" in low


class SlurmTransport(Protocol):
    """What `SlurmProvider` needs from Slurm (module docstring). Every method raises the typed errors above."""

    name: str
    run: Runner

    def jobs(self) -> list[SlurmJob]: ...

    def nodes(self) -> list[SlurmNode]: ...

    def accounting(self, ids: Sequence[str]) -> list[SlurmJob]:
        """Accounting records of these job ids or array tasks (one query; the caller batches)."""
        ...

    def update_job(
        self, target: str, *, comment: str | None = None, dependency: str | None = None, priority: int | None = None
    ) -> None: ...

    def hold(self, target: str) -> None: ...

    def release(self, target: str) -> None: ...

    def cancel(self, target: str) -> None:
        """Cancel the job (or only this array task); a job that already ended is success, an unknown id
        `NotFound`."""
        ...

    def requeue(self, target: str) -> None: ...

    def submit(self, argv: list[str]) -> str:
        """Run this sbatch argv (wrapper included); the new job id."""
        ...

    def priority_type(self) -> str: ...


class CliTransport:
    """The Slurm command-line tools through `run` (module docstring)."""

    def __init__(self, run: Runner, name: str = "onprem-slurm") -> None:
        self.run = run
        self.name = name

    def call(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run one command; a missing tool or a timeout is `SlurmUnavailable`, a failure its typed error."""
        try:
            done = self.run(argv)
        except FileNotFoundError as exc:
            raise SlurmUnavailable(f"{argv[0]} not found: {exc}", provider=self.name) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"{argv[0]} timed out", provider=self.name) from exc
        if done.returncode != 0:
            raise self.error(argv, done)
        return done

    def error(self, argv: Sequence[str], done: subprocess.CompletedProcess[str]) -> ProviderError:
        text = (done.stderr or done.stdout or "").strip()
        shown = list(argv[argv.index("sbatch") :] if "sbatch" in argv else argv)
        return classify(f"{' '.join(shown[:2])} failed ({done.returncode}): {text[:500]}", text, self.name)

    def jobs(self) -> list[SlurmJob]:
        done = self.call(["squeue", "--json", "--all", "--states=all"])
        try:
            return parse_squeue(done.stdout)
        except SlurmParseError as exc:
            raise SlurmCommandError(f"unreadable squeue output: {exc}", provider=self.name) from exc

    def nodes(self) -> list[SlurmNode]:
        done = self.call(["sinfo", "--json", "-N", "--all"])
        try:
            return parse_sinfo(done.stdout)
        except SlurmParseError as exc:
            raise SlurmCommandError(f"unreadable sinfo output: {exc}", provider=self.name) from exc

    def accounting(self, ids: Sequence[str]) -> list[SlurmJob]:
        argv = ["sacct", "--json", "-a", "-j", ",".join(ids)]
        try:
            done = self.call(argv)
            return parse_sacct(done.stdout)
        except SlurmUnavailable:
            raise
        except ProviderError as exc:
            if accounting_off(str(exc.detail or exc)):
                raise AccountingDisabled(f"no accounting on {self.name}: {exc}", provider=self.name) from exc
        except SlurmParseError:
            pass  # an unreadable JSON shape: the parsable format below says the same in plain text
        done = self.call(parsable_argv(list(ids)))
        try:
            return parse_sacct_parsable(done.stdout)
        except SlurmParseError as exc:
            raise SlurmCommandError(f"unreadable sacct output: {exc}", provider=self.name) from exc

    def update_job(
        self, target: str, *, comment: str | None = None, dependency: str | None = None, priority: int | None = None
    ) -> None:
        fields = [f"Comment={comment}"] if comment is not None else []
        fields += [f"Dependency={dependency}"] if dependency is not None else []
        fields += [f"Priority={priority}"] if priority is not None else []
        if fields:
            self.call(["scontrol", "update", f"JobId={target}", *fields])

    def hold(self, target: str) -> None:
        self.call(["scontrol", "hold", target])

    def release(self, target: str) -> None:
        self.call(["scontrol", "release", target])

    def cancel(self, target: str) -> None:
        self.call(["scancel", target])

    def requeue(self, target: str) -> None:
        self.call(["scontrol", "requeue", target])

    def submit(self, argv: list[str]) -> str:
        done = self.call(argv)
        submitted = done.stdout.strip().split(";", 1)[0]
        if not submitted.isdigit():
            raise SlurmCommandError(f"sbatch printed no job id: {done.stdout!r}", provider=self.name)
        return submitted

    def priority_type(self) -> str:
        done = self.call(["scontrol", "show", "config"])
        for line in done.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "PriorityType":
                return value.strip().split(" ", 1)[0]
        return ""
