"""The suite's worker groups (tests/xdist_groups.py): a small suite run with `-n 3` (and `--dist loadgroup`) keeps a
module's tests in one worker and every test on the `cluster` fixture in one worker, whichever module it is in;
the scheduler's queue hands out the heaviest group first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.xdist_groups import HeaviestFirst

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
import pytest
pytest_plugins = ["tests.xdist_groups"]

@pytest.fixture(scope="session")
def cluster():
    return "one per worker"
"""

MODULE = """
import json, os, time
import pytest

def _record(name):
    with open(os.environ["WHERE_RAN"], "a") as out:
        out.write(json.dumps([__name__ + "::" + name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
    time.sleep(0.3)

@pytest.mark.parametrize("n", range(4))
def test_plain(n):
    _record(f"plain{n}")

@pytest.mark.parametrize("n", range(2))
def test_on_the_cluster(cluster, n):
    _record(f"cluster{n}")
"""


@pytest.mark.parametrize("dist", [["--dist", "loadgroup"], []], ids=["loadgroup", "plain-n"])
def test_a_modules_tests_share_a_worker_and_so_do_all_cluster_tests(tmp_path: Path, dist: list[str]) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("test_one", "test_two", "test_three"):
        (tmp_path / f"{name}.py").write_text(MODULE)
    where_ran = tmp_path / "where_ran.jsonl"
    env = {**os.environ, "WHERE_RAN": str(where_ran), "PYTHONPATH": str(ROOT)}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only xdist, named below: a quicker start on a loaded machine
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("OVERSPILL_XDIST_GROUPS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-n", "3", *dist, "-p", "no:cacheprovider",
         "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [json.loads(line) for line in where_ran.read_text().splitlines()]
    assert len(ran) == 18
    workers: dict[str, set[str]] = {}
    for test, worker in ran:
        group = "cluster" if "::cluster" in test else test.split("::")[0]
        workers.setdefault(group, set()).add(worker)
    assert set(workers) == {"cluster", "test_one", "test_two", "test_three"}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) >= 2, "the groups were spread over the workers"


def test_the_queue_hands_out_the_heaviest_group_first() -> None:
    weights = {"small": 3.0, "one_slow_test": 150.0, "many_tests": 40.0}
    queue = HeaviestFirst(weights.__getitem__)
    for scope in ("many_tests", "small", "one_slow_test"):
        queue[scope] = {f"{scope}::t": False}
    assert [queue.popitem(last=False)[0] for _ in range(3)] == ["one_slow_test", "many_tests", "small"]
    assert not queue
