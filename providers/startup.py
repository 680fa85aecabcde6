"""The start-up script every cloud instance boots with: install and start the instance agent, the same script on
every cloud. A thin wrapper over `agent.bootstrap.startup_script` (which documents the script itself): the broker
gives it the agent wheel's URL and SHA-256, the attempt spec's URI and the endpoint variables the agent needs
(`broker.agent_side.attempt_spec.bootstrap_env`), and the adapters pass the text as the cloud takes it
(`LaunchRequest.user_data`).
What the workload runs, its image (validated when the spec is built), environment and secret references are in the
spec, read by the agent with the instance's identity: never in the script, which any process on the instance that
reaches the metadata service can read.

`container_env` is what a job attempt without an agent is told (the Slurm adapter's batch script): its checkpoint
location, whether to resume, its job and placement ids and the checkpoint cadence.
"""

from __future__ import annotations

from agent import bootstrap
from providers.base import LaunchRequest

DEFAULT_ROOT = "/var/lib/overspill-agent"


def startup_script(
    *,
    wheel_url: str,
    wheel_sha256: str,
    spec_uri: str,
    env: dict[str, str] | None = None,
    root: str = DEFAULT_ROOT,
    systemd: bool = True,
) -> str:
    """The script's text; ValueError for a malformed digest or environment variable name. `systemd=False`: the
    agent is never started as a systemd unit (the local pool: several attempts on one host)."""
    return bootstrap.startup_script(
        wheel_url=wheel_url, wheel_sha256=wheel_sha256, spec_uri=spec_uri, env=env or {}, root=root, systemd=systemd
    )


def container_env(request: LaunchRequest) -> dict[str, str]:
    """The environment of a job attempt run without the agent (Slurm)."""
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
