"""Named crash points for the crash-consistency harness: `crashpoint(name)` kills this process with SIGKILL when
the environment asks for it, and does nothing otherwise.

`OVERSPILL_CRASHPOINT="name"` kills the process the first time `crashpoint("name")` is reached;
`"name:N"` the N-th time (counted per process). Unset (production), a call costs one dictionary lookup: the
variable is read once per process. SIGKILL is used on purpose: no `finally`, no atexit, no transaction rollback
sent to the database, no buffered log flushed. It is what a power cut or an OOM kill does to the broker.

Points placed in the code (see README, "Reliability and security"):
- `place.after_commit`: a placement (and its launch token) is recorded, the cloud not yet asked;
- `launch.after_cloud_call`: the cloud accepted the launch, the instance id is not yet recorded;
- `preempt.before_commit`: an interruption notice was taken (placement preempted, zone blocked), not committed;
- `sync.after_terminate`: a cancelled or over-ceiling placement's instance was terminated, not committed;
- `accrue.before_commit` / `accrue.after_commit`: a ledger entry written but not committed / committed;
- `copy.between_parts`: a checkpoint copy uploaded a part (the next one not started).
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "OVERSPILL_CRASHPOINT"


class _Armed:
    """The point this process should die at (parsed once) and how often each point was reached."""

    def __init__(self, spec: str) -> None:
        name, _, nth = spec.partition(":")
        self.name = name.strip()
        self.nth = int(nth) if nth.strip() else 1
        self.seen = 0
        self.lock = threading.Lock()


_state: dict[str, _Armed | None] = {}


def _armed() -> _Armed | None:
    if "armed" not in _state:
        spec = os.environ.get(ENV, "").strip()
        _state["armed"] = _Armed(spec) if spec else None
    return _state["armed"]


def crashpoint(name: str) -> None:
    """SIGKILL this process if `OVERSPILL_CRASHPOINT` names this point and this is its N-th arrival."""
    armed = _armed()
    if armed is None or armed.name != name:
        return
    with armed.lock:
        armed.seen += 1
        due = armed.seen >= armed.nth
    if due:
        os.kill(os.getpid(), signal.SIGKILL)


def reset() -> None:
    """Re-read the environment (tests that change `OVERSPILL_CRASHPOINT` within one process)."""
    _state.clear()
