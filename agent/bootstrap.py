"""The start-up script that installs and starts the agent: the same POSIX shell script on every cloud and on Slurm.

It needs only `python3` (3.8+) on the machine: it fetches the agent's wheel (the broker publishes it to each
checkpoint store and passes a URL the instance can read: a presigned HTTPS URL, or `file://` on a shared
filesystem), checks its SHA-256, and runs `PYTHONPATH=<wheel> python3 -m agent run --spec <URI>`, as a transient
systemd service when systemd is the init (so a shutdown sends the agent SIGTERM and waits for it: KillMode=mixed,
`stop_timeout` seconds), else detached with nohup (its PID in `<work root>/agent.pid`). The agent's own output goes to
`<work root>/agent.log`.

`startup_script()` renders it; every value is shell-quoted. Only what the agent needs goes in: the spec URI and the
endpoint variables (`env`); never a secret or the report key (those stay in the spec, read by the agent alone).
"""

from __future__ import annotations

import re
import shlex

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")

_FETCH = r"""import hashlib, os, sys, time, urllib.request
url, dest, want = sys.argv[1:4]
for attempt in range(8):
    try:
        data = urllib.request.urlopen(url, timeout=60).read()
        break
    except OSError as exc:
        print(f"overspill: fetching the agent failed ({exc}), retrying", file=sys.stderr)
        time.sleep(min(60, 2 ** attempt))
else:
    sys.exit("overspill: could not fetch the agent wheel")
if hashlib.sha256(data).hexdigest() != want:
    sys.exit("overspill: the agent wheel does not match its SHA-256")
with open(dest + ".tmp", "wb") as out:
    out.write(data)
os.replace(dest + ".tmp", dest)
"""


def startup_script(
    *,
    wheel_url: str,
    wheel_sha256: str,
    spec_uri: str,
    root: str = "/var/lib/overspill-agent",
    env: dict[str, str] | None = None,
    stop_timeout: int = 60,
    agent_args: tuple[str, ...] = (),
    systemd: bool = True,
) -> str:
    """The script's text. Raises ValueError for a malformed digest or environment variable name. `systemd=False`
    never starts the agent as a systemd unit (a local pool runs several attempts on one host, as one user)."""
    if not re.fullmatch(r"[0-9a-f]{64}", wheel_sha256):
        raise ValueError("wheel_sha256 must be 64 lower-case hex digits")
    q = shlex.quote
    wheel = f"{root}/overspill_agent-{wheel_sha256[:16]}.whl"
    exports = []
    for name, value in sorted((env or {}).items()):
        if not ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
        exports.append(f"export {name}={q(value)}")
    setenvs = " ".join(f"--setenv={name}" for name in sorted(env or {}))
    command = " ".join(
        q(a) for a in ("python3", "-m", "agent", "run", "--spec", spec_uri, "--work-dir", f"{root}/work", *agent_args)
    )
    service = [
        "if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1; then",
        f"  exec systemd-run --unit=overspill-agent --collect --property=KillMode=mixed "
        f"--property=TimeoutStopSec={int(stop_timeout)} --property=StandardOutput=append:{q(root + '/agent.log')} "
        f"--property=StandardError=append:{q(root + '/agent.log')} --setenv=PYTHONPATH {setenvs} {command}".rstrip(),
        "fi",
    ]
    lines = [
        "#!/bin/sh",
        "# Overspill: install and start the instance agent (generated; the same on every cloud).",
        "set -eu",
        "umask 077",
        f"mkdir -p {q(root)}",
        f"if [ ! -f {q(wheel)} ]; then",
        f"  python3 - {q(wheel_url)} {q(wheel)} {q(wheel_sha256)} <<'OVERSPILL_FETCH'",
        _FETCH.rstrip("\n"),
        "OVERSPILL_FETCH",
        "fi",
        *exports,
        f"export PYTHONPATH={q(wheel)}",
        *(service if systemd else []),
        f"nohup setsid {command} >>{q(root + '/agent.log')} 2>&1 </dev/null &",
        f"echo $! >{q(root + '/agent.pid')}",
    ]
    return "\n".join(lines) + "\n"
