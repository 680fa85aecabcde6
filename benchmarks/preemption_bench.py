"""Preemption, end to end: spot notice -> final checkpoint durable -> replacement running (issue 14's second measure).

Each round runs the real thing on the AWS stand-ins (moto EC2 + S3 in their own process, tests/metadata_server.py
for the instance metadata service): a real tick launches the job, the start-up script the cloud was sent boots the
real agent (`process` runtime) with the numpy workload (tests/workloads/train.py), and once it is training the
metadata service issues AWS's documented two-minute spot notice. Timed, per round:

- notice -> durable: until the agent's signed final report (`preempted`, naming the checkpoint the workload wrote
  on the signal, uploaded MANIFEST last) is in the tenant mailbox (the agent polls AWS's notice every 5 s, as AWS
  recommends, so up to 5 s of this is that poll; GCP's and Azure's are watched every second);
- broker: the ticks that read the mailbox, re-budget the job on the reported progress and launch the replacement
  (wall time of those ticks; a deployment adds the wait for the next tick, at most `tick_interval_seconds`);
- boot -> resumed: the replacement's start-up script, its agent fetching the spec and restoring the checkpoint,
  until its `started` report (the workload is running from the checkpoint; the bench then also waits for the
  workload's "resumed at step" line in the stored log, untimed: log chunks are shipped every 5 s);
- notice -> resumed: the sum (no tick-interval wait, no real cloud's instance start-up).

    python benchmarks/preemption_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest

from agent import protocol as proto
from broker.loop.tick import tick
from tests.instance_boot import boot
from tests.metadata_server import MetadataServer
from tests.moto_server import moto_client, running_moto_server
from tests.test_reports_outcomes import aws

BUCKET = "ckpt-use1"
WORKLOAD = {"TRAIN_STEPS": "3000", "TRAIN_CHECKPOINT_EVERY": "500", "TRAIN_STEP_SECONDS": "0.02"}


def _wait(what: str, ready: object, timeout: float = 120.0) -> float:
    """Poll `ready()` every 20 ms; the monotonic time it first held."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def one_round(moto_url: str, work: Path) -> dict[str, float]:
    s3 = moto_client("s3", "us-east-1", moto_url)

    def text_under(prefix: str) -> bytes:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return b"".join(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in sorted(listed, key=str))

    def in_mailbox(placement_id: str, kind: proto.ReportKind) -> bool:
        prefix = f"tenants/demo/mailbox/{placement_id}-"
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
            report = proto.Report.from_json(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
            if report.kind is kind:
                return True
        return False

    mp = pytest.MonkeyPatch()
    try:
        with aws(moto_url, work, mp) as cloud:
            job_id = cloud.submit(env=WORKLOAD)
            first = cloud.launched(job_id)
            root = Path(cloud.rt.settings.agent_root)
            logs = str(first.attempt_uri).removeprefix(f"s3://{BUCKET}/") + proto.LOGS_DIR
            with MetadataServer() as metadata:
                booted = boot(
                    cloud.script_of(str(first.instance_id)), root, {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1
                )
                _wait("training", lambda: b"step 100 loss" in text_under(logs))
                notice = time.monotonic()
                metadata.issue_aws_interruption(in_seconds=120)
                durable = _wait("the final report", lambda: in_mailbox(first.id, proto.ReportKind.FINAL))
                booted.wait()
            ticks_start = time.monotonic()
            tick(cloud.rt, datetime.now(UTC))  # the verdict: preempted, re-budgeted on the reported checkpoint
            second = cloud.launched(job_id)  # the next tick places and launches the replacement
            launched = time.monotonic()
            shutil.rmtree(root, ignore_errors=True)
            second_logs = str(second.attempt_uri).removeprefix(f"s3://{BUCKET}/") + proto.LOGS_DIR
            with MetadataServer() as metadata:
                booted = boot(
                    cloud.script_of(str(second.instance_id)), root, {"OVERSPILL_METADATA_URL": metadata.url}, gpus=1
                )
                resumed = _wait("the replacement's start", lambda: in_mailbox(second.id, proto.ReportKind.STARTED))
                _wait("the resumed workload's log", lambda: b"resumed at step" in text_under(second_logs))
                booted.stop()
    finally:
        mp.undo()
    return {
        "notice_to_durable": durable - notice,
        "broker_ticks": launched - ticks_start,
        "boot_to_resumed": resumed - launched,
        "notice_to_resumed": (durable - notice) + (launched - ticks_start) + (resumed - launched),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # the stand-ins' request lines
    rounds: list[dict[str, float]] = []
    with running_moto_server() as moto_url:
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="ovs-preempt-") as tmp:
                rounds.append(one_round(moto_url, Path(tmp)))
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rounds[-1].items()))
    print(f"\npreemption on the AWS stand-ins, {args.rounds} rounds ({platform.node()}, {datetime.now(UTC):%Y-%m-%d})")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        print(f"{key:<20} p50 {statistics.median(values):6.2f} s   max {max(values):6.2f} s")


if __name__ == "__main__":
    main()
