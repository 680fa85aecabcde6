"""The shell scripts the local pool runs on a host (`providers.local.hosts.Host.sh`): launch, status, stop, notice.

Every instance lives in `<pool root>/<instance id>/` on its host (the agent's root: its wheel, work directory,
`agent.log` and `agent.pid`), with `meta.json` (tags, launch token, offering, launch time), the start-up script the
broker rendered (`user-data.sh`), and the instance's metadata endpoint (`providers.local.imds`, in `imds/`).
- `launch_script`: make the directory (nothing when it exists: a launch is idempotent on its token), start the
  metadata endpoint, and run the start-up script with `sh`, exactly as a cloud instance boots, with
  `OVERSPILL_METADATA_URL` pointing at that endpoint. The start-up script fetches the agent's wheel, checks its
  SHA-256 and starts the agent detached; a failure is written to `launch-failed`.
- `status_script`: one JSON line per instance: its meta, whether its agent was started and still runs, whether it
  is being stopped or failed to launch.
- `stop_script`: SIGTERM to the agent (which treats it as the machine shutting down: it tells the workload,
  saves and reports), then, detached, SIGKILL after the grace to what is left under the root and the root's
  removal. Returns at once.
- `notice_script`: write an AWS-format spot `instance-action` the agent reads from its metadata endpoint.
Every value is shell-quoted; file contents travel as quoted literals on stdin, never on a command line.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

IMDS_SOURCE = (Path(__file__).with_name("imds.py")).read_text()

_STATUS = r"""
import json, os, sys, time
base = sys.argv[1]
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie (no init reaping it) has ended
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc/1")
try:
    names = sorted(os.listdir(base))
except OSError:
    names = []
for name in names:
    root = os.path.join(base, name)
    try:
        with open(os.path.join(root, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        continue
    pid, running, started_at = None, False, None
    try:
        with open(os.path.join(root, "agent.pid")) as f:
            pid = int(f.read().strip())
        running = alive(pid)
        started_at = os.stat(os.path.join(root, "agent.pid")).st_mtime
    except (OSError, ValueError):
        pass
    ended = None
    if pid is not None and not running:
        try:
            ended = os.stat(os.path.join(root, "agent.log")).st_mtime
        except OSError:
            ended = time.time()
    failed = ""
    try:
        with open(os.path.join(root, "launch-failed")) as f:
            failed = f.read()[-2000:] or "the start-up script failed"
    except OSError:
        pass
    print(json.dumps({"id": name, "meta": meta, "started_at": started_at, "running": running, "ended_at": ended,
                      "stopping": os.path.exists(os.path.join(root, "stopping")), "launch_failed": failed}))
"""

_REAP = r"""
import os, shutil, signal, sys, time
root, grace = sys.argv[1], float(sys.argv[2])
try:
    os.unlink(sys.argv[0])
except OSError:
    pass
def pids_under(root):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(root + "/") or cwd == root or (root + "/") in cmd:
            out.append(int(entry))
    return out
pid = None
try:
    pid = int(open(os.path.join(root, "agent.pid")).read().strip())
except (OSError, ValueError):
    pass
if pid:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pid = None
end = time.time() + grace
while pid and time.time() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        break
    time.sleep(0.5)
for other in pids_under(root):
    try:
        os.kill(other, signal.SIGKILL)
    except OSError:
        pass
shutil.rmtree(root, ignore_errors=True)
"""


def _q(value: str) -> str:
    return shlex.quote(value)


def launch_script(root: str, meta: dict[str, object], user_data: str) -> str:
    return "\n".join(
        [
            "set -u",
            f"root={_q(root)}",
            'if [ -e "$root" ]; then echo exists; exit 0; fi',
            'mkdir -p "$root/imds" || exit 1',
            f"printf '%s' {_q(json.dumps(meta))} >\"$root/meta.json.tmp\"",
            'mv "$root/meta.json.tmp" "$root/meta.json"',
            f"printf '%s' {_q(user_data)} >\"$root/user-data.sh\"",
            f"printf '%s' {_q(IMDS_SOURCE)} >\"$root/imds.py\"",
            'nohup setsid python3 "$root/imds.py" "$root" >"$root/imds.log" 2>&1 </dev/null &',
            "i=0",
            'while [ ! -s "$root/imds/port" ]; do',
            "  i=$((i + 1))",
            '  if [ "$i" -gt 200 ]; then echo "the metadata endpoint did not start" >"$root/launch-failed"; exit 0; fi',
            "  sleep 0.05",
            "done",
            'OVERSPILL_METADATA_URL="http://127.0.0.1:$(cat "$root/imds/port")"',
            "export OVERSPILL_METADATA_URL",
            "OVERSPILL_AGENT_PULL_POLICY=missing",  # images built on the host are used as they are
            "export OVERSPILL_AGENT_PULL_POLICY",
            'cd "$root"',
            'if ! sh "$root/user-data.sh" >"$root/user-data.log" 2>&1; then',
            '  tail -c 2000 "$root/user-data.log" >"$root/launch-failed"',
            "fi",
            "echo launched",
        ]
    )


def status_script(base: str) -> str:
    return f"python3 - {_q(base)} <<'OVERSPILL_STATUS'\n{_STATUS.strip()}\nOVERSPILL_STATUS\n"


def stop_script(root: str, grace_seconds: float) -> str:
    return "\n".join(
        [
            f"root={_q(root)}",
            'if [ ! -d "$root" ]; then exit 0; fi',
            'if [ -e "$root/stopping" ]; then exit 0; fi',
            ': >"$root/stopping"',
            f"printf '%s' {_q(_REAP.strip())} >\"$root/../.reap-$$.py\"",
            f'nohup setsid python3 "$root/../.reap-$$.py" "$root" {float(grace_seconds)} >/dev/null 2>&1 </dev/null &',
            "exit 0",
        ]
    )


def notice_script(root: str, body: dict[str, str]) -> str:
    return "\n".join(
        [
            f"root={_q(root)}",
            'if [ ! -d "$root/imds" ]; then echo "no such instance" >&2; exit 3; fi',
            f"printf '%s' {_q(json.dumps(body))} >\"$root/imds/.instance-action.tmp\"",
            'mv "$root/imds/.instance-action.tmp" "$root/imds/instance-action"',
        ]
    )
