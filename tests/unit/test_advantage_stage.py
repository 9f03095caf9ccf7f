"""The driver's advantage stage (AdvantageStage.process): every generated group reaches the ACR
monitor, the trained ones reach the batch; DAPO's overlong shaping and filter; one tau."""

from __future__ import annotations

import math

import pytest
import torch

from learner.advantage_stage import AdvantageStage, overlong_penalty
from learner.config import AlgorithmConfig, OverlongConfig
from learner.trigger import TriggerConfig
from tests.helpers import V, groups_of

GRPO = AlgorithmConfig(name="grpo", estimator="grpo", trigger=TriggerConfig(policy="never"))


def test_dynamic_sampling_acr_raw_is_over_everything_generated():
    # 4 generated groups of 2: g0 mixed, g1 all 1, g2 mixed, g3 all 0; DAPO trains g0, g2 only.
    groups = groups_of([[1, 1]] * 4)
    verdicts = [V(1.0), V(0.0), V(1.0), V(1.0), V(0.0), V(1.0), V(0.0, "wrong"), V(0.0, "wrong")]
    stage = AdvantageStage(GRPO, reward_range=(0.0, 1.0), seed=0)
    batch, m, *_ = stage.process(groups, verdicts, trained=[True, False, True, False])
    assert m["acr/raw"] == 0.5  # g1, g3 collapsed, of 4 generated (before the filter)
    assert (m["acr/high"], m["acr/low"]) == (0.25, 0.25)
    assert m["acr/trained"] == 0.0  # the trained batch has no collapsed group
    # g1, g3 were not trained: no gradient from them, the same denominator as acr/raw
    assert m["acr/effective"] == 0.5 and m["acr/wasted_token_frac"] == 0.5
    assert len(batch) == 4  # g0 and g2's samples only
    # GRPO on (1, 0): mean 0.5, unbiased std 0.7071 -> +-0.7071 (eps 1e-6)
    assert batch.advantages.tolist() == pytest.approx([0.7071, -0.7071, -0.7071, 0.7071], 1e-4)
    assert m["reward/mean"] == m["reward/mean_trained"] == 0.5  # generated 4/8, trained 2/4
    assert stage.monitor.prompt_summary()["prompts_seen"] == 0  # no keys given


def test_response_length_clip_ratio_and_overlong_filter():
    groups = groups_of([[2, 8], [3, 8]], truncated={(0, 1), (1, 1)})
    verdicts = [V(1.0), V(0.0), V(0.0), V(1.0)]
    cfg = AlgorithmConfig(estimator="grpo", overlong=OverlongConfig(filter=True))
    batch, m, *_ = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0).process(groups, verdicts)
    assert m["response_length/clip_ratio"] == 0.5  # 2 of 4 samples hit max_new_tokens
    # truncated responses stay out of the loss (DAPO overlong filtering), others count
    assert batch.response_mask.sum(1).tolist() == [2.0, 0.0, 3.0, 0.0]
    assert batch.advantages.abs().min() > 0  # their advantages still shape the group baseline


def test_overlong_shaping_hand_computed():
    # L_max 8, L_cache 4: lengths 4 -> 0, 6 -> -0.5, 8 -> -1 (factor 1)
    pen = overlong_penalty(torch.tensor([4, 6, 8]), max_len=8, buffer_len=4, factor=1.0)
    assert pen.tolist() == [0.0, -0.5, -1.0]
    groups = groups_of([[4, 8]])  # both correct: r = (1 + 0, 1 - 1) = (1, 0)
    cfg = AlgorithmConfig(estimator="grpo", overlong=OverlongConfig(shaping=True, buffer_len=4))
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0, max_response_len=8)
    batch, m, *_ = stage.process(groups, [V(1.0), V(1.0)])
    # without shaping the group is collapsed; with it: (1, 0) -> GRPO +-0.7071
    assert m["acr/raw"] == 0.0 and m["reward/mean"] == 0.5
    assert batch.advantages.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_one_tau_for_estimator_and_monitor():
    # tau = 0.3: (0, 0.5) has population std 0.25 < 0.3 -> collapsed for the estimator (zero
    # advantages) and for the monitor alike; (0, 1) has 0.5 -> not collapsed
    cfg = AlgorithmConfig(estimator="grpo", tau=0.3, trigger=TriggerConfig(policy="never"))
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    batch, m, *_ = stage.process(groups_of([[1, 1], [1, 1]]), [V(0.0), V(0.5), V(0.0), V(1.0)])
    assert m["acr/raw"] == m["acr/trained"] == 0.5
    assert batch.advantages[:2].tolist() == [0.0, 0.0] and m["acr/effective"] == 0.5


def test_acr100_says_how_many_steps_it_covers():
    stage = AdvantageStage(GRPO, reward_range=(0.0, 1.0), seed=0)
    for step in range(1, 4):
        _, m, *_ = stage.process(groups_of([[1, 1]]), [V(1.0), V(1.0)])
        assert m["acr/acr100_steps"] == step and m["acr/acr100"] == 1.0


def test_state_round_trip_includes_the_monitor():
    a = AdvantageStage(AlgorithmConfig(), reward_range=(0.0, 1.0), seed=0)
    a.process(groups_of([[1, 1], [1, 1]]), [V(1.0), V(1.0), V(0.0), V(1.0)], prompt_keys=["x", "y"])
    b = AdvantageStage(AlgorithmConfig(), reward_range=(0.0, 1.0), seed=0)
    b.load_state_dict(a.state_dict())
    assert b.monitor.state_dict() == a.monitor.state_dict() and b.monitor.steps == 1
    _, ma, *_ = a.process(groups_of([[1, 1]]), [V(0.0), V(0.0)])
    _, mb, *_ = b.process(groups_of([[1, 1]]), [V(0.0), V(0.0)])
    assert all(ma[k] == mb[k] or (math.isnan(ma[k]) and math.isnan(mb[k])) for k in ma)


def test_dynamic_sampling_reward_and_length_are_over_everything_generated():
    # g0 (1, 0) len 2/2 trained; g1 (1, 1) len 4/4 dropped; g2 (0, 0) len 6/6 dropped.
    # Generated: reward 3/6 = 0.5, length (2+2+4+4+6+6)/6 = 4. Trained: reward 0.5, length 2.
    groups = groups_of([[2, 2], [4, 4], [6, 6]])
    verdicts = [V(1.0), V(0.0), V(1.0), V(1.0), V(0.0), V(0.0)]
    cfg = AlgorithmConfig(trigger=TriggerConfig(policy="adaptive", eta=0.5))
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    _, m, *_ = stage.process(groups, verdicts, trained=[True, False, False])
    assert (m["reward/mean"], m["reward/mean_trained"]) == (0.5, 0.5)
    assert (m["response_length/mean"], m["response_length/mean_trained"]) == (4.0, 2.0)
    # step 2 trains g1' = (1, 0) only while every generated reward is 1/6 -> J fell from
    # 0.5 to 1/6 (generated), though the trained mean stays 0.5: tau moves by
    # -0.5 * (0 - 0.5) = +0.25 (trained ACR 0 - tau 0.5), to 0.75.
    verdicts = [V(1.0), V(0.0), V(0.0), V(0.0), V(0.0), V(0.0)]
    _, m, *_ = stage.process(groups, verdicts, trained=[True, False, False])
    assert m["reward/mean"] == pytest.approx(1 / 6) and m["reward/mean_trained"] == 0.5
    assert stage.state.trigger.tau_adapt == pytest.approx(0.75)


def test_intrinsic_rewards_have_no_correct_incorrect_strata():
    # RENT's reward is -entropy: "all correct" / "all incorrect" mean nothing for it, so the
    # strata (defined against the task's r_lo) are not logged; the collapse rate still is.
    from reward.intrinsic import IntrinsicRewardConfig

    cfg = AlgorithmConfig(
        name="rent", estimator="grpo", tau=1e-3, trigger=TriggerConfig(policy="never"),
        reward=IntrinsicRewardConfig(verifier=0.0, neg_entropy=1.0),
    )  # fmt: skip
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    verdicts = [V(-0.5), V(-0.5), V(-0.2), V(-0.9)]  # g0 collapsed at -0.5, below r_lo = 0
    _, m, *_ = stage.process(groups_of([[1, 1], [1, 1]]), verdicts, prompt_keys=["a", "b"])
    assert m["acr/raw"] == 0.5
    assert "acr/high" not in m and "acr/low" not in m
    assert "always_solved" not in stage.monitor.prompt_summary()
    # the verifier's own reward keeps them
    _, m, *_ = AdvantageStage(GRPO, reward_range=(0.0, 1.0), seed=0).process(
        groups_of([[1, 1], [1, 1]]), [V(0.0), V(0.0), V(1.0), V(0.0)]
    )
    assert (m["acr/high"], m["acr/low"]) == (0.0, 0.5)


def test_dapo_filter_with_groups_of_unequal_size():
    # Groups of 1, 3 and 2 samples (failed samples leave groups short). Scores by group:
    # (1) -> G = 1, collapsed; (1, 0, 1) -> informative; (0, 0) -> collapsed. Grouping the 6
    # scores by a fixed n = 3 (the old code) would call (1, 1, 0) and (1, 0, 0) informative.
    from learner.advantage_stage import informative_groups

    groups = groups_of([[1], [1, 1, 1], [1, 1]])
    scores = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert informative_groups(groups, scores, tau=1e-6) == [False, True, False]
