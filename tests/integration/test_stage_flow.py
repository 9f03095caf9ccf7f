"""The production stages in process, no Ray: rollout (hf engine) -> verifier pool -> the driver's
advantage stage + ACR monitor (AdvantageStage.process) -> the rank's micro-batch loss
(learner.update.microbatch_loss) and its gradient, at a sampling temperature != 1."""

from __future__ import annotations

import pytest
import torch

from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig
from learner.loss import LossConfig
from learner.trigger import TriggerConfig
from learner.update import microbatch_loss
from reward import verify
from reward.tasks import TaskConfig, make_task
from rollout.hf_engine import HFEngine
from rollout.types import SamplingConfig
from tests.metric_names import SECTION5


def _step(engine, problems, cfg: AlgorithmConfig, params: SamplingConfig):
    groups = engine.generate([p.prompt for p in problems], params)
    responses = [s.text for g in groups for s in g.samples]
    references = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g.samples]
    verdicts = verify(responses, references, verifier="numeric")
    stage = AdvantageStage(
        cfg, reward_range=(0.0, 1.0), seed=0, pad_id=engine.tokenizer.pad_token_id
    )
    batch, metrics, *_ = stage.process(groups, verdicts, prompt_keys=[p.uid for p in problems])
    model = engine.model
    model.zero_grad()
    out, logp = microbatch_loss(
        model,
        batch,
        LossConfig(),
        temperature=params.temperature or 1.0,
        total_tokens=float(batch.num_tokens),
        total_seqs=float(len(batch)),
    )
    out.loss.backward()
    grad = sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None) ** 0.5
    # the engine's log-probs are the learner's at the same temperature: ratio 1 at the start
    assert torch.allclose(logp * batch.response_mask, batch.old_logprobs, atol=1e-5)
    assert out.metrics["approx_kl"].item() == pytest.approx(0.0, abs=1e-6)  # k3 at ratio 1
    return metrics, float(grad), batch


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = HFEngine(tiny_model_dir)
    for p in engine.model.parameters():
        p.requires_grad_(True)
    return engine


def test_greedy_collapse_gets_a_gradient_from_avspo_only(engine):
    task = make_task(TaskConfig(difficulty=0, num_train=8, num_test=1))  # easy: groups collapse
    # greedy: the 8 samples of a prompt are identical, so every group collapses (ACR = 1)
    greedy = SamplingConfig(n=8, temperature=0.0)
    grpo = AlgorithmConfig(estimator="grpo", trigger=TriggerConfig(policy="never"))
    avspo = AlgorithmConfig(trigger=TriggerConfig(policy="always"))
    m_grpo, g_grpo, b_grpo, *_ = _step(engine, task.train, grpo, greedy)
    m_avspo, g_avspo, b_avspo, *_ = _step(engine, task.train, avspo, greedy)
    assert set(m_avspo) >= SECTION5 | {"acr/trained", "response_length/clip_ratio"}
    assert m_grpo["acr/raw"] == m_avspo["acr/raw"] == 1.0 == m_grpo["acr/trained"]
    assert m_grpo["acr/batch_collapsed"] == 1.0 and m_grpo["acr/effective"] == 1.0
    assert m_avspo["avspo/triggered"] == 1.0 and m_avspo["avspo/virtual_samples"] > 0
    assert m_avspo["acr/effective"] == 0.0  # every group got a signal from virtual samples
    assert g_grpo == 0.0 and g_avspo > 0.0  # GRPO learns nothing from this batch; AVSPO does
    assert b_grpo.advantages.abs().sum() == 0 and b_avspo.advantages.abs().sum() > 0


def test_sampling_at_t_0_6_the_learner_scores_what_was_sampled(engine):
    """At T = 0.6 the engine's log-probs are log_softmax(logits / 0.6) and the learner divides
    its logits by 0.6 too: the PPO ratio starts at 1 (checked inside _step). On the old code the
    engine reported T = 1 log-probs while sampling at 0.6 and this failed."""
    task = make_task(TaskConfig(difficulty=2, num_train=8, num_test=1))
    params = SamplingConfig(n=8, temperature=0.6, max_new_tokens=8, seed=3)
    metrics, grad, batch, *_ = _step(engine, task.train, AlgorithmConfig(), params)
    assert grad > 0 and batch.num_tokens > 0
    plain = engine.generate([task.train[0].prompt], params)[0].samples[0]
    t1 = engine.score(
        engine.generate([task.train[0].prompt], params)[0].prompt_ids, plain.response_ids
    )
    assert not torch.allclose(torch.tensor(t1), torch.tensor(plain.logprobs), atol=1e-3)
