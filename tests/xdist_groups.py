"""Which tests share a pytest-xdist worker (`make test` runs `pytest -n N --dist loadgroup`; `-n N` alone, or with
`--dist load`, is scheduled the same way), and a scheduler that keeps them together.

Every test of a module runs in one worker, as with `--dist loadfile`, so its module fixtures start once. Besides:
- every test on the session's one Slurm cluster (its closure holds the `cluster` fixture) runs in one worker: the
  cluster's Unix users and sudoers file belong to the machine;
- the podman tests share one worker (one container store, one image cache);
- the Terraform example's tests share one worker: one deployment, applied, read by them all, then destroyed.

pytest-xdist 3.8's own `loadgroup` tags an item's group by rewriting `item._nodeid`, which pytest 9.2 no longer
reads (a node keeps its id in `_id`), so its groups are silently ignored. Here each worker writes the groups of
the tests it collected to a file (a directory named by `OVERSPILL_XDIST_GROUPS`, made by the controller before
the workers start), and `GroupScheduling` hands out whole groups, the heaviest first: a test weighs the seconds
of its `slow(seconds)` marker, else 1, so a group holding one long test does not start last and end the run alone.
Contract: `group_of(item)` is a pure function of the item; tests absent from the files fall back to their module.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

GROUPS_ENV = "OVERSPILL_XDIST_GROUPS"
PODMAN_MODULES = frozenset({"test_agent_podman.py", "test_agent_protocol.py", "test_e2e_slurm_container.py"})


def group_of(item: pytest.Item) -> str:
    """The worker group of a collected test."""
    if "cluster" in getattr(item, "fixturenames", ()):
        return "slurm"
    if item.path.name in PODMAN_MODULES:
        return "podman"
    if item.get_closest_marker("terraform_deployment") or item.get_closest_marker("terraform_destroy"):
        return "terraform"
    return module_of(item.nodeid)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def weight_of(item: pytest.Item) -> float:
    """About how many seconds the test takes: its `slow(seconds)` marker's, else 1."""
    slow = item.get_closest_marker("slow")
    return float(slow.args[0]) if slow and slow.args else 1.0


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not _distributed(config):
        return
    where = tempfile.mkdtemp(prefix="overspill-xdist-groups-")
    os.environ[GROUPS_ENV] = where  # the workers, started after this hook, inherit it
    config.add_cleanup(lambda: shutil.rmtree(where, ignore_errors=True))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller is done with the groups once the session ends: remove them before tests/leak_check.py looks."""
    where = os.environ.get(GROUPS_ENV)
    if where and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(where, ignore_errors=True)


def _distributed(config: pytest.Config) -> bool:
    """Workers that hand out tests one by one (`-n N` alone means `--dist load`): the suite needs its groups."""
    return bool(config.getoption("numprocesses", None)) and config.getoption("dist", "no") in ("load", "loadgroup")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which tells the controller the collection is complete
def pytest_collection_finish(session: pytest.Session) -> None:
    """In a worker: write the groups of the tests it collected (-k, -m and the reorders done) for the scheduler."""
    worker, where = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(GROUPS_ENV)
    if not worker or not where:
        return
    groups = {item.nodeid: (group_of(item), weight_of(item)) for item in session.items}
    path = Path(where) / f"{worker}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not _distributed(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """`loadscope` with the workers' groups as its scopes (read once every worker has collected), heaviest
        first."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.groups: dict[str, tuple[str, float]] | None = None
            self.weights: dict[str, float] = {}
            self.workqueue = HeaviestFirst(self.weight)

        def _split_scope(self, nodeid: str) -> str:
            return self._read()[0].get(nodeid, (module_of(nodeid), 1.0))[0]

        def weight(self, scope: str) -> float:
            return self._read()[1].get(scope, 0.0)

        def _read(self) -> tuple[dict[str, tuple[str, float]], dict[str, float]]:
            if self.groups is None:
                self.groups, self.weights = {}, {}
                for path in sorted(Path(os.environ[GROUPS_ENV]).glob("*.json")):
                    self.groups.update({k: (g, w) for k, (g, w) in json.loads(path.read_text()).items()})
                for group, weight in self.groups.values():
                    self.weights[group] = self.weights.get(group, 0.0) + weight
            return self.groups, self.weights

    return GroupScheduling(config, log)


class HeaviestFirst(OrderedDict[str, Any]):
    """The scheduler's queue of scopes: `popitem(last=False)`, how it takes the next one, takes the heaviest."""

    def __init__(self, weight: Callable[[str], float]) -> None:
        super().__init__()
        self.weight = weight

    def popitem(self, last: bool = True) -> tuple[str, Any]:
        if last or not self:
            return super().popitem(last)
        scope = max(self, key=self.weight)
        return scope, self.pop(scope)
