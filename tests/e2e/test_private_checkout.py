"""As root, from a checkout nobody else can read (a clone under the 0700 /root, the default on
GPU clouds and in containers): the verifier pool starts and verifies. Before, every verifier
worker died at start (it listed the project as ``nobody``) and so did both README commands. The
default run itself trains from such a copy as root: tests/e2e/test_default_run.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.runs import private_copy, private_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a user switch)")


@pytest.fixture(scope="module")
def private_checkout(tmp_path_factory) -> Path:
    return private_copy(tmp_path_factory.mktemp("private"))


def test_the_pool_starts_and_verifies_from_a_private_checkout(private_checkout):
    python = str(private_checkout / ".venv" / "bin" / "python")
    out = subprocess.run([python, "-m", "reward.pool"], cwd=private_checkout, env=private_env(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^verifies +ok", out.stdout, re.M), out.stdout
    assert re.search(r"^user +in force .*nobody", out.stdout, re.M), out.stdout
    assert "OFF" not in out.stdout, out.stdout
    # math-verify imports sympy after the user switch, through descriptors of the 0700 folders
    code = "from reward import verify; print(verify([r'\\boxed{1/2}'], ['0.5'])[0].reason)"
    out = subprocess.run([python, "-c", code], cwd=private_checkout, env=private_env(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stdout + out.stderr
