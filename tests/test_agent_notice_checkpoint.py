"""The agent's wait for the workload's notice checkpoint (agent/main.py `Agent._preempted`), in-process, with the
fastest workload there can be: one whose checkpoint is on disk before the agent's `signal` call returns.

A real workload does that only sometimes (it saves in its signal handler and exits within one poll), which made
the end-to-end test (tests/test_agent_run.py) fail under CI load: the agent took the checkpoint the notice
produced for the one it had before, waited for a newer one, and never logged "the workload checkpointed at".
Here the order is forced, so the test fails every time without the fix.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from agent import protocol as p
from agent.main import PROGRESS_NAME, Agent, Options
from agent.runtime import Workload
from tests.agent_harness import FileReader, make_spec


class InstantSaver(Workload):
    """Saves checkpoint `at` and exits 0 inside `signal()`; before that it has declared checkpoint `before`."""

    def __init__(self, run_dir: Path, before: float, at: float) -> None:
        self.progress = run_dir / PROGRESS_NAME
        self.at = at
        self.exited = False
        self._declare(before)

    def _declare(self, checkpoint: float) -> None:
        self.progress.parent.mkdir(parents=True, exist_ok=True)
        self.progress.write_text(json.dumps({"done": checkpoint, "total": 200, "checkpoint": checkpoint}))

    def signal(self, sig: signal.Signals) -> None:
        self._declare(self.at)
        self.exited = True

    def wait(self, timeout: float | None = None) -> int | None:
        return 0 if self.exited else None

    def poll(self) -> int | None:
        return self.wait()

    def stop(self, grace: float) -> int:
        raise AssertionError("a workload that exited on its own is not stopped")


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)


class NoReports:
    def send(self, *_: object, **__: object) -> None:
        pass


def _preempt(tmp_path: Path, before: float, at: float) -> list[str]:
    """An agent that has seen the workload's checkpoint `before` hears a preempt notice; the workload saves `at`
    and exits inside the signal. Returns what the agent logged."""
    agent = Agent(Options(spec_uri="file:///unused", work_dir=tmp_path / "work"), env={})
    spec = make_spec(FileReader(tmp_path / "store"))
    notes = Notes()
    agent.logs, agent.reporter = notes, NoReports()  # type: ignore[assignment]
    agent.notice_signal = signal.SIGUSR1
    agent.workload = workload = InstantSaver(agent.run_dir, before=before, at=at)
    agent.state.progress = p.parse_progress(workload.progress.read_bytes())
    agent._on_notice(p.Notice(p.NoticeSource.AWS, "preempt", "2026-12-02T00:00:00Z", None))
    assert agent._preempted(workload, spec) == 0, "the workload's own exit code"
    return notes.lines


def test_a_checkpoint_saved_before_the_signal_returns_is_the_notices(tmp_path: Path) -> None:
    lines = _preempt(tmp_path, before=50.0, at=74.0)
    assert "the workload checkpointed at 74.0" in lines, lines


def test_no_new_checkpoint_is_not_reported_as_one(tmp_path: Path) -> None:
    """The other side: a workload that exits on the notice without saving has no notice checkpoint logged."""
    lines = _preempt(tmp_path, before=50.0, at=50.0)
    assert not any("checkpointed at" in line for line in lines), lines
