"""The start-up script every cloud instance boots with: pull the job's container and run it, told where its
checkpoint lives and whether to resume from it; then report the exit status to the broker (when the broker has a
public URL) and power off, so an instance never idles billing after its job ends.

Contract with the training container (documented for users): the broker sets `OVERSPILL_CHECKPOINT_URI` (where
to write and read checkpoints), `OVERSPILL_RESUME=1` when a checkpoint from an earlier attempt should be loaded,
`OVERSPILL_JOB_ID` and `OVERSPILL_PLACEMENT_ID`, and `OVERSPILL_CHECKPOINT_INTERVAL_SECONDS` (how often to
checkpoint). The container should checkpoint at that cadence and on SIGTERM.

The image reference is validated again here (`providers.images.validate_image`, `ValueError` if it is not one) and
passed after `--` in `docker pull` and `docker run`, after every option.
"""

from __future__ import annotations

import shlex

from providers.base import LaunchRequest
from providers.images import validate_image


def container_env(request: LaunchRequest) -> dict[str, str]:
    env = {
        "OVERSPILL_JOB_ID": request.tags.job_id,
        "OVERSPILL_PLACEMENT_ID": request.tags.placement_id,
        "OVERSPILL_CHECKPOINT_INTERVAL_SECONDS": str(int(request.checkpoint_interval_hours * 3600)),
        "OVERSPILL_RESUME": "1" if request.resume_from else "0",
    }
    uri = request.resume_from or request.spec.checkpoint_uri
    if uri:
        env["OVERSPILL_CHECKPOINT_URI"] = uri
    return env


def startup_script(request: LaunchRequest) -> str:
    """A bash script (cloud-init user data / GCP startup-script / Azure custom data) that runs the job."""
    env_flags = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in sorted(container_env(request).items()))
    command = " ".join(shlex.quote(part) for part in request.spec.command)
    gpus = "--gpus all" if request.spec.gpu_count else ""
    image = shlex.quote(validate_image(request.spec.image))
    # every option first, then `--`: the image can never be read as an option (`--privileged`...), even if a
    # reference slipped past validation; docker and podman both take `--` before the image
    run = f"docker run --rm {gpus} {env_flags} -- {image} {command}".rstrip()
    lines = [
        "#!/bin/bash",
        "# written by Overspill: runs one training job attempt, then powers off",
        "set -uo pipefail",
    ]
    if request.callback_url and request.callback_token and request.offering.provider.startswith("azure"):
        # Azure announces evictions only inside the VM (Scheduled Events, >= 30 s ahead): relay them home.
        relay = f"{request.callback_url.rstrip('/')}/v1/placements/{request.tags.placement_id}/scheduled-events"
        lines.append(
            "( while sleep 5; do ev=$(curl -fsS -H Metadata:true "
            "'http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01') || continue; "
            "case \"$ev\" in *Preempt*) curl -fsS -X POST -H 'Content-Type: application/json' "
            f"-H {shlex.quote('X-Overspill-Callback-Token: ' + request.callback_token)} "
            f'-d "$ev" {shlex.quote(relay)} ;; esac; done ) &'
        )
    lines += [f"docker pull -- {image}", f"{run}", "rc=$?"]
    if request.callback_url and request.callback_token:
        url = f"{request.callback_url.rstrip('/')}/v1/placements/{request.tags.placement_id}/exit"
        lines.append(
            "curl -fsS --retry 5 --retry-all-errors -X POST -H 'Content-Type: application/json' "
            f"-H {shlex.quote('X-Overspill-Callback-Token: ' + request.callback_token)} "
            f'-d "{{\\"exit_code\\": $rc}}" {shlex.quote(url)} || true'
        )
        lines += ["shutdown -h now", ""]
    else:
        # No way to report the status: power off only on success (adapters read a self-shutdown as success);
        # a failed job's instance stays up, visible, until the broker's ceiling guard or a cancel stops it.
        lines += ['if [ "$rc" -eq 0 ]; then shutdown -h now; fi', 'exit "$rc"', ""]
    return "\n".join(lines)
