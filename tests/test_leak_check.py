"""The leak check (tests/leak_check.py): a run whose test leaves a process, a listening port or a temporary folder
behind fails and names it, with or without pytest-xdist workers, and the check cleans up what it found; a run that
leaves nothing passes. Each case runs pytest in a subprocess on a planted test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LEAKS = {
    "process": (
        "import subprocess, os\n"
        "def test_leaves_a_sleep():\n"
        "    proc = subprocess.Popen(['sleep', '60'])\n"
        "    open(os.environ['PLANTED'], 'w').write(str(proc.pid))\n",
        "still runs: sleep 60",
    ),
    "port": (
        "import socket\n"
        "KEPT = []\n"
        "def test_leaves_a_listening_socket():\n"
        "    sock = socket.socket()\n"
        "    sock.bind(('127.0.0.1', 0))\n"
        "    sock.listen()\n"
        "    KEPT.append(sock)\n",
        "still listens on 127.0.0.1:",
    ),
    "folder": (
        "import tempfile\ndef test_leaves_a_temporary_folder():\n    tempfile.mkdtemp(prefix='planted-leak-')\n",
        "temporary folder left: planted-leak-",
    ),
}
CLEAN = (
    "import subprocess, tempfile, socket\n"
    "def test_cleans_up():\n"
    "    subprocess.run(['true'], check=True)\n"
    "    with tempfile.TemporaryDirectory():\n"
    "        pass\n"
    "    with socket.socket() as sock:\n"
    "        sock.bind(('127.0.0.1', 0))\n"
    "        sock.listen()\n"
)


def run_pytest(tmp_path: Path, source: str, workers: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_planted.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANTED": str(tmp_path / "planted.pid")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the plugins named here: a quicker start
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-p", "tests.leak_check", "-p", "no:cacheprovider",
         "-c", "/dev/null", "--rootdir", str(tmp_path), *workers, str(tmp_path / "test_planted.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_a_leak_fails_the_run_and_is_named_and_cleaned_up(tmp_path: Path, leak: str, workers: list[str]) -> None:
    source, message = LEAKS[leak]
    done = run_pytest(tmp_path, source, workers)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 passed" in output, output  # the test itself passed: the leak alone failed the run
    assert "leaked by the tests" in output and message in output, output
    if leak == "process":
        pid = int((tmp_path / "planted.pid").read_text())
        assert not _alive(pid), f"the leaked sleep {pid} was not killed"


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_run_that_cleans_up_passes(tmp_path: Path, workers: list[str]) -> None:
    done = run_pytest(tmp_path, CLEAN, workers)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "leaked" not in output, output


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
