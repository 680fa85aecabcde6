"""The instance agent: how fast a provider's notice reaches the workload, and what log streaming costs the agent.

1. Notice latency (target: notice received -> workload signalled under 1 s). For each provider (AWS IMDSv2 polled
   every 5 s, GCP's wait_for_change long poll, Azure Scheduled Events polled every second: the agent's defaults),
   `--runs` attempts of the numpy training workload (tests/workloads/train.py) run under the real agent (from its
   wheel, `process` runtime, or `--runtime podman` with the image from tests/container_images.py pulled from the
   login-protected test registry); tests/metadata_server.py issues the notice mid-run. Per run: issued (the metadata
   server), received (the agent's `notice` report, ms precision) and signalled (the workload's SIGUSR1 handler
   writes time.time()). Prints p50/p99/max of received -> signalled and of issued -> signalled.
2. Log streaming at `--log-rate` MB/s (default 1) for `--log-seconds` (default 30): a workload prints 1 KiB lines;
   the agent ships them to moto S3 (in this process, as the store). Samples the agent process's own CPU time
   (utime+stime from /proc, the workload excluded) and RSS every 0.5 s; prints CPU as % of one core, RSS mean and
   peak (VmHWM), bytes and chunks stored, and checks the stored log is complete.

Run (from the repository root, with the dev environment):
    python benchmarks/agent_bench.py                      # both parts, process runtime, 10 runs per provider
    python benchmarks/agent_bench.py --runs 20 --runtime podman --log-seconds 60 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent import protocol as p
from agent.wheel import build_wheel
from tests.agent_harness import (
    FileReader,
    S3Reader,
    agent_env,
    final_report,
    log_text,
    make_spec,
    publish_spec,
    reports,
    start_agent,
    wait_for,
)
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server

LOG_WORKLOAD = """
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
line = ("x" * 1000 + "\\n").encode()
per_tick = max(1, int(rate * 1024 * 1024 / len(line) / 10))
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    tick = time.monotonic()
    out = b"".join(b"%08d " % (n + i) + line[9:] for i in range(per_tick))
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    n += per_tick
    time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
print(f"lines={n}", flush=True)
"""


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _podman_setup(stack: Any, s3_url: str) -> dict[str, Any]:
    from tests.container_images import containers_conf, podman, train_image
    from tests.registry import PASSWORD, USER, LoginRegistry

    registry = stack.enter_context(LoginRegistry())
    image = registry.push(train_image(), "bench/train:1")
    stack.callback(podman, "rmi", "--ignore", image, check=False)  # the tag the agent pulled
    sm: Any = moto_client("secretsmanager", "us-east-1", s3_url)
    sm.create_secret(Name="bench/registry", SecretString=json.dumps({"username": USER, "password": PASSWORD}))
    auth = p.RegistryAuth(
        p.RegistryAuthKind.SECRET, registry.host,
        p.SecretRef("R", p.SecretSource.AWS_SECRETS_MANAGER, "bench/registry"),
    )  # fmt: skip
    env = {
        "CONTAINERS_CONF": str(containers_conf()),
        "OVERSPILL_REGISTRY_CERT_DIR": str(registry.cert_dir / registry.host),
    }
    spec = {"runtime": p.Runtime.PODMAN, "image": image, "command": ("python3", "/app/train.py"), "registry": auth}
    return {"env": env, "spec": spec}


def notice_latency(args: argparse.Namespace, wheel: Path, tmp: Path, s3_url: str, stack: Any) -> dict[str, Any]:
    podman = _podman_setup(stack, s3_url) if args.runtime == "podman" else {"env": {}, "spec": {}}
    results: dict[str, Any] = {}
    with MetadataServer() as metadata:
        reader = FileReader(tmp / "notice-store")
        base_env = {"OVERSPILL_METADATA_URL": metadata.url, "AWS_ENDPOINT_URL": s3_url, **podman["env"]}
        for provider in args.providers.split(","):
            agent_ms, end_to_end_ms = [], []
            for n in range(args.runs):
                metadata.reset()
                signal_log = tmp / f"signals-{provider}-{n}.txt"
                run_dir_env = {
                    "TRAIN_STEPS": "100000",
                    "TRAIN_SIGNAL_LOG": str(signal_log),
                    "TRAIN_EXIT_ON_NOTICE": "1",
                }
                if args.runtime == "podman":  # the signal log is written inside the container: use the run dir
                    run_dir_env["TRAIN_SIGNAL_LOG"] = "/overspill/run/signals.txt"
                spec = make_spec(
                    reader, notice=p.NoticeSpec(p.NoticeSource(provider)), env=run_dir_env, **podman["spec"]
                )
                run = start_agent(
                    publish_spec(reader, spec), spec, tmp / f"w-{provider}-{n}", agent_env(wheel, base_env)
                )
                # once the workload trains (its handler is installed: before that SIGUSR1 would kill it)
                progress = run.work_dir / "run" / "progress.json"
                wait_for(progress.exists, 120, "the workload's first progress", interval=0.05)
                time.sleep(0.2 + (n % 5) * 0.2)  # the notice lands at varied points of the poll cycle
                if provider == "aws":
                    metadata.issue_aws_interruption()
                elif provider == "gcp":
                    metadata.issue_gcp_preemption()
                else:
                    metadata.issue_azure_preempt()
                if run.wait(120) != 0:
                    raise SystemExit(f"agent failed:\n{run.stderr()}")
                if args.runtime == "podman":
                    signal_log = run.work_dir / "run" / "signals.txt"
                signalled = float(signal_log.read_text().split()[0])
                notice = next(r.notice for r in reports(reader, spec) if r.kind is p.ReportKind.NOTICE)
                assert notice is not None and final_report(reader, spec).outcome is p.Outcome.PREEMPTED
                agent_ms.append((signalled - _ts(notice.received_at)) * 1000)
                end_to_end_ms.append((signalled - metadata.issued_at[provider]) * 1000)
            results[provider] = {
                "runs": args.runs,
                "received_to_signalled_ms": {
                    "p50": _pct(agent_ms, 0.5), "p99": _pct(agent_ms, 0.99), "max": max(agent_ms),
                },
                "issued_to_signalled_ms": {
                    "p50": _pct(end_to_end_ms, 0.5), "p99": _pct(end_to_end_ms, 0.99), "max": max(end_to_end_ms),
                    "mean": statistics.fmean(end_to_end_ms),
                },
            }  # fmt: skip
    return results


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def log_streaming(args: argparse.Namespace, wheel: Path, tmp: Path, s3_url: str) -> dict[str, Any]:
    s3: Any = moto_client("s3", "us-east-1", s3_url)
    s3.create_bucket(Bucket="agent-bench")
    reader = S3Reader(s3, "agent-bench")
    script = tmp / "logs.py"
    script.write_text(LOG_WORKLOAD)
    spec = make_spec(reader, command=(sys.executable, str(script), str(args.log_rate), str(args.log_seconds)))
    env = agent_env(wheel, {"AWS_ENDPOINT_URL": s3_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "x"})
    run = start_agent(publish_spec(reader, spec), spec, tmp / "w-logs", env, "--log-flush-seconds", "5")
    pid = run.proc.pid
    wait_for(lambda: any(r.kind is p.ReportKind.STARTED for r in reports(reader, spec)), 60, "start", interval=0.1)
    time.sleep(1.0)  # past start-up
    cpu0, t0 = _proc_cpu_seconds(pid), time.monotonic()
    rss: list[int] = []
    while time.monotonic() - t0 < args.log_seconds - 2 and run.proc.poll() is None:
        rss.append(_proc_status(pid, "VmRSS"))
        time.sleep(0.5)
    cpu1, t1 = _proc_cpu_seconds(pid), time.monotonic()
    peak = _proc_status(pid, "VmHWM")
    if run.wait(120) != 0:
        raise SystemExit(f"agent failed:\n{run.stderr()}")
    text = log_text(reader, spec)
    lines = [line for line in text.splitlines() if line[:8].isdigit()]
    written = int(text.rsplit("lines=", 1)[1].split()[0])
    return {
        "rate_mb_s": args.log_rate,
        "seconds": round(t1 - t0, 1),
        "agent_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
        "agent_rss_mb_mean": round(statistics.fmean(rss) / 2**20, 1) if rss else None,
        "agent_rss_mb_peak": round(peak / 2**20, 1),
        "stored_bytes": len(text.encode()),
        "stored_chunks": len(reader.list(spec.logs_uri.split("agent-bench/", 1)[1])),
        "lines_written": written,
        "lines_stored_in_order": len(lines) == written and all(int(x[:8]) == i for i, x in enumerate(lines)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="notices per provider")
    ap.add_argument("--providers", default="aws,gcp,azure")
    ap.add_argument("--runtime", choices=["process", "podman"], default="process")
    ap.add_argument("--log-rate", type=float, default=1.0, help="MB/s the workload prints")
    ap.add_argument("--log-seconds", type=float, default=30.0)
    ap.add_argument("--skip", choices=["notices", "logs"], default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from contextlib import ExitStack

    with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        wheel, _ = build_wheel(tmp / "wheel")
        s3_url = stack.enter_context(running_moto_server())
        out: dict[str, Any] = {"machine": f"{platform.machine()} {os.cpu_count()} cpus", "runtime": args.runtime}
        if args.skip != "notices":
            out["notices"] = notice_latency(args, wheel, tmp, s3_url, stack)
        if args.skip != "logs":
            out["logs"] = log_streaming(args, wheel, tmp, s3_url)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"agent benchmark ({out['machine']}, {args.runtime} runtime)")
    for provider, r in out.get("notices", {}).items():
        a, e = r["received_to_signalled_ms"], r["issued_to_signalled_ms"]
        print(
            f"  notice {provider:5} x{r['runs']}: received -> signalled p50 {a['p50']:.1f} ms, p99 {a['p99']:.1f} ms "
            f"(max {a['max']:.1f}); issued -> signalled p50 {e['p50']:.0f} ms, p99 {e['p99']:.0f} ms"
        )
    if "logs" in out:
        g = out["logs"]
        print(
            f"  logs at {g['rate_mb_s']} MB/s for {g['seconds']} s: agent CPU {g['agent_cpu_percent_of_one_core']}% of "
            f"one core, RSS mean {g['agent_rss_mb_mean']} MB, peak {g['agent_rss_mb_peak']} MB; "
            f"{g['stored_bytes'] / 2**20:.1f} MiB in {g['stored_chunks']} chunks, complete and in order: "
            f"{g['lines_stored_in_order']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
