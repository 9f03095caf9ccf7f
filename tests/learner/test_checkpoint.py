"""Learner checkpoints: a save/load round trip continues bit-exactly; bad `latest` is an error."""

from __future__ import annotations

import pytest
import torch

from learner import checkpoint
from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig, LearnerConfig
from learner.group import LearnerGroup
from learner.trigger import TriggerConfig
from tests.learner.test_learner_ray import _batch


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_round_trip_continues_bit_exactly(ray_cluster, tiny_model_dir, tmp_path, stage):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, first = _batch(model, seed=1)
    _, second = _batch(model, seed=2)
    cfg = LearnerConfig(
        num_ranks=2, zero_stage=stage, lr=1e-3, micro_batch_size=4, warmup_steps=3, timeout_s=600
    )
    algorithm = AlgorithmConfig(trigger=TriggerConfig(policy="adaptive", eta=0.5))
    root = tmp_path / "checkpoints"

    stage = AdvantageStage(algorithm, reward_range=(0.0, 1.0), seed=0)  # the driver's
    stage(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))  # trigger state
    stage(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    a = LearnerGroup(cfg, algorithm.loss, tiny_model_dir)
    try:
        a.train_on(first)
        sidecar = {"advantage_stage": stage.state_dict(), "extra": {"data_position": 17}}
        path = a.save_checkpoint(str(root), step=1, state=sidecar)
        continued = a.train_on(second)
        expected = a.export_weights()
    finally:
        a.shutdown()

    assert checkpoint.resolve("auto", root) == root / "step_000001"
    saved = AutoModelForCausalLM.from_pretrained(f"{path}/model", dtype=torch.float32)
    assert saved.config.vocab_size == model.config.vocab_size  # transformers loads it

    b = LearnerGroup(cfg, algorithm.loss, tiny_model_dir)
    try:
        state = b.load_checkpoint(path)
        resumed = b.train_on(second)
        got = b.export_weights()
    finally:
        b.shutdown()
    assert state["step"] == 1 and state["extra"] == {"data_position": 17}
    restored = AdvantageStage(algorithm, reward_range=(0.0, 1.0), seed=0)
    restored.load_state_dict(state["advantage_stage"])
    assert restored.trigger.state_dict() == stage.trigger.state_dict()  # threshold restored
    assert resumed["actor/lr"] == continued["actor/lr"]  # scheduler restored (warmup 2/3)
    for k in expected:
        assert torch.equal(expected[k], got[k]), k  # optimizer moments restored: bit-exact


def test_latest_pointing_nowhere_or_partial_is_an_error(tmp_path):
    root = tmp_path / "ckpt"
    assert checkpoint.resolve("auto", root) is None  # nothing yet: a fresh run
    root.mkdir()
    (root / "latest").write_text("step_000005")
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve("auto", root)
    partial = root / "step_000005"
    (partial / "model").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="incomplete"):
        checkpoint.resolve("auto", root)
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve(str(tmp_path / "nope"), root)
