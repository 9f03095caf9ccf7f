"""The update's logged metrics from the ranks' sums (learner/update.py ``summarize_ranks``), on
hand-made sums: no Ray, no DeepSpeed."""

from __future__ import annotations

import dataclasses
import math

from learner.config import LearnerConfig
from learner.update import RankMetrics, summarize_ranks


def _ranks(norms: list[float]) -> list[dict]:
    """Two ranks' sums; the global grad norms are the same on both (as DeepSpeed reports)."""
    one = RankMetrics(tokens=10.0, optimizer_steps=len(norms), grad_norms=norms)
    return [dataclasses.asdict(one), dataclasses.asdict(one)]


def test_grad_clip_frac_counts_only_steps_with_a_gradient():
    # 5 optimizer steps at grad_clip 1.0: 3 whose gradient is exactly zero (every group of their
    # mini-batch collapsed: A = 0 everywhere, no KL term), 2 whose norm (2.0, 3.0) exceeds 1.0.
    # The clip bound every step that had a gradient: 2 / 2 = 1.0. The old share, 2 / 5 = 0.4,
    # read as "the clip rarely binds"; it stays as grad_clip_frac_all_steps.
    m = summarize_ranks(_ranks([0.0, 2.0, 0.0, 3.0, 0.0]), LearnerConfig(grad_clip=1.0))
    assert m["actor/grad_clip_frac"] == 1.0
    assert m["actor/grad_clip_frac_all_steps"] == 0.4


def test_grad_clip_frac_skips_non_finite_norms_and_is_undefined_without_a_gradient():
    # a skipped step (nan norm) is no applied step: of 0.5 and 4.0 (clip 1.0) one binds, 1 / 2;
    # over every applied step with or without a gradient (0.0, 0.5, 4.0): 1 / 3
    m = summarize_ranks(_ranks([0.0, math.nan, 0.5, 4.0]), LearnerConfig(grad_clip=1.0))
    assert m["actor/grad_clip_frac"] == 0.5
    assert m["actor/grad_clip_frac_all_steps"] == 1 / 3
    # only zero gradients: no step could be clipped, the share is 0 / 0 (logged as null)
    m = summarize_ranks(_ranks([0.0, 0.0]), LearnerConfig(grad_clip=1.0))
    assert math.isnan(m["actor/grad_clip_frac"]) and m["actor/grad_clip_frac_all_steps"] == 0.0
