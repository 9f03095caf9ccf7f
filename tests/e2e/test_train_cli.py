"""`python -m launch.train` end to end on the embedded default, shortened: real Ray actors
(vllm rollout worker, verifier actor, 2 DeepSpeed ranks), metrics.jsonl with every documented
metric name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.metric_names import SECTION5

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_short_default_run(tmp_path, tiny_model_dir):
    cache = str(Path(tiny_model_dir).parent)  # the session's small tiny model, already built
    run_dir = tmp_path / "run"
    overrides = [
        "trainer.total_steps=3",
        "trainer.eval_every=2",
        "trainer.prompts_per_step=8",
        f"trainer.run_dir={run_dir}",
        f"model.cache_dir={cache}",
        # the session fixture's small variant (tests/conftest.py FAST_TINY), not the default
        "model.tiny.hidden_size=128",
        "model.tiny.num_heads=4",
        "model.tiny.intermediate_size=384",
        "model.tiny.sft_steps=150",
        "model.tiny.sft_lr=3e-3",
        "model.tiny.sft_levels=[0,1,2]",
        "task.difficulty=1",
        "task.num_test=32",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "launch.train", *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "model built" not in out.stdout  # reused the session's build
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]
    for row in rows[1:]:
        missing = (
            SECTION5
            | {
                "reward/mean",
                "timing_s/generate",
                "timing_s/verify",
                "timing_s/learner",
                "timing_s/weight_sync",
            }
        ) - set(row)
        assert not missing, missing
    assert (run_dir / "config.yaml").exists()
    assert "held-out accuracy" in out.stdout
