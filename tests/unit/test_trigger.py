"""AVSPO trigger policies (paper Eq. 12) and the advantage stage that uses them."""

from __future__ import annotations

import json

import pytest
import torch

from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig, AvspoConfig
from learner.trigger import TriggerConfig, make_trigger


def test_adaptive_update_rule_by_hand():
    trig = make_trigger(TriggerConfig(policy="adaptive", tau_adapt_0=0.5, eta=0.1))
    trig.observe(acr=0.9, mean_reward=0.30)  # step 0: no J_{t-1} -> no update
    assert trig.tau_adapt == 0.5
    trig.observe(acr=0.9, mean_reward=0.40)  # J up: 0.5 + 0.1 * (+1) * (0.9 - 0.5) = 0.54
    assert trig.tau_adapt == pytest.approx(0.54)
    trig.observe(acr=0.2, mean_reward=0.35)  # J down: 0.54 + 0.1 * (-1) * (0.2 - 0.54) = 0.574
    assert trig.tau_adapt == pytest.approx(0.574)
    trig.observe(acr=0.0, mean_reward=0.35)  # J equal: sign 0 -> unchanged
    assert trig.tau_adapt == pytest.approx(0.574)


def test_adaptive_is_clipped_to_bounds():
    trig = make_trigger(TriggerConfig(policy="adaptive", tau_adapt_0=0.5, eta=1.0))
    trig.observe(acr=1.0, mean_reward=0.0)
    trig.observe(acr=1.0, mean_reward=1.0)  # 0.5 + 1 * (1 - 0.5) = 1.0 -> clipped to 0.9
    assert trig.tau_adapt == 0.9
    trig.observe(acr=0.0, mean_reward=2.0)  # 0.9 + 1 * (0 - 0.9) = 0 -> clipped to 0.1
    assert trig.tau_adapt == 0.1


def test_fixed_always_never():
    assert make_trigger(TriggerConfig(policy="fixed", tau_adapt_0=0.3)).tau_adapt == 0.3
    for policy, tau in (("always", 0.0), ("never", 1.0)):
        trig = make_trigger(TriggerConfig(policy=policy))
        trig.observe(acr=1.0, mean_reward=0.0)
        trig.observe(acr=1.0, mean_reward=1.0)
        assert trig.tau_adapt == tau  # never moves


def test_state_round_trip_is_json_and_continues_identically():
    cfg = TriggerConfig(policy="adaptive", eta=0.2)
    a = make_trigger(cfg)
    for acr, j in ((0.8, 0.1), (0.7, 0.3)):
        a.observe(acr, j)
    b = make_trigger(cfg)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    a.observe(0.6, 0.2)
    b.observe(0.6, 0.2)
    assert a.tau_adapt == b.tau_adapt and a.state_dict() == b.state_dict()


def test_bad_trigger_config():
    with pytest.raises(ValueError, match="outside"):
        make_trigger(TriggerConfig(policy="adaptive", tau_adapt_0=0.95))
    with pytest.raises(ValueError, match="unknown trigger policy"):
        make_trigger(TriggerConfig(policy="sometimes"))


def test_stage_decides_with_current_threshold_then_updates():
    # Every step: one all-correct group and one mixed -> ACR 0.5. Mean reward rises each step.
    cfg = AlgorithmConfig(
        trigger=TriggerConfig(
            policy="adaptive", tau_adapt_0=0.45, eta=0.5, tau_min=0.1, tau_max=0.9
        )
    )
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r1 = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])  # J = 5/8
    r2 = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])  # J = 6/8
    res1, m1 = stage(r1, g)
    # 0.5 > 0.45: triggered; K = ceil(4 * 0.5 ** 0.5) = ceil(2.83) = 3 for the collapsed group.
    assert m1["avspo/triggered"] == 1.0 and m1["avspo/tau_adapt"] == 0.45
    assert m1["avspo/k"] == 3.0 and m1["avspo/virtual_samples"] == 3.0
    assert m1["avspo/augmented_groups"] == 1.0
    assert (res1.advantages[:4] > 0).all()
    # First step: no update. Second step decides with 0.45, then J rose:
    # 0.45 + 0.5 * (0.5 - 0.45) = 0.475.
    _, m2 = stage(r2, g)
    assert m2["avspo/tau_adapt"] == 0.45
    assert stage.state.trigger.tau_adapt == pytest.approx(0.475)


def test_stage_state_round_trip_includes_rng():
    cfg = AlgorithmConfig(
        avspo=AvspoConfig(strategy="random"), trigger=TriggerConfig(policy="always")
    )
    r = torch.tensor([1.0] * 4 + [0.0] * 4)
    g = torch.tensor([0] * 4 + [1] * 4)
    a = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=5)
    a(r, g)
    b = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=99)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert torch.equal(a(r, g)[0].advantages, b(r, g)[0].advantages)


def test_grpo_has_no_trigger_whatever_the_trigger_config_says():
    """GRPO keeps no trigger state and logs no threshold, even with a trigger config that would
    fire on every collapsed group (policy always): presets need no trigger switch. It logs
    what it did to collapsed groups (nothing), as every method does."""
    cfg = AlgorithmConfig(estimator="grpo", trigger=TriggerConfig(policy="always"))
    stage = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)
    res, m = stage(torch.ones(8), torch.tensor([0] * 4 + [1] * 4))
    assert stage.state is None and "avspo/tau_adapt" not in m and "avspo/acr_trigger" not in m
    assert m["avspo/triggered"] == 0.0 and m["avspo/augmented_groups"] == 0.0  # what it did
    assert res.advantages.abs().sum() == 0


# ---- algorithm.trigger.acr_window (issue 24): ACR over the groups of the last W steps ---------

ONE_GROUP = torch.zeros(8, dtype=torch.long)
COLLAPSED, MIXED = torch.ones(8), torch.tensor([1.0, 0.0] * 4)


def _window_stage(window: int, policy: str = "fixed") -> AdvantageStage:
    cfg = AlgorithmConfig(trigger=TriggerConfig(policy=policy, tau_adapt_0=0.5, acr_window=window))
    return AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0)


def test_window_of_one_is_the_step_acr():
    # One prompt per step: the step's ACR is 1 whenever its group collapses, so K = G = 8.
    stage = _window_stage(1)
    for rewards in (COLLAPSED, MIXED, COLLAPSED):
        _, m = stage(rewards, ONE_GROUP)
    assert m["avspo/acr_trigger"] == 1.0 and m["avspo/k"] == 8.0


def test_window_acr_sets_the_trigger_and_k():
    stage = _window_stage(3)
    _, m = stage(COLLAPSED, ONE_GROUP)  # window 1/1 = 1 > 0.5: K = ceil(8 * 1) = 8
    assert (m["avspo/acr_trigger"], m["avspo/triggered"], m["avspo/k"]) == (1.0, 1.0, 8.0)
    _, m = stage(MIXED, ONE_GROUP)  # window 1/2 = 0.5, not > 0.5
    assert (m["avspo/acr_trigger"], m["avspo/triggered"]) == (0.5, 0.0)
    res, m = stage(COLLAPSED, ONE_GROUP)  # window 2/3 > 0.5: K = ceil(8 * sqrt(2/3)) = ceil(6.53)
    assert m["avspo/acr_trigger"] == pytest.approx(2 / 3) and m["avspo/k"] == 7.0
    assert res.acr == 1.0  # the step's own ACR is still reported as ACR_t
    _, m = stage(COLLAPSED, ONE_GROUP)  # steps 2-4: 2/3 again (step 1 left the window)
    assert m["avspo/acr_trigger"] == pytest.approx(2 / 3) and m["avspo/k"] == 7.0
    _, m = stage(MIXED, ONE_GROUP)  # steps 3-5: 2/3 but nothing to augment
    assert m["avspo/triggered"] == 1.0 and m["avspo/augmented_groups"] == 0.0


def test_window_counts_groups_not_steps():
    # Steps of 2 and 1 groups: (1 collapsed of 2) then (1 of 1) -> window 2/3, not mean(0.5, 1).
    stage = _window_stage(2)
    stage(torch.tensor([1.0] * 4 + [1.0, 0.0, 1.0, 0.0]), torch.tensor([0] * 4 + [1] * 4))
    _, m = stage(torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert m["avspo/acr_trigger"] == pytest.approx(2 / 3)


def test_adaptive_update_uses_the_window_acr():
    # eta 0.5. Step 1 (mixed, J = 0.5): no update. Step 2 (collapsed, J = 1 rose): with W = 2
    # the ACR is (0 + 1) / 2 = 0.5 -> tau = 0.5 + 0.5 * (0.5 - 0.5) = 0.5; with W = 1 it is 1
    # -> 0.5 + 0.5 * (1 - 0.5) = 0.75.
    cfg = lambda w: AlgorithmConfig(  # noqa: E731
        trigger=TriggerConfig(policy="adaptive", tau_adapt_0=0.5, eta=0.5, acr_window=w)
    )
    for window, want in ((2, 0.5), (1, 0.75)):
        stage = AdvantageStage(cfg(window), reward_range=(0.0, 1.0), seed=0)
        stage(MIXED, ONE_GROUP)
        stage(COLLAPSED, ONE_GROUP)
        assert stage.state.trigger.tau_adapt == pytest.approx(want), window


def test_window_is_in_the_checkpoint_state():
    a = _window_stage(3)
    a(COLLAPSED, ONE_GROUP)
    a(MIXED, ONE_GROUP)
    b = _window_stage(3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert a(COLLAPSED, ONE_GROUP)[1] == b(COLLAPSED, ONE_GROUP)[1]


def test_paper_preset_windows_at_least_32_groups():
    from tests.helpers import load

    cfg = load("experiment=paper_qwen2.5_math_1.5b")
    groups = cfg.algorithm.trigger.acr_window * cfg.trainer.prompts_per_step
    assert cfg.trainer.prompts_per_step == 1 and groups >= 32
