"""GPU-only: the prepared one-command check (tests/gpu/check_gpu.py), skipped without CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_gpu_check_script_passes():
    out = subprocess.run(
        [sys.executable, "tests/gpu/check_gpu.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
