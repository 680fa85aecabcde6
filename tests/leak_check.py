"""The run fails when its tests leave a process, a listening port or a temporary folder behind (a pytest plugin).

At its start the controlling pytest process (the only one without pytest-xdist) makes itself the "child subreaper"
of everything it starts (Linux `prctl(PR_SET_CHILD_SUBREAPER)`): a process left by a test stays its descendant
even after the worker or the daemonising parent that started it has exited. It also gives the run a temporary
directory of its own (`TMPDIR`, inherited by the workers and everything they start; pytest's `tmp_path` stays in
the system's, with pytest's own retention).

When the session finishes (in the controller after the xdist workers are gone):
- every descendant process still alive (after a short grace for those exiting) is a leak: reported with its
  command line and the ports it listens on, then killed;
- every listening TCP socket a pytest process still holds once its session fixtures are torn down is a leak
  (each worker reports its own to the controller);
- everything left in the run's temporary directory is a leak: reported, then removed.
Any leak sets the exit status to "tests failed" and is listed in a `leaked by the tests` section. The helpers
Python itself keeps for the life of a process (multiprocessing's resource tracker and fork server) are not leaks.

A resource meant to live for the whole session must therefore be released by session teardown (a session
fixture's finalizer, or `pytest_sessionfinish`), not by `config.add_cleanup` or `atexit`, which run later.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

RUN_TMP_PREFIX = "overspill-run-"
GRACE_SECONDS = 5.0
PR_SET_CHILD_SUBREAPER = 36
PYTHON_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

_RUN_TMP = pytest.StashKey[Path]()
_BEFORE = pytest.StashKey[set[int]]()
_FROM_WORKERS = pytest.StashKey[list[str]]()


class Leak:
    """One leak, as the terminal reporter's summary line counts it ("3 passed, 1 leaked"); other plugins read the
    reporter's entries as objects with attributes."""

    count_towards_summary = True

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _is_worker() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


# --- what the machine says (Linux /proc) --------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def descendants(root: int) -> dict[int, str]:
    """The live (not zombie) descendants of `root`: pid -> state."""
    parents: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            parents.setdefault(found[0], []).append(int(entry))
            states[int(entry)] = found[1]
    seen: dict[int, str] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen[pid] = states.get(pid, "?")
        todo.extend(parents.get(pid, []))
    return {pid: state for pid, state in seen.items() if state != "Z"}


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def listening_ports() -> dict[int, str]:
    """socket inode -> "address:port" of every listening TCP socket of this network namespace."""
    found: dict[int, str] = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
            host = socket.inet_ntop(family, raw)
            found[int(fields[9])] = f"{host if family == socket.AF_INET else f'[{host}]'}:{int(port, 16)}"
    return found


def ports_of(pid: int, listening: dict[int, str]) -> list[str]:
    ports = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and (inode := int(target[8:-1])) in listening:
                    ports.append(listening[inode])
    return sorted(set(ports))


def _reap_zombie_children() -> None:
    """Orphans reparented to this subreaper that have exited: collect them (they are not leaks)."""
    for pid in list(descendants_including_zombies(os.getpid())):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def descendants_including_zombies(root: int) -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None and found[0] == root and found[1] == "Z":
            zombies.append(int(entry))
    return zombies


# processes a tool keeps for the machine on purpose, not a test's leftovers: podman's pause process, which holds its
# namespaces for every later podman command (killing it would only make the next one start another)
KEPT_BY_DESIGN = ("catatonit -P",)
# files a library caches in the temporary directory for the next process (lark, used by python-hcl2, keeps its
# parsed grammar there)
LIBRARY_CACHES = (".lark_cache_",)


def leaked_processes(before: set[int]) -> dict[int, str]:
    """Descendants of this process started during the run and still alive after the grace: pid -> command line."""
    deadline = time.monotonic() + GRACE_SECONDS
    while True:
        _reap_zombie_children()
        alive = {pid: command_line(pid) for pid in descendants(os.getpid()) if pid not in before}
        alive = {pid: cmd for pid, cmd in alive.items() if not any(h in cmd for h in PYTHON_HELPERS)}
        alive = {pid: cmd for pid, cmd in alive.items() if not cmd.startswith(KEPT_BY_DESIGN)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


# --- the plugin ------------------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before other plugins make temporary folders or start workers
def pytest_configure(config: pytest.Config) -> None:
    if _is_worker():
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    config.stash[_BEFORE] = set(descendants(os.getpid()))
    config.stash[_FROM_WORKERS] = []
    system_tmp = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system_tmp)  # tmp_path keeps pytest's own place and retention
    run_tmp = Path(tempfile.mkdtemp(prefix=RUN_TMP_PREFIX, dir=system_tmp))
    run_tmp.chmod(0o1777 | stat.S_ISVTX)  # like /tmp: the Slurm job users write there too
    config.stash[_RUN_TMP] = run_tmp
    os.environ["TMPDIR"] = str(run_tmp)
    tempfile.tempdir = None  # tempfile caches its answer: ask again


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down (and, in xdist, the workers are gone)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    gc.collect()  # a socket only the garbage collector still holds closes now; one a live object holds is a leak
    listening = listening_ports()
    own_ports = ports_of(os.getpid(), listening)
    if _is_worker():
        if own_ports and hasattr(config, "workeroutput"):
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            config.workeroutput["leaked"] = [f"{worker} still listens on {', '.join(own_ports)}"]
        return
    if _RUN_TMP not in config.stash:
        return
    leaks = list(config.stash[_FROM_WORKERS])
    if own_ports:
        leaks.append(f"pytest (pid {os.getpid()}) still listens on {', '.join(own_ports)}")
    processes = leaked_processes(config.stash[_BEFORE])
    listening = listening_ports()
    for pid, cmd in sorted(processes.items()):
        ports = ports_of(pid, listening)
        listens = f" (listening on {', '.join(ports)})" if ports else ""
        leaks.append(f"process {pid} still runs: {cmd[:300]}{listens}")
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    run_tmp = config.stash[_RUN_TMP]
    with contextlib.suppress(OSError):
        for entry in sorted(run_tmp.iterdir()):
            if entry.name.startswith(LIBRARY_CACHES):
                continue
            kind = "folder" if entry.is_dir() and not entry.is_symlink() else "file"
            leaks.append(f"temporary {kind} left: {entry.name} (in {tempfile.gettempdir()})")
    shutil.rmtree(run_tmp, ignore_errors=True)
    _reap_zombie_children()
    if not leaks:
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "leaked by the tests (tests/leak_check.py)", red=True, bold=True)
        for leak in leaks:
            reporter.write_line(leak)
        reporter.stats.setdefault("leaked", []).extend(Leak(leak) for leak in leaks)
    else:
        print("leaked by the tests:", *leaks, sep="\n  ")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", None) or {}
    config = getattr(node, "config", None)
    if config is not None and _FROM_WORKERS in config.stash:
        config.stash[_FROM_WORKERS].extend(output.get("leaked", []))
