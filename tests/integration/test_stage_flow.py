"""The stages wired by hand, in process (the driver loop comes later): rollout (hf engine) ->
verifier pool -> advantage stage + ACR monitor -> train batch -> policy loss and its gradient."""

from __future__ import annotations

import torch

from diagnostics.acr import ACRMonitor, MonitorConfig
from learner.advantage_stage import AdvantageStage
from learner.batch import build_batch, token_logprobs
from learner.config import AlgorithmConfig
from learner.loss import policy_loss
from learner.trigger import TriggerConfig
from reward import verify
from reward.tasks import TaskConfig, make_task
from rollout.hf_engine import HFEngine
from rollout.types import SamplingConfig
from tests.metric_names import SECTION5


def _step(engine, problems, cfg: AlgorithmConfig):
    # greedy: the 8 samples of a prompt are identical, so every group collapses (ACR = 1)
    groups = engine.generate([p.prompt for p in problems], SamplingConfig(n=8, temperature=0.0))
    responses = [s.text for g in groups for s in g.samples]
    references = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g.samples]
    verdicts = verify(responses, references, verifier="numeric")
    rewards = torch.tensor([v.score for v in verdicts])
    group_ids = torch.arange(len(groups)).repeat_interleave(8)
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    result, avspo_metrics = stage(rewards, group_ids)
    batch = build_batch(groups, result.advantages, pad_id=engine.tokenizer.pad_token_id)
    metrics = ACRMonitor(MonitorConfig()).update(
        rewards,
        group_ids,
        result.advantages,
        batch.response_mask.sum(1),
        prompt_keys=[p.uid for p in problems],
        verifier_reasons=[v.reason for v in verdicts],
        stats=result.stats,
    )
    model = engine.model
    model.zero_grad()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = token_logprobs(logits, batch.input_ids)
    out = policy_loss(logp, batch.old_logprobs, batch.advantages, batch.response_mask)
    out.loss.backward()
    grad = sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5
    # the engine's log-probs are the learner's: ratio 1 at the start of the update
    assert torch.allclose(logp * batch.response_mask, batch.old_logprobs, atol=1e-5)
    return {**metrics, **avspo_metrics}, float(grad), result


def test_stage_flow_on_the_tiny_model(tiny_model_dir):
    engine = HFEngine(tiny_model_dir)
    for p in engine.model.parameters():
        p.requires_grad_(True)
    task = make_task(TaskConfig(difficulty=0, num_train=8, num_test=1))  # easy: groups collapse
    grpo = AlgorithmConfig(estimator="grpo", trigger=TriggerConfig(policy="never"))
    avspo = AlgorithmConfig(trigger=TriggerConfig(policy="always"))
    m_grpo, g_grpo, r_grpo = _step(engine, task.train, grpo)
    m_avspo, g_avspo, r_avspo = _step(engine, task.train, avspo)
    assert set(m_avspo) >= SECTION5
    assert m_grpo["acr/raw"] == m_avspo["acr/raw"] == 1.0
    assert m_grpo["acr/batch_collapsed"] == 1.0 and m_grpo["acr/effective"] == 1.0
    assert m_avspo["avspo/triggered"] == 1.0 and m_avspo["avspo/virtual_samples"] > 0
    assert m_avspo["acr/effective"] == 0.0  # every group got a signal from virtual samples
    assert g_grpo == 0.0 and g_avspo > 0.0  # GRPO learns nothing from this batch; AVSPO does
    assert r_grpo.advantages.abs().sum() == 0 and r_avspo.advantages.abs().sum() > 0
