"""Attack: a YAML "billion laughs" job spec (a few hundred bytes of nested aliases) handed to `overspill submit` or
`overspill quote` made the CLI expand it to hundreds of MB before sending. The loader now refuses aliases (and
files over 1 MB) before anything is expanded, naming the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEVELS = 8


def _bomb() -> str:
    lines = ["name: bomb", 'image: "ghcr.io/acme/train:1.0"', 'l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, LEVELS):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"command: *l{LEVELS - 1}")
    return "\n".join(lines) + "\n"


# the child prints its own peak resident memory (VmHWM, kB) as it exits: getrusage would also count the pages of
# the (large) test process it was forked from
_CLI = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('VMHWM', open('/proc/self/status').read().split('VmHWM:')[1].split()[0],"
    " file=sys.stderr))\n"
    "from broker.cli.main import main\n"
    "main()\n"
)


def _run_cli(*args: str) -> tuple[int, str, int]:
    """The real CLI in a child process: (exit code, output, peak resident memory in MB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(PYTHONPATH=str(ROOT), OVERSPILL_URL="http://127.0.0.1:9", OVERSPILL_API_KEY="ovs_x_" + "y" * 20)
    done = subprocess.run(
        [sys.executable, "-c", _CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    peak_kb = int(done.stderr.rsplit("VMHWM", 1)[1].split()[0])
    return done.returncode, done.stdout + done.stderr, peak_kb // 1024


@pytest.mark.parametrize("command", ["submit", "quote"])
def test_yaml_alias_bomb_spec_is_refused_before_it_expands(tmp_path: Path, command: str) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    assert bomb.stat().st_size < 600
    code, output, peak_mb = _run_cli(command, str(bomb))
    assert code != 0
    assert "alias" in output and "bomb.yaml" in output, output
    assert peak_mb < 150, f"the CLI reached {peak_mb} MB on a {bomb.stat().st_size}-byte file"


def test_oversized_spec_file_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: big\ncommand: [" + ", ".join(['"x"'] * 300_000) + "]\n")
    code, output, _ = _run_cli("submit", str(big))
    assert code != 0 and "larger than" in output, output


def test_spec_without_aliases_still_loads(tmp_path: Path) -> None:
    from broker.cli.main import _load_spec

    spec = tmp_path / "job.yaml"
    spec.write_text('name: ok\nimage: "ghcr.io/acme/train:1.0"\ncommand: [python, train.py]\nanchored: &a 1\n')
    assert _load_spec(spec)["command"] == ["python", "train.py"]
