"""As root, from a checkout nobody else can read (a clone under the 0700 /root, the default on
GPU clouds and in containers): the verifier pool starts and verifies, and a 2-step run trains.
Before, every verifier worker died at start (it listed the project as ``nobody``) and so did
both README commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.runs import ROOT, train_cmd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a user switch)")


@pytest.fixture(scope="module")
def private_checkout(tmp_path_factory) -> Path:
    """The tracked files copied into ``outer/inner/checkout`` (outer and inner 0700, root's),
    with ``.venv`` a link to this checkout's, so the interpreter too sits under the 0700
    folders."""
    outer = tmp_path_factory.mktemp("private-outer")
    inner = outer / "inner"
    checkout = inner / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, files.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    for folder in (outer, inner):
        folder.chmod(0o700)
    return checkout


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_pool_starts_and_verifies_from_a_private_checkout(private_checkout):
    python = str(private_checkout / ".venv" / "bin" / "python")
    out = subprocess.run([python, "-m", "reward.pool"], cwd=private_checkout, env=_env(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^verifies +ok", out.stdout, re.M), out.stdout
    assert re.search(r"^user +in force .*nobody", out.stdout, re.M), out.stdout
    assert "OFF" not in out.stdout, out.stdout
    # math-verify imports sympy after the user switch, through descriptors of the 0700 folders
    code = "from reward import verify; print(verify([r'\\boxed{1/2}'], ['0.5'])[0].reason)"
    out = subprocess.run([python, "-c", code], cwd=private_checkout, env=_env(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


@pytest.mark.slow
def test_a_two_step_run_trains_from_a_private_checkout(private_checkout, tmp_path):
    python = str(private_checkout / ".venv" / "bin" / "python")
    run_dir = private_checkout / "outputs" / "two-steps"
    cmd = train_cmd(run_dir, "trainer.total_steps=2", "trainer.prompts_per_step=16",
                    "rollout=hf", "learner.num_ranks=1", "trainer.eval_every=0",
                    "trainer.eval_pass_k=0", "logger.report=false")  # fmt: skip
    out = subprocess.run([python, *cmd[1:]], cwd=private_checkout, env=_env(),
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows][-1] == 2
