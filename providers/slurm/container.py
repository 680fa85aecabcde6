"""How a job the broker places on Slurm runs: in its own container image, with the site's container runtime.

Contract: `container_command(runtime, launcher=(), run_args=())` returns the `CommandBuilder` a `SlurmProvider`
puts in its `sbatch --wrap` (run by the tenant's unprivileged identity on the compute node). Every word is quoted
with `shlex`, so no image name, command word or environment value reaches the shell as syntax.

- `none`: the command on the node itself (`providers.slurm.provider.default_command`): only for sites without
containers.
- `podman`: `exec <launcher: podman> run --rm --network=host --env NAME... <run_args> <image> <command...>`; the
  values are exported in the wrapper first and passed by name, with `CUDA_VISIBLE_DEVICES` (Slurm's GPU binding)
  when set. `run_args` is the site's GPU hook, e.g. `["--device", "nvidia.com/gpu=all"]` with NVIDIA's CDI.
- `apptainer`: `exec <launcher: apptainer> exec --cleanenv --nv <run_args> docker://<image> <command...>`, the
  environment as `APPTAINERENV_<NAME>`.
- `pyxis`: `exec <launcher: srun> --container-image=<image> --container-env=NAME,... <run_args> <command...>`
  (pyxis/enroot as a Slurm plugin; registry `host/path` becomes enroot's `host#path`).

The environment is the job's own (`env` of its spec), then what cloud instances give the container
(`providers.startup.container_env`: checkpoint location, resume flag, job and placement ids) and the launch token.
A job with no command runs its image's default entrypoint (podman, apptainer `run`, pyxis: none is refused).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from providers.base import InvalidRequest, LaunchRequest
from providers.slurm.provider import CommandBuilder, default_command
from providers.startup import container_env

RUNTIMES = ("none", "podman", "apptainer", "pyxis")


def job_env(request: LaunchRequest) -> dict[str, str]:
    return {**dict(request.spec.env), "OVERSPILL_LAUNCH_TOKEN": request.launch_token, **container_env(request)}


def container_command(runtime: str, launcher: Sequence[str] = (), run_args: Sequence[str] = ()) -> CommandBuilder:
    """The `--wrap` command builder for `runtime` (see the module docstring); ValueError for an unknown one."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown container runtime {runtime!r}: one of {', '.join(RUNTIMES)}")
    if runtime == "none":
        return default_command
    binary = list(launcher) or [{"podman": "podman", "apptainer": "apptainer", "pyxis": "srun"}[runtime]]

    def build(request: LaunchRequest) -> str:
        env = job_env(request)
        image, command = request.spec.image, list(request.spec.command)
        if runtime == "podman":
            names = [*env, "CUDA_VISIBLE_DEVICES"]
            passed = [a for name in names for a in ("--env", name)]
            argv = [*binary, "run", "--rm", "--network=host", *passed, *run_args, image, *command]
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            return f"export {exports}; exec {shlex.join(argv)}"
        if runtime == "apptainer":
            verb = "exec" if command else "run"
            argv = [*binary, verb, "--cleanenv", "--nv", *run_args, f"docker://{image}", *command]
            exports = " ".join(f"APPTAINERENV_{k}={shlex.quote(v)}" for k, v in env.items())
            return f"export {exports}; exec {shlex.join(argv)}"
        if not command:
            raise InvalidRequest("pyxis runs a command in the image: the job has none", provider="onprem-slurm")
        first, sep, rest = image.partition("/")
        registry = sep and ("." in first or ":" in first or first == "localhost")
        enroot = f"{first}#{rest}" if registry else image
        argv = [*binary, f"--container-image={enroot}", f"--container-env={','.join(env)}", *run_args, *command]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"export {exports}; exec {shlex.join(argv)}"

    return build
