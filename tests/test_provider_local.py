"""The local pool (providers/local) as a provider: the contract suite every adapter passes, on this machine through
`sh` and over a real sshd, and what is its own: slots as capacity, the per-instance metadata endpoint that speaks
EC2's IMDSv2, and the notice drill in AWS's format, read back through the agent's own IMDS client.

The start-up script here stands for the broker's (providers.startup): it starts a detached process and records
its PID in the attempt's root, as the real script does with the agent; `end_by_itself` ends that process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from agent.identity import AwsIdentity
from providers.base import InstanceState, InsufficientCapacity, LaunchRequest, NotFound
from providers.local import scripts
from providers.local.hosts import LocalHost, SshHost
from providers.local.pool import LocalPool, PoolHost
from providers.model import Tags
from tests.local_pool_harness import kill_under
from tests.provider_contract import BROKER_ID, ContractEnv, ProviderContract, contract_spec
from tests.sshd import running_sshd, sshd_ready

NOW_UNUSED = None


def _user_data(root: str) -> str:
    """The shape of the broker's start-up script: a detached process, its PID in the root's agent.pid."""
    return (
        f"#!/bin/sh\nmkdir -p {root}\nnohup setsid sleep 600 >/dev/null 2>&1 </dev/null &\necho $! >{root}/agent.pid\n"
    )


@dataclass
class LocalEnv(ContractEnv):
    pool_root: str = ""

    def request(self, token: str | None = None) -> LaunchRequest:
        token = token or uuid.uuid4().hex
        placement = f"plc_{token[:16]}"
        return LaunchRequest(
            offering=self.offering,
            launch_token=token,
            tags=Tags(self.broker_id, f"job_{token[:8]}", placement),
            spec=contract_spec(),
            remaining_work_hours=Decimal("2"),
            user_data=_user_data(f"{self.pool_root}/{placement}"),
        )


def _end(root: str, instance_id: str) -> None:
    pid = int(Path(root, instance_id.split("/", 1)[1], "agent.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)


def _foreign(root: Path) -> str:
    (root / "plc_foreign").mkdir(parents=True)
    (root / "plc_foreign" / "meta.json").write_text(json.dumps({"tags": {"overspill:broker": "someone-else"}}))
    return "local/plc_foreign"


def _env(pool: LocalPool, root: Path, host: str) -> LocalEnv:
    offering = next(o for o in pool.offerings(pool.clock()) if o.accelerator_count == 1)
    return LocalEnv(
        provider=pool,
        offering=offering,
        unknown_id=f"{host}/plc_unknown",
        end_by_itself=lambda iid: _end(str(root), iid),
        make_foreign=(lambda: _foreign(root).replace("local/", f"{host}/")),
        pool_root=str(root),
    )


class TestLocalPoolContract(ProviderContract):
    @pytest.fixture
    def env(self, tmp_path: Path):
        root = tmp_path / "pool"
        pool = LocalPool([PoolHost(LocalHost(), str(root), 8)], broker_id=BROKER_ID, stop_grace_seconds=1)
        try:
            yield _env(pool, root, "local")
        finally:
            kill_under(root)


class TestSshHostContract(ProviderContract):
    @pytest.fixture(scope="class")
    @classmethod
    def sshd(cls, tmp_path_factory: pytest.TempPathFactory):
        why = sshd_ready()
        if why:
            pytest.skip(why)
        with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
            yield server

    @pytest.fixture
    def env(self, tmp_path: Path, sshd):
        root = tmp_path / "remote"
        host = SshHost(
            "box", sshd.target, port=sshd.port, identity_file=str(sshd.identity_file), known_hosts=str(sshd.known_hosts)
        )
        pool = LocalPool([PoolHost(host, str(root), 8)], broker_id=BROKER_ID, stop_grace_seconds=1)
        try:
            yield _env(pool, root, "box")
        finally:
            kill_under(root)


@pytest.fixture
def pool(tmp_path: Path):
    root = tmp_path / "pool"
    p = LocalPool([PoolHost(LocalHost(), str(root), 2)], broker_id=BROKER_ID, stop_grace_seconds=1)
    try:
        yield p, root
    finally:
        kill_under(root)


def _launch(pool: LocalPool, root: Path, size: int = 1):
    env = LocalEnv(provider=pool, offering=next(o for o in pool.offerings(pool.clock()) if o.accelerator_count == size),
                   pool_root=str(root))  # fmt: skip
    return pool.launch(env.request())


def test_slots_are_capacity(pool) -> None:
    p, root = pool
    keys = {o.instance_type: o.available for o in p.offerings(p.clock())}
    assert keys == {"cpu-1": True, "cpu-2": True}
    first = _launch(p, root, 2)
    assert {o.instance_type: o.available for o in p.offerings(p.clock())} == {"cpu-1": False, "cpu-2": False}
    with pytest.raises(InsufficientCapacity):
        _launch(p, root, 1)
    p.terminate(first.id)
    assert all(o.available for o in p.offerings(p.clock()))


def test_notice_drill_is_an_ec2_spot_instance_action_on_the_instances_metadata_endpoint(pool) -> None:
    p, root = pool
    inst = _launch(p, root)
    base = f"http://127.0.0.1:{(root / inst.id.split('/')[1] / 'imds' / 'port').read_text()}"
    imds = AwsIdentity(base=base, env={})
    assert imds.get("/latest/meta-data/spot/instance-action").status == 404
    deadline = p.inject_notice(inst.id)
    answer = imds.get("/latest/meta-data/spot/instance-action")
    assert answer.status == 200
    body = json.loads(answer.body)
    assert body["action"] == "terminate" and body["time"] == deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
    raw = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                          f"{base}/latest/meta-data/spot/instance-action"], capture_output=True, text=True)  # fmt: skip
    assert raw.stdout == "401"  # IMDSv2: no session token, no answer
    with pytest.raises(NotFound):
        p.inject_notice("local/plc_unknown")


def test_a_failed_start_up_script_reads_back_failed_with_a_launch_error(pool) -> None:
    p, root = pool
    env = LocalEnv(provider=p, offering=p.offerings(p.clock())[0], pool_root=str(root))
    req = env.request()
    req = LaunchRequest(req.offering, req.launch_token, req.tags, req.spec, req.remaining_work_hours,
                        user_data="#!/bin/sh\necho 'no python3 here' >&2\nexit 3\n")  # fmt: skip
    inst = p.launch(req)
    assert inst.state is InstanceState.FAILED and inst.launch_error is not None and inst.lingering
    assert "no python3 here" in str(inst.launch_error)


def test_the_stop_script_quotes_the_root() -> None:
    script = scripts.stop_script("/tmp/a b; rm -rf ~", 1)
    assert "root='/tmp/a b; rm -rf ~'" in script
