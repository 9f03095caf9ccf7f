"""GPU-only rollout checks (skipped without CUDA): the prepared script, and tensor parallel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_gpu_check_script_passes():
    out = subprocess.run(
        [sys.executable, "tests/gpu/check_rollout_gpu.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.gpu
def test_tensor_parallel_two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = subprocess.run(
        [sys.executable, "tests/gpu/check_rollout_gpu.py", "--tp", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
