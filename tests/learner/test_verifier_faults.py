"""Issue 44: verifier faults are not collapse. A group with a verifier timeout or error (its
reward unknown: scored r_lo by the pool) is neither augmented nor counted as collapsed, gets no
gradient, and is counted on its own (``verifier/*``); the others are estimated as before."""

from __future__ import annotations

import pytest

from learner.advantage_stage import AdvantageStage, group_faults, informative_groups
from learner.config import AlgorithmConfig
from learner.trigger import TriggerConfig
from tests.helpers import V, groups_of

RELEASE = AlgorithmConfig(
    name="avspo_release", estimator="avspo_release", eps=1e-4, trigger=TriggerConfig("never")
)
AVSPO = AlgorithmConfig(name="avspo", estimator="avspo", trigger=TriggerConfig("always"))


def _step(cfg: AlgorithmConfig):
    """g0: four responses whose verification timed out (two of them were right: the pool
    scored them r_lo = 0, reason "timeout"); g1: a mixed group; g2: all wrong (true collapse)."""
    groups = groups_of([[3] * 4] * 3)
    verdicts = [V(0.0, "timeout")] * 4
    verdicts += [V(1.0), V(0.0, "wrong"), V(1.0), V(0.0, "wrong")]
    verdicts += [V(0.0, "wrong")] * 4
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    return stage.process(groups, verdicts, prompt_keys=["a", "b", "c"])


@pytest.mark.parametrize("cfg", [RELEASE, AVSPO], ids=["avspo_release", "avspo"])
def test_a_group_of_timeouts_is_not_pushed_down_nor_counted_collapsed(cfg):
    batch, m, collapsed, *_ = _step(cfg)
    adv = batch.advantages.tolist()
    # old code: g0 looked all-wrong (collapsed at r_lo), was augmented with a positive virtual
    # sample and every response in it, the right ones too, got a negative advantage
    assert adv[:4] == [0.0] * 4
    assert adv[4] > 0 and adv[6] > 0  # the mixed group is trained as before
    assert collapsed == [False, False, True]  # g2 only: g0's collapse is unknown
    # ACR over the groups whose rewards are known: g2 of {g1, g2}
    assert m["acr/raw"] == 0.5 and m["acr/low"] == 0.5
    assert m["avspo/augmented_groups"] == 1.0  # g2, never g0
    assert m["verifier/faulted_groups"] == 1.0 and m["verifier/faulted_group_frac"] == 1 / 3
    assert m["reward/verifier_timeout_frac"] == 4 / 12  # over every sample, as before
    assert len(batch) == 12  # g0 stays in the batch at zero advantage: batch sizes unchanged


def test_one_timeout_faults_its_group_and_a_right_response_there_is_never_pushed_down():
    """A right answer beside a timed-out one: the group's true rewards are unknown (the timeout
    may have been right), so no advantage is computed from it at all."""
    groups = groups_of([[3] * 4] * 2)
    verdicts = [V(1.0), V(1.0), V(1.0), V(0.0, "timeout"), V(1.0), V(0.0, "wrong")] + [
        V(0.0, "error"),
        V(1.0),
    ]
    for cfg in (RELEASE, AVSPO):
        stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
        batch, m, collapsed, *_ = stage.process(groups, verdicts)
        right = [i for i, v in enumerate(verdicts) if v.score == 1.0]
        assert all(batch.advantages[i] >= 0 for i in right)
        assert batch.advantages.abs().sum() == 0  # both groups faulted
        assert collapsed == [False, False] and m["verifier/faulted_groups"] == 2.0
        assert m["avspo/augmented_groups"] == 0.0


def test_faults_per_group_and_dapo_never_selects_a_faulted_group():
    groups = groups_of([[3, 3]] * 3)
    verdicts = [V(1.0), V(0.0, "timeout"), V(1.0), V(0.0, "wrong"), V(0.0, "error"), V(0.0)]
    faulted = group_faults(groups, verdicts)
    assert faulted == [True, False, True]
    scores = [v.score for v in verdicts]
    # g0 looks mixed (1, 0) but its 0 is a timeout: not informative for dynamic sampling
    assert informative_groups(groups, scores, tau=1e-6, faulted=faulted) == [False, True, False]


@pytest.mark.parametrize("cfg", [RELEASE, AVSPO], ids=["avspo_release", "avspo"])
def test_a_faulted_group_leaves_the_loss_and_the_trigger_mean(cfg, monkeypatch):
    """g0's four timeouts (scored r_lo, true rewards unknown) add no token to the loss's
    denominator and no reward to J_t: J_t = mean of g1 and g2 = (1 + 0 + 1 + 0 + 0 x 4) / 8 =
    0.25 (old code: over all 12 samples, 2 / 12, and g0's 12 tokens in the token-mean)."""
    seen = []
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    estimator = stage.estimator

    def spy(rewards, step, *args):
        seen.append(step.mean_reward)
        return estimator(rewards, step, *args)

    monkeypatch.setattr(stage, "estimator", spy)
    groups = groups_of([[3] * 4] * 3)
    verdicts = [V(0.0, "timeout")] * 4
    verdicts += [V(1.0), V(0.0, "wrong"), V(1.0), V(0.0, "wrong")] + [V(0.0, "wrong")] * 4
    batch, m, *_ = stage.process(groups, verdicts, prompt_keys=["a", "b", "c"])
    assert seen == [0.25]
    assert batch.response_mask[:4].sum() == 0  # g0: no token in the loss
    assert batch.response_mask[4:].sum() == 8 * 3  # the others: every response token
    assert len(batch) == 12 and m["reward/mean"] == 2 / 12  # reported over everything
