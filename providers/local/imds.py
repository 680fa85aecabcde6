"""The instance-metadata endpoint of one local-pool instance: AWS's IMDSv2 spot notice paths, answered from files.

A standalone standard-library script (Python 3.8+): the local pool ships its source to the host with each launch
(`providers.local.scripts`) and runs it there beside the agent, `python3 - ROOT`, detached. It binds 127.0.0.1 on
a free port, writes the port to `ROOT/imds/port`, and answers as EC2's IMDSv2 does:
- `PUT /latest/api/token` (with `X-aws-ec2-metadata-token-ttl-seconds`) gives a session token; every `GET` needs it
  (401 otherwise);
- `GET /latest/meta-data/spot/instance-action` is 404 until `ROOT/imds/instance-action` exists, then its content
  (`{"action": "terminate", "time": "<UTC>"}`, written by `overspill notice JOB` through the pool);
- `GET /latest/meta-data/events/recommendations/rebalance` likewise from `ROOT/imds/rebalance`;
- anything else is 404 (the agent's stores are local files or the operator's, never the instance role's).
So the agent watches the same notice, through the same code, as on an EC2 spot instance (`notice_source = "aws"`).
It exits once the agent it serves is gone (`ROOT/agent.pid` names a process that no longer exists) or `ROOT` is
removed.
"""

import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

FILES = {
    "/latest/meta-data/spot/instance-action": "instance-action",
    "/latest/meta-data/events/recommendations/rebalance": "rebalance",
}


def serve(root: str) -> None:
    imds = os.path.join(root, "imds")
    os.makedirs(imds, exist_ok=True)
    token = secrets.token_hex(16)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self._answer(200, token.encode())
            else:
                self._answer(400)

        def do_GET(self) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") != token:
                self._answer(401)
                return
            name = FILES.get(self.path.split("?", 1)[0])
            try:
                with open(os.path.join(imds, name or ".none"), "rb") as f:
                    self._answer(200, f.read())
            except OSError:
                self._answer(404)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    tmp = os.path.join(imds, ".port.tmp")
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, os.path.join(imds, "port"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while os.path.isdir(root) and _agent_alive(root):
        time.sleep(1.0)
    server.shutdown()


def _agent_alive(root: str) -> bool:
    """False once the agent's pid file names a process that is gone (True before the agent has started)."""
    try:
        with open(os.path.join(root, "agent.pid")) as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        return True
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


if __name__ == "__main__":
    serve(sys.argv[1])
