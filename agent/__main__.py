"""`python -m agent`: the instance agent's command line (also `overspill agent ...`).

    python -m agent run --spec URI [--work-dir DIR] [options]   run one attempt (exit 0: the final report is in the
                                                                mailbox; 1: it is not, yet; 2: no usable spec)
    python -m agent build-wheel OUT_DIR                         write the agent's pure-Python wheel, print its path
                                                                and SHA-256 (what the broker publishes to the stores)

Environment: `OVERSPILL_METADATA_URL` (metadata server base, default http://169.254.169.254), endpoint overrides
`AWS_ENDPOINT_URL[_S3|_SECRETS_MANAGER|_ECR]`, `STORAGE_EMULATOR_HOST`, `OVERSPILL_AZURE_BLOB_ENDPOINT`,
`OVERSPILL_GCP_SECRET_MANAGER_ENDPOINT`, `OVERSPILL_AZURE_KEYVAULT_ENDPOINT`, `OVERSPILL_ACR_ENDPOINT`, and
`OVERSPILL_REGISTRY_CERT_DIR` (a private registry's CA, podman), and `OVERSPILL_AGENT_PULL_POLICY=missing` (use an
image the runtime already holds instead of pulling it: the local pool's hosts).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="overspill-agent", description="Run one Overspill job attempt.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the attempt whose spec is at --spec")
    run.add_argument(
        "--spec", required=True, help="the attempt spec's URI (s3://, gs://, https://<acct>.blob..., file://)"
    )
    run.add_argument("--work-dir", type=Path, default=Path("/var/lib/overspill-agent/work"))
    run.add_argument("--log-flush-seconds", type=float, default=5.0, help="upload the log at least this often")
    run.add_argument("--notice-poll-seconds", type=float, default=None, help="AWS 5, Azure 1 by default")
    run.add_argument("--retry-attempts", type=int, default=5, help="registry login and pull attempts")
    run.add_argument("--retry-base-seconds", type=float, default=2.0, help="first backoff between those attempts")
    run.add_argument("--spec-wait-seconds", type=float, default=300.0, help="keep trying to read the spec this long")
    run.add_argument("--sigterm-grace-seconds", type=float, default=25.0, help="time left after SIGTERM to the agent")
    run.add_argument("--stop-grace-seconds", type=float, default=10.0, help="SIGTERM to SIGKILL when stopping")
    run.add_argument("--drain-seconds", type=float, default=600.0, help="keep trying to deliver reports this long")
    run.add_argument("--progress-report-seconds", type=float, default=60.0, help="at most one progress report per")
    run.add_argument("--runtime-binary", default=None, help="path of docker/podman (default: the runtime's name)")
    run.add_argument("-v", "--verbose", action="store_true")
    wheel = sub.add_parser("build-wheel", help="write the agent wheel into OUT_DIR")
    wheel.add_argument("out_dir", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s overspill-agent %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "build-wheel":
        from agent.wheel import build_wheel

        path, digest = build_wheel(args.out_dir)
        print(f"{path} sha256={digest}")
        return 0
    from agent.main import Agent, Options

    options = Options(
        spec_uri=args.spec,
        work_dir=args.work_dir,
        log_flush_seconds=args.log_flush_seconds,
        notice_poll_seconds=args.notice_poll_seconds,
        retry_attempts=args.retry_attempts,
        retry_base_seconds=args.retry_base_seconds,
        spec_wait_seconds=args.spec_wait_seconds,
        sigterm_grace_seconds=args.sigterm_grace_seconds,
        stop_grace_seconds=args.stop_grace_seconds,
        drain_seconds=args.drain_seconds,
        progress_report_seconds=args.progress_report_seconds,
        runtime_binary=args.runtime_binary,
    )
    return Agent(options).run()


if __name__ == "__main__":
    sys.exit(main())
