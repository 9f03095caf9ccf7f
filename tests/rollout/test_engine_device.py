"""The hf engine computes on the device its rollout worker reserved from Ray, as the learner
ranks do (issue 45): before, it took ``rollout.device`` (default ``cpu``), so a worker that
reserved a GPU silently generated on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A Ray of its own with one GPU that exists only in Ray's resources; every worker process of
# the job believes CUDA is usable (the hook), as on a GPU node, where Ray may leave the devices
# visible to actors that reserved none: only the reservation may decide the device.
SCRIPT = textwrap.dedent(
    """
    import sys

    import ray

    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, runtime_env={
        "worker_process_setup_hook": "tests.rollout.test_engine_device.cuda_everywhere"})
    for gpus in (0.0, 1.0):
        cfg = RolloutConfig(engine="hf", num_workers=1, num_gpus_per_worker=gpus,
                            max_model_len=64, start_timeout_s=120)
        try:
            group = RolloutGroup(cfg, sys.argv[1])
            print(f"RESULT {gpus:g} ready: {group.engines}", flush=True)
            group.shutdown()
        except Exception as err:
            print(f"RESULT {gpus:g} failed: {err}".replace("\\n", " "), flush=True)
    ray.shutdown()
    """
)


def cuda_everywhere() -> None:
    """Ray's worker_process_setup_hook for :data:`SCRIPT`."""
    import torch

    torch.cuda.is_available = lambda: True


@pytest.mark.slow
def test_the_hf_engine_runs_on_the_gpu_its_worker_reserved(tiny_model_dir):
    """A worker that reserved no GPU builds its engine on the CPU; one that reserved the (faked)
    GPU moves the model to CUDA, which this CPU build of torch cannot do: the error shows the
    device came from the reservation. On the old code both engines started on the CPU."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_model_dir],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(results) == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert results[0] == "RESULT 0 ready: ['HFEngine on cpu']", results
    assert results[1].startswith("RESULT 1 failed:"), results
    assert "Torch not compiled with CUDA enabled" in results[1], results[1][-2000:]
