"""Security figures for the finance findings: what a bill-upload bomb costs the broker, and what 100 hanging report
deliveries do to the API's latency. Nothing asserts; it prints.

Sub-commands (each runs real processes: `uvicorn --factory broker.app:app_from_env` on a fresh SQLite database):

  bills  Uploads, one fresh API process each, through `POST /v1/costs/bills` with a finance key: a .csv.gz bomb
         (valid FOCUS rows repeated, ~300 KB inflating ~330:1), a Parquet bomb (one ResourceId repeated through a
         dictionary page: ~10 KB on disk, 1.1 GB decoded) and, for reference, a legitimate bill (`--legit-rows`
         varied rows, .csv.gz). For each: the answer, wall time, the server's CPU seconds for the upload and its
         RSS before and at peak (/proc, polled every 20 ms). A server passing `--rss-cap-mb` or `--timeout` is
         killed and reported so (the code before the fix gets there). `OVERSPILL_MAX_REQUEST_BYTES` is raised to
         32 MB so the legitimate bill fits.
  hang   `--workers` API processes and an `overspill tick --loop` process (the control loop, which delivers), a
         tarpit (accepts, never answers) as the webhook of `--runs` report runs posted at once, and `--requests`
         `GET /v1/whoami` (`--clients` at a time) measured idle and then while the runs hang: p50/p99/max, client
         timeouts (`--get-timeout`), how long the report-run POSTs took and how many connections reached the tarpit.

`--code DIR` runs the servers from another checkout (e.g. `git archive main | tar -x -C /tmp/main`) to print the
figures before the fix; the tests' helpers (tarpit, bombs) always come from this tree.

    python benchmarks/security_bench.py bills
    python benchmarks/security_bench.py bills --code /tmp/main --rss-cap-mb 3000 --timeout 300
    python benchmarks/security_bench.py hang --runs 100 --workers 2
    python benchmarks/security_bench.py hang --code /tmp/main --json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT)]

from broker.config.settings import DEV_API_KEY  # noqa: E402
from tests.api_process import wait_healthy  # noqa: E402
from tests.bill_bombs import HEADER, gzip_bomb, parquet_bomb  # noqa: E402
from tests.moto_server import free_port  # noqa: E402
from tests.tarpit import Tarpit  # noqa: E402

AUTH = {"Authorization": f"Bearer {DEV_API_KEY}"}
TICK = os.sysconf("SC_CLK_TCK")


def _env(code: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSPILL_")}
    env.update(
        PYTHONPATH=str(code),
        OVERSPILL_DATABASE_URL=f"sqlite:///{tmp / 'bench.db'}",
        OVERSPILL_DATA_DIR=str(tmp),
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_SIMULATED="false",
        OVERSPILL_RATE_LIMIT_PER_SECOND="0",
        OVERSPILL_LOG_LEVEL="error",
        **extra,
    )
    return env


def _prepare(code: Path, env: dict[str, str]) -> None:
    """Migrate the database with the code under test (several workers must not race to do it)."""
    script = (
        "from broker.runtime import build_runtime; from broker.config.settings import Settings; "
        "build_runtime(Settings())"
    )
    subprocess.run([sys.executable, "-c", script], cwd=code, env=env, check=True)


def _serve(code: Path, env: dict[str, str], log: Path, workers: int = 1) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "broker.app:app_from_env", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return url, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


# -- bills ---------------------------------------------------------------------------------------------------------


def _legit_bill(rows: int) -> bytes:
    """A realistic FOCUS CSV: hourly rows of a few hundred instances, varied costs."""
    rng = random.Random(7)
    lines = [HEADER]
    for i in range(rows):
        instance = f"arn:aws:ec2:us-east-1:123456789012:instance/i-{rng.randrange(400):017x}"
        hour = i % (31 * 24)
        cost = f"{rng.uniform(0.5, 40):.10f}"
        start = f"2026-10-{1 + hour // 24:02d}T{hour % 24:02d}:00:00Z"
        lines.append(f"{instance},{cost},{cost},{float(cost) * 3:.10f},{start},AWS\n".encode())
    return gzip.compress(b"".join(lines), 6)


def _upload(code: Path, name: str, content: bytes, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bills-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        env = _env(code, tmp, OVERSPILL_MAX_REQUEST_BYTES=str(32 * 1024 * 1024))
        url, proc = _serve(code, env, tmp / "api.log")
        try:
            httpx.get(f"{url}/v1/whoami", headers=AUTH, timeout=10)
            before_rss, before_cpu = _rss_mb(proc.pid), _cpu_s(proc.pid)
            peak = [before_rss]
            killed: list[str] = []
            done = threading.Event()

            def watch() -> None:
                started = time.monotonic()
                while not done.wait(0.02):
                    rss = _rss_mb(proc.pid)
                    peak[0] = max(peak[0], rss)
                    if rss > args.rss_cap_mb or time.monotonic() - started > args.timeout:
                        killed.append(f"killed at {rss:.0f} MB after {time.monotonic() - started:.0f} s")
                        cpu = _cpu_s(proc.pid)
                        proc.kill()
                        peak.append(cpu)
                        return

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t = time.perf_counter()
            try:
                answer = httpx.post(
                    f"{url}/v1/costs/bills",
                    params={"filename": name, "provider": "aws"},
                    content=content,
                    headers=AUTH,
                    timeout=args.timeout + 30,
                )
                status, message = answer.status_code, answer.json().get("message", "")[:110]
            except httpx.HTTPError as exc:
                status, message = 0, type(exc).__name__
            wall = time.perf_counter() - t
            done.set()
            watcher.join()
            cpu = (peak.pop() if killed else _cpu_s(proc.pid)) - before_cpu
            return {
                "file": name,
                "bytes": len(content),
                "status": status,
                "message": killed[0] if killed else message,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "rss_before_mb": round(before_rss),
                "rss_peak_mb": round(max(peak)),
            }
        finally:
            _stop(proc)


def bills(args: argparse.Namespace) -> dict[str, Any]:
    code = Path(args.code).resolve()
    with tempfile.TemporaryDirectory() as tmp_dir:
        parquet = Path(tmp_dir) / "bomb.parquet"
        parquet_bomb(parquet, rows=args.parquet_rows, value_bytes=args.parquet_value_bytes)
        uploads = [
            ("bomb.csv.gz", gzip_bomb(args.gz_inflated_mb * 1024 * 1024)),
            ("bomb.parquet", parquet.read_bytes()),
            ("legit.csv.gz", _legit_bill(args.legit_rows)),
        ]
        results = [_upload(code, name, content, args) for name, content in uploads]
    return {"code": str(code), "uploads": results}


# -- hang ----------------------------------------------------------------------------------------------------------


def _gets(url: str, n: int, clients: int, timeout: float) -> dict[str, Any]:
    def one(_: int) -> float:
        t = time.perf_counter()
        try:
            ok = httpx.get(f"{url}/v1/whoami", headers=AUTH, timeout=timeout).status_code == 200
        except httpx.HTTPError:
            ok = False
        took = time.perf_counter() - t
        return took if ok else float("inf")

    with ThreadPoolExecutor(clients) as pool:
        samples = sorted(pool.map(one, range(n)))
    timeouts = sum(1 for s in samples if s == float("inf"))

    def ms(q: float) -> str | float:  # a timed-out request counts as slower than any answer
        value = samples[min(len(samples) - 1, int(q * len(samples)))]
        return "timeout" if value == float("inf") else round(value * 1000, 1)

    return {"requests": n, "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": ms(1.0), "timeouts": timeouts}


def hang(args: argparse.Namespace) -> dict[str, Any]:
    code = Path(args.code).resolve()
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp_dir, Tarpit("silent") as pit:
        tmp = Path(tmp_dir)
        env = _env(code, tmp, OVERSPILL_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]')
        _prepare(code, env)
        url, api = _serve(code, env, tmp / "api.log", workers=args.workers)
        loop_cmd = [
            sys.executable,
            "-c",
            "import sys; from broker.cli.main import main; sys.argv[1:] = ['tick', '--loop']; main()",
        ]
        with open(tmp / "loop.log", "wb") as out:  # ticking every second: it starts delivering at once
            loop_env = {**env, "OVERSPILL_TICK_INTERVAL_SECONDS": "1"}
            loop = subprocess.Popen(loop_cmd, cwd=code, env=loop_env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _gets(url, 50, args.clients, args.get_timeout)  # warm up
            idle = _gets(url, args.requests, args.clients, args.get_timeout)
            posts: list[float] = []
            statuses: dict[str, int] = {}

            def post(i: int) -> None:
                body = {"period": "2026-10", "destination": {"type": "webhook", "url": f"{pit.url}/hook/{i}"}}
                t = time.perf_counter()
                try:
                    answer = httpx.post(f"{url}/v1/report-runs", json=body, headers=AUTH, timeout=120)
                    outcome = str(answer.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                posts.append(time.perf_counter() - t)
                statuses[outcome] = statuses.get(outcome, 0) + 1

            senders = ThreadPoolExecutor(args.runs)
            for i in range(args.runs):
                senders.submit(post, i)
            time.sleep(1.0)
            held = [0]
            measuring = threading.Event()

            def sample() -> None:
                while not measuring.wait(0.1):
                    held[0] = max(held[0], pit.open)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            during = _gets(url, args.requests, args.clients, args.get_timeout)
            measuring.set()
            sampler.join()
            senders.shutdown(wait=True)
            posts.sort()
            return {
                "code": str(code),
                "workers": args.workers,
                "runs": args.runs,
                "idle": idle,
                "during": during,
                "report_run_posts": {
                    "statuses": statuses,
                    "p50_s": round(statistics.median(posts), 2),
                    "max_s": round(posts[-1], 2),
                },
                "tarpit_connections_held_while_measuring": held[0],
                "tarpit_connections_total": pit.connections,
            }
        finally:
            _stop(loop)
            _stop(api)


# -- report --------------------------------------------------------------------------------------------------------


def _print_bills(result: dict[str, Any]) -> None:
    print(f"bill uploads, code from {result['code']}")
    print(f"{'file':<14}{'bytes':>9}{'status':>8}{'wall s':>9}{'cpu s':>8}{'rss MB':>9}{'peak MB':>9}  answer")
    for u in result["uploads"]:
        print(
            f"{u['file']:<14}{u['bytes']:>9}{u['status']:>8}{u['wall_s']:>9}{u['cpu_s']:>8}"
            f"{u['rss_before_mb']:>9}{u['rss_peak_mb']:>9}  {u['message']}"
        )


def _print_hang(result: dict[str, Any]) -> None:
    print(f"GET /v1/whoami, {result['workers']} API workers, code from {result['code']}")
    for label in ("idle", "during"):
        r = result[label]
        what = "idle" if label == "idle" else f"while {result['runs']} report deliveries hang"
        print(
            f"  {what:<40} p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  max {r['max_ms']} ms  "
            f"timeouts {r['timeouts']}/{r['requests']}"
        )
    posts = result["report_run_posts"]
    print(f"  POST /v1/report-runs: {posts['statuses']}, p50 {posts['p50_s']} s, max {posts['max_s']} s")
    print(
        f"  tarpit connections: at most {result['tarpit_connections_held_while_measuring']} open while measuring, "
        f"{result['tarpit_connections_total']} in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default=str(ROOT), help="checkout whose broker the servers run (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bills", help="bill-upload bombs: server RSS and CPU")
    b.add_argument("--gz-inflated-mb", type=int, default=96, help="the gzip bomb's CSV size once inflated")
    b.add_argument("--parquet-rows", type=int, default=1_000_000)
    b.add_argument("--parquet-value-bytes", type=int, default=1100)
    b.add_argument("--legit-rows", type=int, default=200_000)
    b.add_argument("--rss-cap-mb", type=float, default=4096, help="kill the server beyond this RSS")
    b.add_argument("--timeout", type=float, default=300, help="kill the server after this many seconds")
    h = sub.add_parser("hang", help="API latency while report deliveries hang")
    h.add_argument("--runs", type=int, default=100)
    h.add_argument("--workers", type=int, default=2)
    h.add_argument("--requests", type=int, default=400)
    h.add_argument("--clients", type=int, default=4)
    h.add_argument("--get-timeout", type=float, default=10.0)
    args = parser.parse_args()
    if args.command == "bills":
        result = bills(args)
        print(json.dumps(result)) if args.json else _print_bills(result)
    else:
        result = hang(args)
        print(json.dumps(result)) if args.json else _print_hang(result)


if __name__ == "__main__":
    main()
