"""The local pool end to end, as a newcomer meets it: `overspill serve` with no settings but a data directory offers
this machine as a pool; `overspill submit examples/train-local.yaml` runs the example training script there under
the real instance agent (booted by the real start-up script, run with `sh`); `overspill logs -f` streams its output;
`overspill notice JOB` delivers an EC2-format spot notice through the instance's metadata endpoint; the agent has the
workload checkpoint, uploads it and reports `preempted`; the broker re-places the job on the pool, the next attempt
resumes from the checkpoint, and the final weights are bit-identical to an uninterrupted run of the same script.
The same on podman (the example in a container image) and on a host reached over a real sshd.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.local_pool_harness import KEY, STEPS, Broker, example_job, job_id_of, reference_weights, run_drill


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker.start(tmp_path, {"OVERSPILL_LOCAL_POOL_SLOTS": "2", "OVERSPILL_LOCAL_POOL_RATE_USD_PER_HOUR": "0.5"})
    try:
        yield b
    finally:
        b.stop()


def test_serve_offers_this_machine_as_a_local_pool(broker: Broker) -> None:
    pools = broker.cli("pools", "--json")
    assert '"provider": "local"' in pools or '"provider":"local"' in pools, pools[:2000]
    assert "cpu-1" in pools and "cpu-2" in pools


def test_example_job_survives_a_notice_with_bit_identical_weights(broker: Broker, tmp_path: Path) -> None:
    job_id, figures = run_drill(broker, tmp_path, example_job(tmp_path, **STEPS))
    print("local pool, process runtime:", figures)
    # the timeline, as `overspill events` prints it (and --follow on an ended job prints it all and returns)
    timeline = broker.cli("events", job_id, "--follow", timeout=60)
    kinds = [line.split()[2] for line in timeline.splitlines() if line.strip()]
    assert kinds.count("agent_started") == 2 and "notice_drill" in kinds and "finished" in kinds
    assert kinds.index("notice_drill") < kinds.index("preempted") < len(kinds) - 1 - kinds[::-1].index("agent_started")
    # the ledger at the pool's rate, one line per attempt
    costs = httpx.get(
        f"{broker.url}/v1/costs",
        params={"group_by": "job,placement"},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    ).json()
    mine = [row for row in costs["rows"] if row["job"] == job_id]
    assert len(mine) == 2 and all(row["placement"].startswith("plc_") for row in mine), costs
    assert all(Decimal(row["cost_usd"]) > 0 for row in mine), mine


def test_notice_is_refused_in_production(tmp_path: Path) -> None:
    secrets = {
        "OVERSPILL_BOOTSTRAP_API_KEY": "ovs_prodadmin_" + "k" * 40,
        "OVERSPILL_CALLBACK_SECRET": "c" * 40,
        "OVERSPILL_METRICS_TOKEN": "m" * 40,  # production refuses to start without one
    }
    b = Broker.start(tmp_path, {"OVERSPILL_ENV": "production", "OVERSPILL_LOCAL_POOL": "true", **secrets})
    try:
        job_id = job_id_of(b.cli("submit", str(example_job(tmp_path, **STEPS))))
        said = b.cli("notice", job_id, check=False)
        assert "production" in said, said
    finally:
        b.stop()


def test_weights_compare_bit_for_bit(tmp_path: Path) -> None:
    """The comparison itself can fail: one step fewer gives other weights."""
    a = reference_weights(tmp_path / "a", {**STEPS, "STEPS": "120"})
    b = reference_weights(tmp_path / "b", {**STEPS, "STEPS": "119"})
    assert any(a[k].tobytes() != b[k].tobytes() for k in a)
    assert all(np.array_equal(a[k], reference_weights(tmp_path / "c", {**STEPS, "STEPS": "120"})[k]) for k in a)


def test_remote_host_over_ssh_runs_the_example_through_a_notice(tmp_path: Path) -> None:
    """A host reached over a real sshd: the start-up script and the agent are shipped and started over SSH; the
    host runs the example with its own `python3` (the repository on PYTHONPATH stands for the user's code)."""
    import json

    from tests.local_pool_harness import REPO
    from tests.sshd import running_sshd, sshd_ready

    why = sshd_ready()
    if why:
        pytest.skip(why)
    remote_root = tmp_path / "remote-pool"
    with running_sshd(tmp_path / "sshd") as sshd:
        host = {
            "ssh": sshd.target,
            "port": sshd.port,
            "identity_file": str(sshd.identity_file),
            "known_hosts": str(sshd.known_hosts),
            "slots": 1,
            "root": str(remote_root),
        }
        b = Broker.start(
            tmp_path,
            {"OVERSPILL_LOCAL_POOL_THIS_MACHINE": "false", "OVERSPILL_LOCAL_POOL_HOSTS": json.dumps({"sshbox": host})},
        )
        b.roots.append(remote_root)
        try:
            pools = b.cli("pools", "--json")
            assert "sshbox" in pools, pools[:2000]
            job = example_job(tmp_path, **STEPS, PYTHONPATH=str(REPO))
            _, figures = run_drill(b, tmp_path, job, zone="sshbox")
            print("local pool, host over ssh:", figures)
        finally:
            b.stop()


def test_example_job_in_a_podman_container_survives_a_notice(tmp_path: Path) -> None:
    """The local pool on the podman runtime: the example in an image built on this machine (never pushed: the
    agent uses it as it is), the checkpoint directory mounted, the notice forwarded to the container's process."""
    from tests.container_images import containers_conf, examples_image, podman_ready

    why = podman_ready()
    if why:
        pytest.skip(why)
    image = examples_image()
    b = Broker.start(
        tmp_path,
        {
            "OVERSPILL_LOCAL_POOL_SLOTS": "1",
            "OVERSPILL_AGENT_RUNTIME": '{"local": "podman"}',
            "CONTAINERS_CONF": str(containers_conf()),
        },
    )
    try:
        _, figures = run_drill(b, tmp_path, example_job(tmp_path, image=image, **STEPS), image=image)
        print("local pool, podman runtime:", figures)
    finally:
        b.stop()
