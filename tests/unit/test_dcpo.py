"""DCPO (arXiv 2509.02333): smooth advantage standardisation with per-prompt history, its
dynamic clip bounds and the per-prompt state in checkpoints; numbers derived by hand."""

from __future__ import annotations

import dataclasses
import json
import math

import torch

from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig
from learner.dcpo import dcpo_advantages
from learner.loss import LossConfig, dynamic_clip_bounds, policy_loss
from learner.trigger import TriggerConfig
from tests.helpers import V, groups_of

DCPO = AlgorithmConfig(
    name="dcpo",
    estimator="dcpo",
    eps=0.0,  # exact hand numbers (the default 1e-6 moves the 6th digit)
    trigger=TriggerConfig(policy="never"),
    loss=LossConfig(clip_mode="dynamic", clip_low=0.16, clip_high=0.2),
)
ONE = torch.zeros(4, dtype=torch.long)  # one group of 4


def _r(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_first_visit_is_grpo():
    # i = 1: SA_1 = A_total, SA_2 = A_new, and the totals are this group's: GRPO exactly.
    # [1, 0, 0, 0]: mean 1/4, unbiased std 1/2 -> 1.5, -0.5
    res, new = dcpo_advantages(_r(1, 0, 0, 0), ONE, [None], eps=0.0)
    assert [round(a, 6) for a in res.advantages.tolist()] == [1.5, -0.5, -0.5, -0.5]
    # (visits, n, mean, m2): m2 = 1 * (3/4)^2 + 3 * (1/4)^2 = 0.75
    assert new == [(1, 4, 0.25, 0.75)]


def test_a_group_collapsed_now_gets_a_signal_from_its_history():
    # visit 1: [1, 0, 0, 0] (mixed); visit 2: [1, 1, 1, 1] (collapsed: GRPO gives 0).
    _, (state,) = dcpo_advantages(_r(1, 0, 0, 0), ONE, [None], eps=0.0)
    res, (after,) = dcpo_advantages(_r(1, 1, 1, 1), ONE, [state], eps=0.0)
    # all 8 rewards: 5 ones, mean 5/8, m2 = 8 * (5/8)(3/8) = 1.875, unbiased std
    # sqrt(1.875 / 7) = 0.517549; A_total(1) = (3/8) / 0.517549 = 0.724569; A_new = 0;
    # i = 2: SA_1 = SA_2 = A_total / 2 = 0.362284
    want = 0.375 / math.sqrt(1.875 / 7) / 2
    assert all(abs(a - want) < 1e-9 for a in res.advantages.tolist())
    assert res.collapsed.tolist() == [True] and res.augmented.tolist() == [True]
    assert after == (2, 8, 0.625, 1.875)


def test_the_smaller_magnitude_blend_is_kept():
    # visit 3 of a prompt after [1, 0, 0, 0] and [1, 1, 0, 0] (3 of 8 correct: mean 3/8,
    # m2 = 8 * (3/8)(5/8) = 1.875); now [1, 0, 0, 0].
    # A_new: 1.5 / -0.5. All 12: 4 correct, mean 1/3, m2 = 12 * (1/3)(2/3) = 8/3, unbiased
    # std sqrt((8/3) / 11) = 0.492366: A_total = (2/3) / 0.492366 = 1.354006 and
    # -(1/3) / 0.492366 = -0.677003. i = 3:
    #   correct:   SA_1 = 1.354006/3 + 2/3 * 1.5    = 1.451335, SA_2 = 1.5/3 + 2/3 * 1.354006
    #              = 1.402671 -> SA_2;
    #   incorrect: SA_1 = -0.677003/3 - 2/3 * 0.5   = -0.559001, SA_2 = -0.5/3 - 2/3 * 0.677003
    #              = -0.618002 -> SA_1.
    res, _ = dcpo_advantages(_r(1, 0, 0, 0), ONE, [(2, 8, 0.375, 1.875)], eps=0.0)
    got = [round(a, 6) for a in res.advantages.tolist()]
    assert got == [1.402671, -0.559001, -0.559001, -0.559001]


def test_a_prompt_collapsed_at_every_visit_stays_at_zero():
    # all 8 rewards equal: the totals are collapsed too, no signal anywhere (never NaN)
    _, (state,) = dcpo_advantages(_r(0, 0, 0, 0), ONE, [None], eps=0.0)
    res, _ = dcpo_advantages(_r(0, 0, 0, 0), ONE, [state], eps=0.0)
    assert res.advantages.tolist() == [0.0] * 4 and res.augmented.tolist() == [False]


def test_dynamic_clip_bounds_at_a_few_old_probabilities():
    # low = 0.5 + 0.5 sqrt(max(1 - 4 * 0.16 / q, 0)), high = 0.5 + 0.5 sqrt(1 + 4 * 0.2 / q):
    # q = 1: sqrt(0.36) = 0.6 -> 0.8; sqrt(1.8) = 1.341641 -> 1.170820
    # q = 0.64: 1 - 1 = 0 -> 0.5; sqrt(2.25) = 1.5 -> 1.25
    # q = 0.01: low 0.5; sqrt(81) = 9 -> 5.0;  q = 1e-4: sqrt(8001) -> 45.2, capped at 10
    q = torch.tensor([1.0, 0.64, 0.01, 1e-4], dtype=torch.float64)
    low, high = dynamic_clip_bounds(q.log(), 0.16, 0.2, 10.0)
    assert [round(x, 6) for x in low.tolist()] == [0.8, 0.5, 0.5, 0.5]
    assert [round(x, 6) for x in high.tolist()] == [1.17082, 1.25, 5.0, 10.0]


def test_the_dynamic_clip_lets_a_rare_token_move_further():
    # Two tokens with ratio 2 and A = +1: q = 0.01 (bound 5: not clipped, term -2) and q = 1
    # (bound 1.170820: clipped, term -1.170820). Token-mean: (-2 - 1.170820) / 2 = -1.585410.
    old = torch.tensor([[0.01, 1.0]]).log()
    new = old + math.log(2.0)
    dynamic = LossConfig(clip_mode="dynamic", clip_low=0.16, clip_high=0.2)
    out = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), dynamic)
    assert abs(out.loss.item() - (-1.585410)) < 1e-5
    assert out.metrics["pg_clipfrac"].item() == 0.5
    fixed = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), LossConfig(clip_high=0.2))
    assert abs(fixed.loss.item() - (-1.2)) < 1e-6  # both clipped at 1.2


def test_the_stage_keeps_history_per_prompt_and_checkpoints_it():
    a = AdvantageStage(DCPO, reward_range=(0.0, 1.0), seed=0)
    # step 1: prompt x mixed, prompt y collapsed (all 0)
    a.process(groups_of([[1] * 4, [1] * 4]), [V(1), V(0), V(0), V(0)] + [V(0)] * 4,
              prompt_keys=["x", "y"])  # fmt: skip
    state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint holds
    assert state["prompt_history"] == {"x": [1, 4, 0.25, 0.75], "y": [1, 4, 0.0, 0.0]}
    b = AdvantageStage(DCPO, reward_range=(0.0, 1.0), seed=0)
    b.load_state_dict(state)
    # step 2: x all correct (collapsed now): both stages give it the history's 0.362284
    step2 = (groups_of([[1] * 4]), [V(1)] * 4)
    batch_a, ma, *_ = a.process(*step2, prompt_keys=["x"])
    batch_b, mb, *_ = b.process(*step2, prompt_keys=["x"])
    assert torch.equal(batch_a.advantages, batch_b.advantages)
    assert abs(float(batch_a.advantages[0]) - 0.375 / math.sqrt(1.875 / 7) / 2) < 1e-6
    assert a.state_dict() == b.state_dict()
    assert ma["acr/raw"] == 1.0 and ma["avspo/augmented_groups"] == 1.0


def test_a_prompt_twice_in_one_step_sees_its_first_group():
    stage = AdvantageStage(DCPO, reward_range=(0.0, 1.0), seed=0)
    verdicts = [V(1), V(0), V(0), V(0)] + [V(1)] * 4
    batch, *_ = stage.process(groups_of([[1] * 4, [1] * 4]), verdicts, prompt_keys=["x", "x"])
    # group 1 = visit 1 of x (GRPO: 1.5, -0.5); group 2 = visit 2, collapsed: history 0.362284
    got = [round(a, 6) for a in batch.advantages.tolist()]
    assert got[:4] == [1.5, -0.5, -0.5, -0.5] and got[4:] == [0.362284] * 4
    assert stage.state.stats["x"][:2] == [2, 8]


def test_the_preset_weights_tokens_as_dcpos_only_token_mean():
    """DCPO's loss is (1/G) sum_i sum_t l_t: no division by each response's length. Two
    responses at ratio 1 (logp = old, so d pg_t / d logp_t = -A_i): 2 tokens with A = 1 and 8
    tokens with A = 2. DCPO's per-token weight is A_i / G: the long one's tokens weigh 2 / 1 = 2x
    the short one's. Per-response length normalisation (seq-mean-token-mean) gives
    (2 / 8) / (1 / 2) = 0.5x instead."""
    from tests.helpers import load

    loss = load("algorithm=dcpo").algorithm.loss
    assert loss.aggregation == "seq-mean-token-sum-norm"
    mask = torch.zeros(2, 8)
    mask[0, :2] = 1.0
    mask[1, :] = 1.0
    logp = torch.full((2, 8), -1.0, requires_grad=True)
    cfg = dataclasses.replace(loss, norm_len=8)
    out = policy_loss(logp, torch.full((2, 8), -1.0), torch.tensor([1.0, 2.0]), mask, cfg)
    out.loss.backward()
    short, long = -logp.grad[0, 0].item(), -logp.grad[1, 0].item()
    assert abs(long / short - 2.0) < 1e-6
    # equal to DCPO's formula up to the constant norm_len: (1/G) * A_i with G = 2 sequences
    assert abs(short - 1.0 / (2 * 8)) < 1e-9 and abs(long - 2.0 / (2 * 8)) < 1e-9


def test_history_groups_counts_groups_whose_prompt_was_seen_before():
    stage = AdvantageStage(DCPO, reward_range=(0.0, 1.0), seed=0)
    step1 = (groups_of([[1] * 4, [1] * 4]), [V(1), V(0), V(0), V(0)] + [V(0)] * 4)
    _, m, *_ = stage.process(*step1, prompt_keys=["x", "y"])
    assert m["dcpo/history_groups"] == 0.0  # first visits: GRPO
    _, m, *_ = stage.process(*step1, prompt_keys=["x", "z"])
    assert m["dcpo/history_groups"] == 1.0  # x again, z new
    # y collapsed (all 0) at both visits: history gives it nothing, so it stays wasted
    _, m, *_ = stage.process(*step1, prompt_keys=["z", "y"])
    assert m["dcpo/history_groups"] == 2.0
