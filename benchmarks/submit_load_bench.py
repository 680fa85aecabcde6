"""Submission throughput: `POST /v1/jobs` under concurrent load against uvicorn, on SQLite and on PostgreSQL.

What it measures, per backend (`--db sqlite|postgresql|both`, default both):
  1. A fresh database: a SQLite file in a temp dir, or a new database on a throw-away PostgreSQL server started
     from the installed binaries (`tests.pg.start_postgres()`), or on the server given by `--pg-url`.
  2. One control-loop tick in a subprocess (`broker.cli.main tick`): migrates, installs the development admin key
     `ovs_devadmin_local-development-only` and loads the simulated prices, so submissions are checked against a
     real catalog (set OVERSPILL_SIMULATED=false to skip: the catalog is then empty and so is the check).
  3. `uvicorn --factory broker.app:app_from_env --workers W` (API only, no control loop) on 127.0.0.1, with
     uvicorn's access log off and the broker's (`OVERSPILL_LOG_LEVEL=warning`) off too unless `--access-log`.
  4. `wrk` POSTing one valid job (A100 x1, 2 GPU-hours, $50 ceiling) with the admin key: `--warmup` seconds
     unmeasured, then `-t T -c C -d D --latency`. From wrk: requests/s, latency p50/p90/p99, non-2xx answers and
     socket errors; a Lua `response()` hook also counts answers by status.
  5. Accounting: the rows added to table `job` during the measured run must equal the 202 answers wrk reported
     (its total minus non-2xx). Requests still in flight when wrk stops are completed by the server but never
     counted by wrk, so up to `--connections` extra rows are expected and reported as "in flight".
  6. CPU seconds the uvicorn processes (and PostgreSQL) used per request, how many cores uvicorn, wrk and the
     whole machine kept busy ("other load" is the rest: someone else's processes), how wrk's keep-alive
     connections ended up spread over the uvicorn workers, and (PostgreSQL) how many new database connections
     the broker opened, all read from /proc and pg_stat_database (Linux).
  `--rate R` paces wrk to R requests a second in all (its `delay()` hook hands out send slots on the monotonic
  clock) instead of saturating the server: the latency at that load, which is what "p99 at 1,000 req/s" means;
  the report says when the achieved rate fell short of the offered one.
  `--repeat N` measures N times against the same server (after one warm-up) and prints the medians: the
  spread of connections over workers is decided by the kernel at connect time and moves the figures.
  Optionally (`--py-spy DIR`) one uvicorn worker is sampled with py-spy during the run (only samples holding the
  GIL: the Python work competing for the worker's one core) and its hottest functions are printed (py-spy must
  be installed: `pip install py-spy`; its raw collapsed stacks stay in DIR).

All traffic goes to 127.0.0.1. Needs wrk (`apt-get install wrk`) and, for PostgreSQL, its server binaries
(`apt-get install postgresql`) unless `--pg-url` names a server on which it may create a database.

Run (from the repository root, in the environment where the project is installed):
    python benchmarks/submit_load_bench.py
    python benchmarks/submit_load_bench.py --db sqlite --workers 1 --duration 20 --connections 64
    python benchmarks/submit_load_bench.py --db postgresql --pg-url postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/submit_load_bench.py --json
    python benchmarks/submit_load_bench.py --db postgresql --rate 1000 --repeat 3   # p99 at 1,000 req/s offered
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEV_API_KEY = "ovs_devadmin_local-development-only"
JOB_BODY: dict[str, Any] = {
    "name": "resnet-finetune",
    "team": "vision",
    "project": "atlas",
    "image": "ghcr.io/acme/train:1.0",
    "command": ["python", "train.py"],
    "accelerators": ["A100"],
    "gpu_count": 1,
    "work_gpu_hours": "2",
    "max_total_usd": "50",
}

# `--rate`: wrk asks `delay()` before each request on a connection; each wrk thread hands out send slots
# `interval` ms apart (LuaJIT's ffi reads the monotonic clock), so the thread offers rate/threads requests a second
# whatever the answers' speed, as long as a connection is free. A thread that fell behind starts again from now
# (no burst to catch up): the achieved req/s then falls below the offered rate, and the report says so.
PACING_LUA = """
local ffi = require("ffi")
ffi.cdef[[
typedef struct {{ long tv_sec; long tv_nsec; }} ovs_timespec;
int clock_gettime(int clk_id, ovs_timespec *tp);
]]
local ts = ffi.new("ovs_timespec")
local interval = {interval_ms}
local next_slot = nil

local function now_ms()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

function delay()
  local now = now_ms()
  if next_slot == nil or next_slot < now then next_slot = now end
  local wait = next_slot - now
  next_slot = next_slot + interval
  return math.floor(wait)
end
"""

LUA_TEMPLATE = """
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"

local threads = {{}}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  codes = {{}}
end

function response(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
end

{pacing}
function done(summary, latency, requests)
  local total = {{}}
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("codes")) do
      total[code] = (total[code] or 0) + n
    end
  end
  for code, n in pairs(total) do
    io.write(string.format("overspill_status %d %d\\n", code, n))
  end
  for _, p in ipairs({{50, 90, 99}}) do
    io.write(string.format("overspill_latency_us %d %d\\n", p, latency:percentile(p)))
  end
  io.write(string.format("overspill_latency_us 100 %d\\n", latency.max))
end
"""


@dataclass
class Result:
    backend: str
    workers: int
    connections: int
    threads: int
    duration_s: float
    run: int = 1
    offerings_seeded: int = 0
    offered_per_s: float | None = None  # `--rate`: the paced load; None: as fast as the connections allow
    requests: int = 0
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    non_2xx: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    accepted_reported: int = 0
    jobs_added: int = 0
    in_flight_at_stop: int = 0
    accounting_ok: bool = False
    server_cpu_ms_per_request: float | None = None
    server_cores_busy: float | None = None
    db_cpu_ms_per_request: float | None = None
    wrk_cores_busy: float | None = None
    machine_cores_busy: float | None = None
    other_cores_busy: float | None = None  # machine minus uvicorn, wrk and PostgreSQL: someone else's load
    db_connections_opened: int | None = None
    connections_per_worker: list[int] = field(default_factory=list)  # wrk's connections held by each worker
    server_log_tail: str | None = None  # the end of uvicorn's output when answers were not all 2xx
    hotspots: list[dict[str, Any]] | None = None
    error: str | None = None


# ---------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_env(database_url: str, data_dir: Path, *, access_log: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if not access_log:  # as uvicorn's own (--no-access-log): the broker's `http request` INFO record per request
        env["OVERSPILL_LOG_LEVEL"] = "warning"
    env.update(
        OVERSPILL_DATABASE_URL=database_url,
        OVERSPILL_DATA_DIR=str(data_dir),
        OVERSPILL_ENV="development",
        OVERSPILL_BOOTSTRAP_API_KEY=DEV_API_KEY,
        OVERSPILL_RATE_LIMIT_PER_SECOND="0",  # one key at full speed is the point here: no per-key limit
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


def seed_database(env: dict[str, str], cwd: Path) -> int:
    """Run one tick (migrate, bootstrap key, simulated prices). Returns how many offerings were refreshed."""
    cmd = [sys.executable, "-c", "from broker.cli.main import main; main()", "tick", "--json"]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"seeding tick failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    return sum(int(s["count"]) for s in steps if s["step"] == "refresh_prices")


@contextlib.contextmanager
def uvicorn_server(env: dict[str, str], cwd: Path, workers: int) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "broker.app:app_from_env",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    log_path = cwd / "uvicorn.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(proc, port, log_path)
        yield proc, port
    finally:
        stop_process_group(proc)


def wait_healthy(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/healthz"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"uvicorn not healthy on {url} after {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the server (uvicorn shuts its workers down), SIGKILL its process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # any worker left behind


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_tree(pid: int) -> list[int]:
    out = [pid]
    for child in children(pid):
        out.extend(process_tree(child))
    return out


def worker_pids(master: int, workers: int) -> list[int]:
    """uvicorn's worker processes (the master itself when it runs a single worker in-process)."""
    if workers <= 1:
        return [master]
    found = []
    for child in children(master):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(child)
    return found or [master]


def machine_busy_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat; None when unreadable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """utime + stime of the given processes (Linux /proc); None when unreadable."""
    if not Path("/proc/self/stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime (fields 14-17 of stat): reaped children count too (PostgreSQL backends)
        total += sum(int(f) for f in fields[11:15])
    return total / tick


def established_connections(pid: int, port: int) -> int:
    """TCP connections the process holds ESTABLISHED on local `port` (Linux /proc; 0 when unreadable)."""
    try:
        inodes = {
            os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
        }
    except OSError:
        return 0
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == port and cols[3] == "01" and cols[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


# ---------------------------------------------------------------------------------------------- databases


@dataclass
class Database:
    backend: str
    url: str
    count_jobs: Callable[[], int]
    server_pids: Callable[[], list[int]]
    close: Callable[[], None]
    sessions: Callable[[], int | None] = lambda: None  # connections ever opened to the database (PostgreSQL)


def sqlite_database(workdir: Path) -> Database:
    path = workdir / "overspill.db"

    def count() -> int:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            return int(conn.execute("SELECT count(*) FROM job").fetchone()[0])

    return Database("sqlite", f"sqlite:///{path}", count, lambda: [], lambda: None)


def postgres_database(pg_url: str | None) -> Database:
    import psycopg

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.pg import PgServer, start_postgres

    server = PgServer(admin_url=pg_url) if pg_url else start_postgres()
    try:
        url = server.create_database()
    except Exception:
        server.stop()
        raise

    def count() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM job").fetchone()
            return int(row[0]) if row else 0

    def pids() -> list[int]:
        if server.data_dir is None:
            return []  # an external server: not ours to measure
        try:
            postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        return process_tree(postmaster)

    def close() -> None:
        if server.data_dir is None:  # external server: drop the database we made
            name = url.rsplit("/", 1)[1]
            with contextlib.suppress(psycopg.Error), psycopg.connect(server.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.stop()

    def sessions() -> int | None:
        with psycopg.connect(url) as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
            row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
            return int(row[0]) if row and row[0] is not None else None

    return Database("postgresql", url, count, pids, close, sessions)


# ---------------------------------------------------------------------------------------------- wrk


def write_lua(path: Path, rate: float | None = None, threads: int = 1) -> None:
    """wrk's script: the job, the key, the status counts; with `rate`, paced to that many requests a second."""
    pacing = PACING_LUA.format(interval_ms=repr(threads * 1000.0 / rate)) if rate else ""
    path.write_text(LUA_TEMPLATE.format(body=json.dumps(JOB_BODY), key=DEV_API_KEY, pacing=pacing))


def wrk_command(url: str, script: Path, threads: int, connections: int, seconds: int, timeout: int) -> list[str]:
    """wrk's command line (it takes whole seconds only)."""
    return [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        f"--timeout={timeout}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]


def run_wrk(url: str, script: Path, threads: int, connections: int, seconds: int, timeout: int) -> str:
    cmd = wrk_command(url, script, threads, connections, seconds, timeout)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + timeout + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[:500]}")
    return proc.stdout


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(out: str, result: Result) -> None:
    """Fill the result from wrk's report (and the Lua hook's `overspill_*` lines)."""
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    result.requests_per_s = float(m.group(1)) if m else 0.0
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    result.requests = int(m.group(1)) if m else 0
    distribution = re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
    pct = {int(p): float(v) * _UNITS_MS[u] for p, v, u in distribution}
    lua = {int(p): int(v) / 1000 for p, v in re.findall(r"^overspill_latency_us (\d+) (\d+)$", out, re.M)}
    result.p50_ms = pct.get(50, lua.get(50, 0.0))
    result.p90_ms = pct.get(90, lua.get(90, 0.0))
    result.p99_ms = pct.get(99, lua.get(99, 0.0))
    result.max_ms = lua.get(100, 0.0)
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    result.non_2xx = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    kinds = ("connect", "read", "write", "timeout")
    result.socket_errors = {k: int(v) for k, v in zip(kinds, m.groups(), strict=True)} if m else dict.fromkeys(kinds, 0)
    result.statuses = {code: int(n) for code, n in re.findall(r"^overspill_status (\d+) (\d+)$", out, re.M)}


# ---------------------------------------------------------------------------------------------- py-spy


def find_py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


# Where a request's Python time goes: the first pattern a sampled stack matches names its phase (most specific
# first). Sync dependencies and the sync endpoint each run in anyio's thread pool, so hand-offs show up as a phase.
PHASES: tuple[tuple[str, str], ...] = (
    ("endpoint: Session.commit (flush, pool checkout, INSERT job + job_event)", r"Session\.commit"),
    ("endpoint: CatalogCache.book", r"CatalogCache\.book"),
    ("endpoint: ever_feasible", r"ever_feasible"),
    ("endpoint: rest of services.jobs.submit_job (Job(), spec_of, dump, hash)", r"broker/services/jobs\.py"),
    ("endpoint: route function", r"broker/api/routes/jobs\.py"),
    (
        "dependencies: get_runtime, get_principal, require",
        r"KeyVerifier\.verify|get_principal|check \(broker|get_runtime",
    ),
    ("response: serialize_response (JobPublic validation)", r"serialize_response|jsonable_encoder"),
    ("request: body read + JSON + JobCreate validation", r"request_body_to_args|_get_body|Request\.json|Request\.body"),
    (
        "thread-pool hand-offs (anyio to_thread)",
        r"run_in_threadpool|run_sync_in_worker_thread|WorkerThread|Condition\.",
    ),
    ("FastAPI dependency machinery", r"solve_dependencies|request_params_to_args"),
    ("response render", r"starlette/responses"),
    ("BaseHTTPMiddleware (@app.middleware)", r"BaseHTTPMiddleware|call_next|anyio/streams|_CachedRequest"),
    ("uvicorn HTTP protocol", r"uvicorn/protocols"),
    ("event loop and the rest", r"."),
)


def summarize_py_spy(raw: Path, top: int = 12) -> list[dict[str, Any]]:
    """Share of samples per phase of a request and per leaf function, from py-spy's collapsed stacks."""
    self_samples: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        frames = [f for f in frames if "(" in f]  # drop process/thread pseudo-frames
        if not frames:
            continue
        total += count
        self_samples[frames[-1]] += count
        joined = ";".join(frames)
        phases[next(name for name, pattern in PHASES if re.search(pattern, joined))] += count
    if not total:
        return []
    rows = [{"kind": "phase", "function": name, "share": round(n / total, 4)} for name, n in phases.most_common()]
    rows += [
        {"kind": "self", "function": name, "share": round(n / total, 4)} for name, n in self_samples.most_common(top)
    ]
    return rows


# ---------------------------------------------------------------------------------------------- one backend


def bench_backend(backend: str, args: argparse.Namespace, say: Callable[..., None]) -> list[Result]:
    """Fresh database, seed, serve, warm up, then `--repeat` measured runs against the same server."""
    results: list[Result] = []
    workdir = Path(tempfile.mkdtemp(prefix=f"overspill-bench-{backend}-"))
    db: Database | None = None
    try:
        db = sqlite_database(workdir) if backend == "sqlite" else postgres_database(args.pg_url)
        env = broker_env(db.url, workdir, access_log=args.access_log)
        say(f"[{backend}] database {db.url}")
        t0 = time.perf_counter()
        seeded = seed_database(env, workdir)
        say(f"[{backend}] migrated and seeded {seeded} offerings in {time.perf_counter() - t0:.1f} s")
        script = workdir / "submit.lua"
        write_lua(script, args.rate, args.threads)
        with uvicorn_server(env, workdir, args.workers) as (proc, port):
            url = f"http://127.0.0.1:{port}/v1/jobs"
            say(f"[{backend}] uvicorn pid {proc.pid}, {args.workers} worker(s) on {url}")
            if args.warmup > 0:
                run_wrk(url, script, args.threads, args.connections, args.warmup, args.timeout)
            for run in range(1, args.repeat + 1):
                result = Result(backend, args.workers, args.connections, args.threads, args.duration, run=run)
                result.offerings_seeded = seeded
                result.offered_per_s = args.rate
                try:
                    measure(result, db, proc, port, url, script, args, say)
                except Exception as exc:  # report and go on
                    result.error = f"{type(exc).__name__}: {exc}"
                results.append(result)
    except Exception as exc:  # report and go on with the next backend
        failed = Result(backend, args.workers, args.connections, args.threads, args.duration)
        failed.error = f"{type(exc).__name__}: {exc}"
        results.append(failed)
    finally:
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def measure(
    result: Result,
    db: Database,
    proc: subprocess.Popen[bytes],
    port: int,
    url: str,
    script: Path,
    args: argparse.Namespace,
    say: Callable[..., None],
) -> None:
    """One measured wrk run, with the database accounting and CPU figures around it."""
    backend = result.backend
    time.sleep(args.settle)  # let requests from the previous run or the warm-up commit
    before = db.count_jobs()
    sessions0 = db.sessions()
    cpu0, db0, machine0 = cpu_seconds(process_tree(proc.pid)), cpu_seconds(db.server_pids()), machine_busy_seconds()
    spy: subprocess.Popen[bytes] | None = None
    raw = Path(args.py_spy) / f"{backend}-worker-run{result.run}.txt" if args.py_spy else None
    workers = worker_pids(proc.pid, args.workers)
    if raw is not None:
        spy = start_py_spy(workers[0], raw, args.duration)
    say(f"[{backend}] run {result.run}: wrk -t{args.threads} -c{args.connections} -d{args.duration}s ...")
    wrk0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk = subprocess.Popen(
        wrk_command(url, script, args.threads, args.connections, args.duration, args.timeout),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(min(1.0, args.duration / 2))  # wrk has opened its connections by now
    result.connections_per_worker = [established_connections(pid, port) for pid in workers]
    out, err = wrk.communicate(timeout=args.duration + args.timeout + 60)
    if wrk.returncode != 0:
        raise RuntimeError(f"wrk failed (exit {wrk.returncode}): {(err or out).strip()[:500]}")
    wrk1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu1, db1, machine1 = cpu_seconds(process_tree(proc.pid)), cpu_seconds(db.server_pids()), machine_busy_seconds()
    if spy is not None and raw is not None:
        spy.wait(timeout=60)
        result.hotspots = summarize_py_spy(raw) if raw.exists() else None
    time.sleep(args.settle)  # let requests that were in flight when wrk stopped commit
    after = db.count_jobs()
    sessions1 = db.sessions()
    if args.verbose:
        say(out)
    parse_wrk(out, result)
    result.accepted_reported = result.requests - result.non_2xx
    result.jobs_added = after - before
    result.in_flight_at_stop = result.jobs_added - result.accepted_reported
    result.accounting_ok = 0 <= result.in_flight_at_stop <= args.connections
    log = script.parent / "uvicorn.log"  # where uvicorn_server() sends the server's output
    if (result.non_2xx or not result.accounting_ok) and log.exists():
        result.server_log_tail = log.read_text(errors="replace")[-2000:]
    if cpu0 is not None and cpu1 is not None and result.requests:
        result.server_cpu_ms_per_request = round((cpu1 - cpu0) * 1000 / result.requests, 3)
        result.server_cores_busy = round((cpu1 - cpu0) / args.duration, 2)
    wrk_cores = ((wrk1.ru_utime + wrk1.ru_stime) - (wrk0.ru_utime + wrk0.ru_stime)) / args.duration
    result.wrk_cores_busy = round(wrk_cores, 2)
    if machine0 is not None and machine1 is not None and machine1[1] > machine0[1]:
        share = (machine1[0] - machine0[0]) / (machine1[1] - machine0[1])
        result.machine_cores_busy = round(share * (os.cpu_count() or 1), 2)
    db_cores = (db1 - db0) / args.duration if db0 is not None and db1 is not None else 0.0
    if result.machine_cores_busy is not None and result.server_cores_busy is not None:
        ours = result.server_cores_busy + wrk_cores + db_cores
        result.other_cores_busy = round(max(0.0, result.machine_cores_busy - ours), 2)
    if sessions0 is not None and sessions1 is not None:
        # minus the 2 connections this script opens (count + sessions) after the run
        result.db_connections_opened = max(0, sessions1 - sessions0 - 2)
    if db0 is not None and db1 is not None and db1 > 0 and result.requests:
        result.db_cpu_ms_per_request = round((db1 - db0) * 1000 / result.requests, 3)


def start_py_spy(pid: int, raw: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    exe = find_py_spy()
    if exe is None:
        print("py-spy not found: pip install py-spy (profiling skipped)", file=sys.stderr)
        return None
    raw.parent.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200"]
    # --gil: only samples holding the GIL, i.e. the Python work that competes for the worker's one core
    cmd += ["--gil", "--format", "raw", "--output", str(raw), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------------------------------------- report


def medians(results: Sequence[Result]) -> dict[str, dict[str, float]]:
    """Per backend, the median of each headline figure over its successful runs."""
    out: dict[str, dict[str, float]] = {}
    for backend in dict.fromkeys(r.backend for r in results):
        ok = [r for r in results if r.backend == backend and not r.error]
        if ok:
            out[backend] = {
                "runs": len(ok),
                "requests_per_s": round(statistics.median(r.requests_per_s for r in ok), 1),
                "p50_ms": round(statistics.median(r.p50_ms for r in ok), 1),
                "p90_ms": round(statistics.median(r.p90_ms for r in ok), 1),
                "p99_ms": round(statistics.median(r.p99_ms for r in ok), 1),
            }
    return out


def print_table(results: Sequence[Result]) -> None:
    header = (
        f"{'backend':<11}{'run':>4}{'req/s':>8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'requests':>9}"
        f"{'non-2xx':>8}{'sock err':>9}{'jobs +':>8}{'in flight':>10}{'check':>6}{'cpu ms/req':>11}"
        f"{'db ms/req':>10}{'conns/worker':>14}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if r.error:
            print(f"{r.backend:<11}{r.run:>4} FAILED: {r.error}")
            continue
        sock = sum(r.socket_errors.values())
        cpu = f"{r.server_cpu_ms_per_request:.2f}" if r.server_cpu_ms_per_request is not None else "-"
        dbc = f"{r.db_cpu_ms_per_request:.2f}" if r.db_cpu_ms_per_request is not None else "-"
        split = "/".join(str(n) for n in r.connections_per_worker) or "-"
        print(
            f"{r.backend:<11}{r.run:>4}{r.requests_per_s:>8.1f}{r.p50_ms:>9.1f}{r.p90_ms:>9.1f}{r.p99_ms:>9.1f}"
            f"{r.max_ms:>9.1f}{r.requests:>9}{r.non_2xx:>8}{sock:>9}{r.jobs_added:>8}{r.in_flight_at_stop:>10}"
            f"{'ok' if r.accounting_ok else 'FAIL':>6}{cpu:>11}{dbc:>10}{split:>14}"
        )
    meds = medians(results)
    if any(m["runs"] > 1 for m in meds.values()):
        for backend, m in meds.items():
            print(
                f"{backend:<11} med{m['requests_per_s']:>8.1f}{m['p50_ms']:>9.1f}{m['p90_ms']:>9.1f}{m['p99_ms']:>9.1f}"
                f"   (median of {m['runs']} runs)"
            )
    for r in results:
        if r.error:
            continue
        extra = []
        if r.offered_per_s:
            share = r.requests_per_s / r.offered_per_s
            extra.append(
                f"offered {r.offered_per_s:g} req/s, achieved {share:.0%}"
                + ("" if share >= 0.98 else " (NOT SUSTAINED)")
            )
        if r.statuses:
            extra.append("statuses " + ", ".join(f"{k}: {v}" for k, v in sorted(r.statuses.items())))
        if any(r.socket_errors.values()):
            extra.append("socket errors " + ", ".join(f"{k} {v}" for k, v in r.socket_errors.items() if v))
        if r.server_cores_busy is not None:
            extra.append(f"uvicorn busy {r.server_cores_busy} cores")
        if r.wrk_cores_busy is not None:
            extra.append(f"wrk {r.wrk_cores_busy}")
        if r.machine_cores_busy is not None:
            extra.append(f"whole machine {r.machine_cores_busy} of {os.cpu_count()}")
        if r.other_cores_busy is not None:
            extra.append(f"other load {r.other_cores_busy}")
        if r.db_connections_opened is not None:
            extra.append(f"{r.db_connections_opened} new DB connections")
        print(f"  {r.backend} run {r.run}: " + "; ".join(extra))
        if not r.accounting_ok:
            print(
                f"  {r.backend} run {r.run}: ACCOUNTING MISMATCH: {r.jobs_added} jobs stored vs "
                f"{r.accepted_reported} accepted answers reported by wrk"
            )
        if r.server_log_tail:
            print(f"  {r.backend} run {r.run}: end of the server's output:")
            print("    " + r.server_log_tail.rstrip().replace("\n", "\n    "))
        if r.hotspots:
            print(f"  {r.backend} run {r.run}: one worker's GIL-holding samples (py-spy) by request phase, then leaf:")
            for h in r.hotspots:
                print(f"    {h['kind']:<6} {h['share'] * 100:5.1f}%  {h['function']}")
    seeded = {r.backend: r.offerings_seeded for r in results if not r.error}
    print("catalog: " + ", ".join(f"{b} {n} offerings" for b, n in seeded.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--workers", type=int, default=3, help="uvicorn worker processes (default 3, as `overspill serve --workers 3`)"
    )
    parser.add_argument("--duration", type=int, default=10, help="measured whole seconds (default 10)")
    parser.add_argument("--connections", type=int, default=32, help="concurrent connections (default 32)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured whole seconds first, 0: none (default 2)")
    parser.add_argument("--timeout", type=int, default=10, help="wrk request timeout, whole s (default 10)")
    parser.add_argument("--repeat", type=int, default=1, help="measured runs per backend, same server (default 1)")
    parser.add_argument(
        "--rate",
        type=float,
        help="offer this many requests a second in all (paced by wrk's delay() hook) instead of as many as the "
        "connections allow: the latency at a given load rather than at saturation",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="pause before counting rows, s (default 1)")
    parser.add_argument("--pg-url", help="admin URL of an existing PostgreSQL (a fresh database is created)")
    parser.add_argument("--py-spy", metavar="DIR", help="sample one uvicorn worker with py-spy, raw stacks in DIR")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="keep the broker's access log (one INFO record per request); off by default, as uvicorn's",
    )
    parser.add_argument("--verbose", action="store_true", help="also print wrk's own report")
    parser.add_argument("--json", action="store_true", help="print one JSON object of figures")
    args = parser.parse_args(argv)
    if min(args.workers, args.connections, args.threads, args.repeat, args.duration, args.timeout) < 1:
        parser.error("--workers, --connections, --threads, --repeat, --duration and --timeout must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be more than 0 requests a second")
    if args.threads > args.connections:
        parser.error("wrk needs at least one connection per thread: --threads <= --connections")

    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk (or build it from https://github.com/wg/wrk)")
        return 2
    say: Callable[..., None] = (lambda *_: None) if args.json else print
    backends = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    say(
        f"submit_load_bench: {os.cpu_count()} CPUs, wrk -t{args.threads} -c{args.connections} "
        f"-d{args.duration}s after {args.warmup} s warm-up, "
        f"{f'offered {args.rate:g} req/s' if args.rate else 'unpaced (saturation)'}, OVERSPILL_SIMULATED="
        f"{os.environ.get('OVERSPILL_SIMULATED', 'true')}, broker access log {'on' if args.access_log else 'off'}"
    )
    results = [r for b in backends for r in bench_backend(b, args, say)]
    if args.json:
        report = {"cpus": os.cpu_count(), "results": [asdict(r) for r in results], "medians": medians(results)}
        print(json.dumps(report))
    else:
        print()
        print_table(results)
    return 1 if any(r.error or not r.accounting_ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
