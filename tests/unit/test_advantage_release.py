"""``avspo_release``: the authors' released AVSPO rule (docs/ARCHITECTURE.md section 4),
hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from learner.advantage import avspo_release_advantages
from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig
from learner.estimators import Step, get_estimator
from learner.trigger import TriggerConfig
from tests.helpers import load  # Hydra compose of conf/ + to_train_config

F64 = torch.float64
EPS = 1e-4


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def ids(x):
    return torch.tensor(x, dtype=torch.long)


# Two groups of G = 4 (ids 0 and 1), used by most tests.
G4 = ids([0] * 4 + [1] * 4)

# All-r_lo step, G = 4: v = 1 joins each group -> {0, 0, 0, 0, 1}: mean 0.2,
# unbiased std sqrt((4 * 0.04 + 0.64) / 4) = sqrt(0.2) = 0.447214 -> A = -0.2 / (0.447214 + 1e-4)
# = -0.447114 for every real sample.
A_ALL_ZERO = -0.2 / (math.sqrt(0.2) + EPS)


def test_all_zero_step_gets_one_virtual_one_per_group():
    assert math.isclose(A_ALL_ZERO, -0.447114, abs_tol=1e-6)
    res = avspo_release_advantages(t([0.0] * 8), G4)
    assert res.advantages.tolist() == pytest.approx([A_ALL_ZERO] * 8, rel=1e-12)
    assert res.triggered is True
    assert res.k.tolist() == [1, 1] and res.num_virtual == 2
    assert res.augmented.tolist() == [True, True] and res.collapsed.tolist() == [True, True]
    assert res.acr == 1.0


def test_all_one_step_gets_one_virtual_zero_per_group():
    # {1, 1, 1, 1, 0}: mean 0.8, same unbiased std sqrt(0.2) -> A = +0.2 / (0.447214 + 1e-4).
    res = avspo_release_advantages(t([1.0] * 8), G4)
    assert res.advantages.tolist() == pytest.approx([-A_ALL_ZERO] * 8, rel=1e-12)
    assert res.triggered is True and res.k.tolist() == [1, 1] and res.num_virtual == 2


def test_float32_rewards_and_unequal_group_sizes():
    # G = 2 and G = 3, all zero. {0, 0, 1}: mean 1/3, unbiased std sqrt((2/9 + 4/9) / 2)
    # = sqrt(1/3) = 0.577350 -> A = -(1/3) / 0.577450 = -0.577250.
    # {0, 0, 0, 1}: mean 1/4, unbiased std sqrt((3/16 + 9/16) / 3) = 0.5 -> A = -0.25 / 0.5001.
    res = avspo_release_advantages(torch.zeros(5), ids([7, 7, 3, 3, 3]))
    assert res.advantages.dtype == torch.float32
    a2 = -(1 / 3) / (math.sqrt(1 / 3) + EPS)
    a3 = -0.25 / (0.5 + EPS)
    assert a2 == pytest.approx(-0.577250, abs=1e-6) and a3 == pytest.approx(-0.499900, abs=1e-6)
    assert res.advantages.tolist() == pytest.approx([a2, a2, a3, a3, a3], rel=1e-6)
    assert res.num_virtual == 2 and res.k.tolist() == [1, 1]


def test_mixed_step_is_plain_grpo_with_eps_1e4_per_step():
    # scope="step": group 0 is all correct but the step holds 0s too -> collapsed, exactly 0.
    # Group 1 = (1, 0, 0, 0): mean 0.25,
    # unbiased std sqrt(0.75 / 3) = 0.5 -> A = 0.75 / 0.5001 = 1.499700, -0.25 / 0.5001 = -0.499900.
    res = avspo_release_advantages(t([1.0] * 4 + [1.0, 0.0, 0.0, 0.0]), G4, scope="step")
    assert res.advantages[:4].tolist() == [0.0] * 4
    assert res.advantages[4:].tolist() == pytest.approx(
        [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001], rel=1e-12
    )
    assert res.advantages[4].item() == pytest.approx(1.499700, abs=1e-6)
    assert res.triggered is False and res.num_virtual == 0
    assert res.k.tolist() == [0, 0] and res.augmented.tolist() == [False, False]
    assert res.collapsed.tolist() == [True, False] and res.acr == 0.5


def test_every_group_collapsed_at_both_labels_does_not_fire_per_step():
    # Every group is collapsed (ACR = 1) but the step holds both 0s and 1s: not "every reward
    # equals one label", so plain GRPO: every group collapsed -> all advantages exactly 0.
    res = avspo_release_advantages(t([0.0] * 4 + [1.0] * 4), G4, scope="step")
    assert res.advantages.tolist() == [0.0] * 8
    assert res.acr == 1.0
    assert res.triggered is False and res.num_virtual == 0 and res.k.tolist() == [0, 0]


def test_partial_credit_collapse_does_not_fire():
    # All rewards 0.5: every group collapsed, but 0.5 is neither r_lo nor r_hi -> plain GRPO, 0.
    res = avspo_release_advantages(t([0.5] * 8), G4)
    assert res.advantages.tolist() == [0.0] * 8 and res.triggered is False


def test_non_binary_range_all_r_lo_gets_r_hi():
    # reward_range (-1, 2), G = 3, all -1: v = 2 -> {-1, -1, -1, 2}: mean -0.25,
    # M2 = 3 * 0.75^2 + 2.25^2 = 1.6875 + 5.0625 = 6.75, unbiased std sqrt(6.75 / 3) = 1.5
    # -> A = -0.75 / (1.5 + 1e-4) = -0.499967.
    res = avspo_release_advantages(t([-1.0] * 6), ids([0, 0, 0, 1, 1, 1]), reward_range=(-1, 2))
    a = -0.75 / (1.5 + EPS)
    assert a == pytest.approx(-0.499967, abs=1e-6)
    assert res.advantages.tolist() == pytest.approx([a] * 6, rel=1e-12)
    assert res.triggered is True and res.num_virtual == 2
    # all 2 (r_hi): v = -1 -> mirror image, A = +0.499967
    hi = avspo_release_advantages(t([2.0] * 6), ids([0, 0, 0, 1, 1, 1]), reward_range=(-1, 2))
    assert hi.advantages.tolist() == pytest.approx([-a] * 6, rel=1e-12)
    # all 0 with this range is a partial-credit collapse, not r_lo: no fire
    mid = avspo_release_advantages(t([0.0] * 6), ids([0, 0, 0, 1, 1, 1]), reward_range=(-1, 2))
    assert mid.triggered is False and mid.advantages.tolist() == [0.0] * 6


def test_population_std_option():
    # unbiased=False: {0, 0, 0, 0, 1} population std sqrt(0.8 / 5) = 0.4 -> A = -0.2 / 0.4001.
    res = avspo_release_advantages(t([0.0] * 8), G4, unbiased=False)
    assert res.advantages.tolist() == pytest.approx([-0.2 / 0.4001] * 8, rel=1e-12)


def test_bad_reward_range_is_rejected():
    with pytest.raises(ValueError, match="r_lo < r_hi"):
        avspo_release_advantages(t([0.0] * 4), ids([0] * 4), reward_range=(1.0, 1.0))


def test_registry_matches_the_direct_call():
    cfg = AlgorithmConfig(estimator="avspo_release", eps=1e-4)
    fn = get_estimator("avspo_release").fn
    assert get_estimator("avspo_release").make_state is None  # no trigger, no state
    for rewards in ([0.0] * 8, [1.0] * 8, [1.0] * 4 + [1.0, 0.0, 0.0, 0.0]):
        r = t(rewards)
        via = fn(r, Step(G4, reward_range=(0.0, 1.0)), cfg, None)
        direct = avspo_release_advantages(r, G4)
        assert torch.equal(via.advantages, direct.advantages)
        assert (via.triggered, via.num_virtual, via.k.tolist()) == (
            direct.triggered,
            direct.num_virtual,
            direct.k.tolist(),
        )
    # no threshold: a trigger the paper's rule could never exceed changes nothing
    never = AlgorithmConfig(estimator="avspo_release", trigger=TriggerConfig(policy="never"))
    via = fn(t([0.0] * 8), Step(G4), never, None)
    assert via.triggered is True and "avspo/tau_adapt" not in via.metrics


def test_advantage_stage_reports_the_release_rule():
    cfg = AlgorithmConfig(estimator="avspo_release", eps=1e-4)
    stage = AdvantageStage(cfg, reward_range=(0, 1), seed=0)
    res, m = stage(t([0.0] * 8), G4)
    assert m["avspo/triggered"] == 1.0 and m["avspo/virtual_samples"] == 2.0
    assert m["avspo/augmented_groups"] == 2.0 and m["avspo/k"] == 1.0
    assert res.advantages.tolist() == pytest.approx([A_ALL_ZERO] * 8, rel=1e-12)
    _, m = stage(t([1.0, 0.0, 1.0, 0.0] + [1.0, 0.0, 0.0, 0.0]), G4)  # no single-label group
    assert m["avspo/triggered"] == 0.0 and m["avspo/virtual_samples"] == 0.0


def test_preset_composes():
    a = load("algorithm=avspo_release").algorithm
    assert (a.name, a.estimator, a.eps) == ("avspo_release", "avspo_release", 1e-4)
    # everything else is the schema default
    assert (a.tau, a.unbiased_std) == (1e-6, True)


# ---- release_scope (issue 24): per group (the fork's batch is one group) or per step ----------

G3x4 = ids([0] * 4 + [1] * 4 + [2] * 4)
MIXED3 = [0.0] * 4 + [1.0, 0.0, 0.0, 0.0] + [1.0] * 4  # all-0 | mixed | all-1


def test_group_scope_augments_every_single_label_group_in_a_mixed_step():
    # Group 0 (all 0): v = 1 -> A_ALL_ZERO; group 1 (1, 0, 0, 0): GRPO, eps 1e-4 -> 0.75 / 0.5001,
    # -0.25 / 0.5001; group 2 (all 1): v = 0 -> {1, 1, 1, 1, 0}, the mirror image -A_ALL_ZERO.
    res = avspo_release_advantages(t(MIXED3), G3x4, scope="group")
    want = [A_ALL_ZERO] * 4 + [0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [-A_ALL_ZERO] * 4
    assert res.advantages.tolist() == pytest.approx(want, rel=1e-12)
    assert res.augmented.tolist() == [True, False, True]
    assert res.k.tolist() == [1, 0, 1] and res.num_virtual == 2 and res.triggered is True
    assert res.collapsed.tolist() == [True, False, True]


def test_step_scope_leaves_the_same_step_as_grpo():
    # The literal reading: the step holds both labels, so nothing fires; collapsed groups get 0.
    res = avspo_release_advantages(t(MIXED3), G3x4, scope="step")
    want = [0.0] * 4 + [0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [0.0] * 4
    assert res.advantages.tolist() == pytest.approx(want, rel=1e-12)
    assert res.triggered is False and res.num_virtual == 0


def test_group_scope_skips_partial_credit_collapse():
    # (0.5 x 4) is collapsed but at neither label: GRPO's exact 0; group 1 (all 0) still fires.
    res = avspo_release_advantages(t([0.5] * 4 + [0.0] * 4), G4, scope="group")
    assert res.advantages[:4].tolist() == [0.0] * 4
    assert res.advantages[4:].tolist() == pytest.approx([A_ALL_ZERO] * 4, rel=1e-12)
    assert res.augmented.tolist() == [False, True]


@pytest.mark.parametrize("rewards", [[0.0] * 4, [1.0] * 4, [1.0, 0.0, 0.0, 0.0]])
def test_one_group_batch_is_the_same_under_both_scopes(rewards):
    # The fork's published setting: its batch is one group, where the two readings coincide.
    g = ids([0] * 4)
    a = avspo_release_advantages(t(rewards), g, scope="group")
    b = avspo_release_advantages(t(rewards), g, scope="step")
    assert torch.equal(a.advantages, b.advantages)
    assert (a.triggered, a.num_virtual) == (b.triggered, b.num_virtual)


def test_unknown_scope_is_rejected():
    with pytest.raises(ValueError, match="scope"):
        avspo_release_advantages(t([0.0] * 4), ids([0] * 4), scope="batch")


def test_preset_applies_the_rule_per_group():
    cfg = load("algorithm=avspo_release").algorithm
    assert cfg.avspo.release_scope == "group"
    res, m = AdvantageStage(cfg, reward_range=(0, 1), seed=0)(t(MIXED3), G3x4)
    assert m["avspo/augmented_groups"] == 2.0 and m["avspo/virtual_samples"] == 2.0
    step = load("algorithm=avspo_release", "algorithm.avspo.release_scope=step").algorithm
    _, m = AdvantageStage(step, reward_range=(0, 1), seed=0)(t(MIXED3), G3x4)
    assert m["avspo/augmented_groups"] == 0.0
