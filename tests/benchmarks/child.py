"""What the benchmarks that measure each configuration in a fresh process share."""

from __future__ import annotations

import json
import subprocess
import sys


def run_child(cmd: list[str], what: str) -> dict:
    """Run ``cmd`` (a benchmark re-invoking itself with ``--child``); its last stdout line is
    its figures as JSON. A failure stops the benchmark, naming ``what`` failed and why."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
