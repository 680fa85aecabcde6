"""Read a held Slurm job the way its batch step would see it: the batch script, its `#SBATCH` lines, the job's
record (`scontrol show job`: working directory, `--output`/`--error` paths, container) and the environment it was
submitted with (`sacct --env-vars`).

Contract:
- `read_job(run, target, *, array_job_id=None)` runs three read-only commands through the injected runner (the
  provider's, so as the broker's operator account): `scontrol write batch_script <target> -`,
  `scontrol show job <target>` and `sacct -j <job or array id> --env-vars`. It returns a `SlurmJobDetails` or
  raises `ScriptRefused` whose message says what is wrong (never a partial read).
- The script is bounded (`MAX_SCRIPT_BYTES`, 96 KiB) and must be UTF-8 without NUL bytes (sbatch itself refuses
  NULs); anything else is refused, never truncated.
- The environment needs slurmdbd with `AccountingStoreFlags=job_env`: without it (or before slurmctld has sent the
  job's record, a few seconds after it became eligible) the environment is unknown and the job is refused, since a
  script reading `$MYVAR` would silently run differently. A site without it may choose to run such jobs with only
  the `SLURM_*` variables (`require_env=False`, setting `OVERSPILL_SLURM_REQUIRE_ENVIRONMENT=false`).
- `sbatch_options(script)` lists the options of its `#SBATCH` lines as sbatch reads them: from the top, up to the
  first line that is neither blank nor a comment, each line split like a shell word list (an unquoted, unescaped
  `#` starts a comment: pyxis' `registry#image` is written `registry\\#image` there). A line that does not split
  (an open quote) is ignored.
- `container_image(options, env, container)` is the image a job names for itself: pyxis `--container-image`
  (from the `#SBATCH` lines or, given on the sbatch command line, pyxis' `_SLURM_SPANK_OPTION_pyxis_container_image`
  environment variable), else the job's `--container` (Slurm's own OCI option). Pyxis' `registry#path` form becomes
  `registry/path` and a `docker://` scheme is dropped; a file on the site's filesystem (a squashfs image, an OCI
  bundle directory) cannot be pulled in the cloud and is refused.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]

MAX_SCRIPT_BYTES = 96 * 1024
MAX_ENV_TEXT_BYTES = 1024 * 1024
PYXIS_ENV = "_SLURM_SPANK_OPTION_pyxis_container_image"


class ScriptRefused(ValueError):
    """The job cannot be read or carried to the cloud as it is; the message says why (for its event and audit)."""


@dataclass(frozen=True, slots=True)
class SlurmJobDetails:
    """What the broker read about one held job: its record's fields (`record`, from `scontrol show job`), its
    script, its `#SBATCH` options and its submission environment."""

    target: str
    script: str
    record: Mapping[str, str]
    env: Mapping[str, str]
    options: Sequence[tuple[str, str]] = field(default_factory=tuple)
    env_known: bool = True

    def get(self, key: str) -> str:
        value = self.record.get(key, "")
        return "" if value in ("(null)", "N/A") else value


def read_job(run: Runner, target: str, *, array_job_id: int | None = None, require_env: bool = True) -> SlurmJobDetails:
    """Read the job (see the module docstring). `target` is `123` or `123_4`; an array task's environment is
    its array's (`array_job_id`). Without `require_env` (a site whose accounting keeps no environments) a job whose
    environment is unknown is read with an empty one and `env_known` False."""
    script = _check_script(_stdout(run, ["scontrol", "write", "batch_script", target, "-"], "its batch script"))
    record = parse_show_job(_stdout(run, ["scontrol", "show", "job", target], "its job record"))
    array, sep, _ = target.partition("_")
    array_id = array_job_id or (int(array) if sep and array.isdigit() else None)
    env_text = _stdout(run, ["sacct", "-j", str(array_id or target), "--env-vars"], "its environment")
    env = parse_env_vars(env_text, array_id)
    if env is None and not require_env:
        return SlurmJobDetails(target, script, record, {}, tuple(sbatch_options(script)), env_known=False)
    if env is None:
        raise ScriptRefused(
            f"Slurm job {target}: its submission environment is not in accounting (slurmdbd needs "
            "AccountingStoreFlags=job_env, and the job's record arrives a few seconds after it became eligible)"
        )
    return SlurmJobDetails(target, script, record, env, tuple(sbatch_options(script)))


def _stdout(run: Runner, argv: list[str], what: str) -> str:
    try:
        done = run(argv)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ScriptRefused(f"reading {what} failed: {exc}") from None
    except UnicodeDecodeError:
        raise ScriptRefused(f"{what} is not UTF-8 text") from None
    if done.returncode != 0:
        raise ScriptRefused(f"reading {what} failed ({' '.join(argv[:2])}): {(done.stderr or '').strip()[:300]}")
    return done.stdout or ""


def _check_script(text: str) -> str:
    if "\x00" in text:
        raise ScriptRefused("the batch script contains a NUL byte")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ScriptRefused("the batch script is not UTF-8 text") from None
    if size > MAX_SCRIPT_BYTES:
        raise ScriptRefused(f"the batch script is {size} bytes, over the {MAX_SCRIPT_BYTES} a burst carries")
    if not text.startswith("#!"):
        raise ScriptRefused("the batch script does not start with #! (no interpreter to run it with)")
    return text


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job` (one job) as a dict. The fields that are paths (WorkDir, StdOut, StdErr, StdIn, Command,
    Container) sit alone on their lines and keep everything after `=` (spaces included); other lines hold several
    space-separated `Key=Value` pairs."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key in ("WorkDir", "StdOut", "StdErr", "StdIn", "Command", "Container"):
            out[key] = value
            continue
        if key == "JobId" and " JobName=" in line:  # the name, last on the first line, may hold spaces
            line, _, out["JobName"] = line.partition(" JobName=")
        for pair in line.split(" "):
            k, s, v = pair.partition("=")
            if s and k not in out:
                out[k] = v
    return out


def parse_env_vars(text: str, array_job_id: int | None = None) -> dict[str, str] | None:
    """The environment `sacct --env-vars` printed for one job: after the `Environment used for <id>` header and its
    dashes, `NAME=value` lines (a line without `=` continues the previous value: a value holding a newline). None
    when sacct printed no environment (no record, `NONE`) or several jobs' blocks (a reused id: ambiguous). For an
    array (`array_job_id`) only its tasks' blocks count (`<array>_...`, one per task split out so far, all with the
    same submission environment): the first is taken."""
    if len(text.encode("utf-8", "replace")) > MAX_ENV_TEXT_BYTES:
        raise ScriptRefused(f"the job's environment is over {MAX_ENV_TEXT_BYTES} bytes")
    lines = text.splitlines()
    marker = "Environment used for "
    headers = [i for i, line in enumerate(lines) if line.startswith(marker)]
    if array_job_id is not None:
        headers = [i for i in headers if lines[i][len(marker) :].startswith(f"{array_job_id}_")]
    elif len(headers) != 1:
        return None
    if not headers:
        return None
    end = next((i for i, line in enumerate(lines) if i > headers[0] and line.startswith(marker)), len(lines))
    body = lines[headers[0] + 1 : end]
    if body and set(body[0]) == {"-"}:
        body = body[1:]
    env: dict[str, str] = {}
    last: str | None = None
    for line in body:
        name, sep, value = line.partition("=")
        if sep and name and " " not in name:
            env[name] = value
            last = name
        elif last is not None and line:
            env[last] += "\n" + line
    if not env or list(env) == ["NONE"] or (len(body) == 1 and body[0].strip() == "NONE"):
        return None
    return env


def sbatch_options(script: str) -> list[tuple[str, str]]:
    """The `#SBATCH` options as (`--long-name` or `-x`, value or ""), in order (see the module docstring)."""
    out: list[tuple[str, str]] = []
    for i, line in enumerate(script.splitlines()):
        stripped = line.strip()
        if i == 0 and stripped.startswith("#!"):
            continue
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break  # the first command ends the option block
        try:
            words = shlex.split(stripped[len("#SBATCH") :], comments=True)
        except ValueError:
            continue
        j = 0
        while j < len(words):
            word = words[j]
            if word.startswith("--"):
                name, sep, value = word.partition("=")
                if not sep and j + 1 < len(words) and not words[j + 1].startswith("-"):
                    value, j = words[j + 1], j + 1
                out.append((name, value))
            elif word.startswith("-") and len(word) >= 2:
                value = word[2:]
                if not value and j + 1 < len(words) and not words[j + 1].startswith("-"):
                    value, j = words[j + 1], j + 1
                out.append((word[:2], value))
            j += 1
    return out


def container_image(options: Sequence[tuple[str, str]], env: Mapping[str, str], container: str = "") -> str | None:
    """The image the job names for itself, as a pullable reference, or None (see the module docstring)."""
    pyxis = [value for name, value in options if name == "--container-image"]
    named = pyxis[-1] if pyxis else env.get(PYXIS_ENV, "")
    if not named:
        named = container or next((v for n, v in reversed(list(options)) if n == "--container"), "")
    if not named:
        return None
    return pullable(named)


def pullable(reference: str) -> str:
    """A pyxis/enroot or OCI image reference as the agent pulls it; `ScriptRefused` for a file on the site."""
    ref = reference.strip()
    if ref.startswith("docker://"):
        ref = ref[len("docker://") :]
    if ref.startswith(("/", "./", "../", "~")) or ref.endswith((".sqsh", ".squashfs", ".sif")):
        raise ScriptRefused(
            f"the job's container {reference!r} is a file on the site's filesystem: the cloud cannot pull it "
            "(name a registry image, e.g. #SBATCH --container-image=nvcr.io#nvidia/pytorch:24.01-py3)"
        )
    if "#" in ref:  # enroot's registry#image
        registry, _, path = ref.partition("#")
        ref = f"{registry}/{path}" if registry else path
    return ref
