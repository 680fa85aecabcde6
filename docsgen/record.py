"""Commit a benchmark's `--json` output as its result file, which the site's benchmark page shows and plots.

python -m docsgen.record NAME OUTPUT.json "python benchmarks/NAME.py --json" [--machine TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from docsgen.benchmarks import write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the script's name without .py, e.g. placement_bench")
    parser.add_argument("output", type=Path, help="the file its --json output went to")
    parser.add_argument("command", help="the exact command that produced it")
    load = os.getloadavg()[0]
    machine = f"{os.cpu_count()} cores, load average {load:.1f} at recording"
    parser.add_argument("--machine", default=machine, help="what it ran on (default: cores and load average now)")
    args = parser.parse_args()
    data = json.loads(args.output.read_text())
    measured = datetime.now(UTC).strftime("%Y-%m-%d")
    print(write_result(args.name, data, args.command, measured, args.machine))


if __name__ == "__main__":
    main()
