"""The paper's other baselines end to end with real actors (hf engine, verifier pool, 2 DeepSpeed
ranks), 3 steps each, on the session's tiny model: their metrics are there and finite and their
own state reaches the checkpoint."""

from __future__ import annotations

import math

import pytest

from learner import checkpoint
from tests.conftest import fast_tiny_overrides
from tests.e2e.test_train_cli import rows, run_train

SHORT = [
    "rollout=hf",
    "trainer.total_steps=3",
    "trainer.prompts_per_step=8",
    "trainer.eval_every=0",
    "trainer.eval_pass_k=0",
    "logger.report=false",
]


@pytest.mark.slow
def test_dcpo_three_steps_keeps_per_prompt_history_in_the_checkpoint(tmp_path, tiny_model_dir):
    """algorithm=dcpo with task.num_train=8: the 8 prompts come back every step, so steps 2-3
    standardise against history (visit counts 1, 2, 3 in the stage state)."""
    run_dir = tmp_path / "dcpo"
    run_train(
        run_dir,
        *fast_tiny_overrides(tiny_model_dir),
        *SHORT,
        "algorithm=dcpo",
        "task.num_train=8",
    )
    got = rows(run_dir)
    for step in (1, 2, 3):
        r = got[step]
        for key in ("actor/pg_loss", "actor/pg_clipfrac", "acr/raw", "acr/effective"):
            assert math.isfinite(r[key]), (step, key)
        # a collapsed group with a mixed history gets a signal: effective <= raw
        assert r["acr/effective"] <= r["acr/raw"]
    last = checkpoint.checkpoints(run_dir / "checkpoints")[-1]
    history = checkpoint.read_state(last)["advantage_stage"]["prompt_history"]
    # each of the 8 prompts visited once per step: visits 3, n = 3 x group size
    assert len(history) == 8
    assert {v[0] for v in history.values()} == {3}
