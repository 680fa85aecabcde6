"""The `overspill` CLI as a user scripts it: each command as a whole process against a running broker, as a ratio to
the bare interpreter measured in the same run (issue 31: `--help` and HTTP commands within 10x of `python -c
pass`; `report run` on a small ledger under 1.5 s).

What it does:
  1. Makes a temporary data folder with a SQLite database holding a small ledger (`--entries`, default 6, for the
     bootstrap tenant `demo`, in October 2026) and starts `overspill serve --no-loop` on a free 127.0.0.1 port
     against it (the loop is off so the broker's own ticks do not load the machine while commands are timed).
  2. Runs every command `--runs` times (default 7), round robin (so a burst of load from elsewhere falls on all
     commands alike), each as a fresh process: `python -c pass` (the baseline), `--help`, `jobs`, `pools`,
     `quote FILE`, `submit FILE`, `costs` (HTTP), and `report run --period 2026-10` (opens the database).
  3. Prints each command's median wall seconds and its ratio to the baseline's median, and the same for CPU
     seconds (user + system of the child process): on a machine shared with other work the wall figures stretch
     with the load, the CPU figures much less.

Run (from the repository root):
    python benchmarks/cli_bench.py
    python benchmarks/cli_bench.py --runs 11 --json

`--json` prints one object: {"runs", "baseline_s", "baseline_cpu_s", "commands": {NAME: {"median_s", "ratio",
"cpu_s", "cpu_ratio", "target", "within_target"}}, "machine"}; `within_target` judges the wall figures.
Timings are of the whole process, start to exit; nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OCT = datetime(2026, 10, 1, tzinfo=UTC)
JOB = """name: bench
team: vision
image: ghcr.io/acme/train:1.4
accelerators: [A100]
gpu_count: 1
work_gpu_hours: "2"
max_total_usd: "40"
"""
HTTP_RATIO = 10.0  # --help and HTTP commands: within 10x of the bare interpreter
REPORT_SECONDS = 1.5  # report run on a small ledger


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli() -> list[str]:
    """The installed `overspill` entry point beside this interpreter, else the same through `-c`."""
    script = Path(sys.executable).parent / "overspill"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from broker.cli.main import main; main()"]


def _seed(data: Path, entries: int) -> None:
    """A database with the bootstrap tenant's small ledger (in this process: not part of any timing)."""
    from broker.config.settings import Settings
    from broker.runtime import build_runtime
    from tests.finance_data import seed_ledger

    rt = build_runtime(Settings(data_dir=data, simulated=True))
    seed_ledger(rt.engine, "demo", OCT, days=3, entries=entries)
    rt.engine.dispose()


def _wait_up(url: str, server: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"overspill serve exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"overspill serve did not answer at {url} within {timeout:.0f} s")


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv` as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.decode()[-500:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs of each command (the median is reported)")
    ap.add_argument("--entries", type=int, default=6, help="ledger entries for `report run`")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cli = _cli()
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        _seed(data, args.entries)
        spec = tmp / "job.yaml"
        spec.write_text(JOB)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
        env = {**clean, "OVERSPILL_DATA_DIR": str(data), "OVERSPILL_URL": url, "COLUMNS": "120"}
        server = subprocess.Popen(
            [*cli, "serve", "--port", str(port), "--no-loop"],
            env=env,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "serve.log").open("wb"),
        )
        try:
            _wait_up(url, server)
            out = tmp / "reports"
            commands: dict[str, tuple[list[str], str]] = {
                "python -c pass": ([sys.executable, "-c", "pass"], "baseline"),
                "--help": ([*cli, "--help"], "http"),
                "jobs": ([*cli, "jobs"], "http"),
                "pools": ([*cli, "pools", "--limit", "20"], "http"),
                "quote": ([*cli, "quote", str(spec)], "http"),
                "submit": ([*cli, "submit", str(spec)], "http"),
                "costs": ([*cli, "costs", "--from", "2026-10-01T00:00:00Z", "--to", "2026-11-01T00:00:00Z"], "http"),
                "report run": ([*cli, "report", "run", "--period", "2026-10", "--out", str(out)], "report"),
            }
            for command, _ in commands.values():  # warm the file cache once; not counted
                _timed(command, env, tmp)
            times: dict[str, list[float]] = {name: [] for name in commands}
            cpu: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.runs):
                for name, (command, _) in commands.items():
                    wall, used = _timed(command, env, tmp)
                    times[name].append(wall)
                    cpu[name].append(used)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    baseline = statistics.median(times["python -c pass"])
    baseline_cpu = statistics.median(cpu["python -c pass"])
    results: dict[str, Any] = {}
    for name, (_, kind) in commands.items():
        median = statistics.median(times[name])
        ratio = median / baseline if baseline > 0 else float("inf")
        cpu_median = statistics.median(cpu[name])
        row: dict[str, Any] = {
            "median_s": round(median, 4),
            "ratio": round(ratio, 2),
            "cpu_s": round(cpu_median, 4),
            "cpu_ratio": round(cpu_median / baseline_cpu, 2) if baseline_cpu > 0 else None,
        }
        if kind == "http":
            row |= {"target": f"ratio <= {HTTP_RATIO:g}", "within_target": ratio <= HTTP_RATIO}
        elif kind == "report":
            row |= {"target": f"median_s < {REPORT_SECONDS:g}", "within_target": median < REPORT_SECONDS}
        else:
            row |= {"target": "", "within_target": True}
        results[name] = row
    machine = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "cli": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cli)),
    }
    report = {
        "runs": args.runs,
        "baseline_s": round(baseline, 4),
        "baseline_cpu_s": round(baseline_cpu, 4),
        "commands": results,
        "machine": machine,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.runs} runs each, round robin; load average {machine['load_avg']} on {machine['cpus']} CPUs")
    print(f"{'command':<16} {'median s':>9} {'x python':>9} {'CPU s':>7} {'x python':>9}  target (wall)")
    for name, row in results.items():
        mark = "" if not row["target"] else ("ok" if row["within_target"] else "MISSED")
        cpu_ratio = f"{row['cpu_ratio']:>9.1f}" if row["cpu_ratio"] is not None else f"{'-':>9}"
        print(
            f"{name:<16} {row['median_s']:>9.3f} {row['ratio']:>9.1f} {row['cpu_s']:>7.3f} {cpu_ratio}  "
            f"{row['target']} {mark}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
