"""The learner's memory options on real DeepSpeed ranks (2 CPU ranks, gloo): token-budget
micro-batches, chunked logits in many pieces and gradient checkpointing give the same update as
count-based micro-batches with full logits, under ZeRO-2 and ZeRO-3 (where every rank must run
as many forward passes and output-embedding pieces: learner/batch.py plan_microbatches)."""

from __future__ import annotations

import random

import pytest
import torch

from learner.batch import build_batch, pack_by_tokens, plan_microbatches, shard_by_tokens
from learner.config import LearnerConfig
from learner.group import LearnerGroup
from learner.logprobs import num_chunks
from learner.loss import LossConfig
from rollout.types import Group, Sample


def _batch(seed: int = 3):
    """16 samples (4 groups of 4), prompts of 3-8 tokens, responses of 1-12: widths vary, so a
    token budget packs them unevenly. Old log-probs -1 +- noise (the ratio is not 1)."""
    rng = random.Random(seed)
    groups = []
    for _ in range(4):
        prompt = [1] + [rng.randint(4, 17) for _ in range(rng.randint(2, 7))]
        samples = []
        for _ in range(4):
            r = rng.randint(1, 12)
            resp = [rng.randint(4, 13) for _ in range(r)]
            samples.append(Sample(resp, [-1.0 + 0.1 * rng.random() for _ in resp], "", "stop", 0))
        groups.append(Group("", prompt, samples))
    adv = torch.randn(16, generator=torch.Generator().manual_seed(seed))
    return build_batch(groups, adv, pad_id=0)


def _update(model_dir, batch, **options) -> tuple[dict, dict]:
    defaults = dict(num_ranks=2, lr=1e-3, adam_eps=1e-3, mini_batch_size=None, timeout_s=300)
    cfg = LearnerConfig(**(defaults | options))
    group = LearnerGroup(cfg, LossConfig(entropy_coef=0.01), model_dir, temperature=0.7)
    try:
        metrics = group.train_on(batch)
        return metrics, group.export_weights()
    finally:
        group.shutdown()


@pytest.fixture(scope="module")
def plain(ray_cluster, tiny_model_dir):
    """``plain(stage)``: the plain update of :func:`_batch` (count-based micro-batches of 3, full
    logits, so no shared prefix) under that ZeRO stage, computed once per module: the memory
    options and the shared prefix below must each reproduce it (a 2-rank group is ~20 core-s to
    start here)."""
    done = {}

    def get(stage: int) -> tuple[dict, dict]:
        if stage not in done:
            done[stage] = _update(
                tiny_model_dir, _batch(), zero_stage=stage, micro_batch_size=3, logits="full"
            )
        return done[stage]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_token_budget_chunked_checkpointed_update_equals_the_count_based_full_one(
    tiny_model_dir, plain, stage
):
    batch = _batch()
    budget, chunk_tokens = 24, 2
    # The plan is not trivial (else this test could not fail on it): the two ranks' shards pack
    # into different numbers of micro-batches, so one rank splits; and the ranks' own piece
    # counts differ at some micro-batch, so ZeRO-3 needs the planned (maximum) count.
    shards = [batch.select(rows) for rows in shard_by_tokens(batch, 2)]
    lengths = [s.attention_mask.sum(1).tolist() for s in shards]
    natural = [pack_by_tokens(ls, budget) for ls in lengths]
    assert len(natural[0]) != len(natural[1]), [len(p) for p in natural]
    own = [
        [num_chunks(int(s.response_mask[rows].sum()), chunk_tokens) for rows in plan]
        for s, plan in zip(shards, natural, strict=True)
    ]
    assert own[0][: len(own[1])] != own[1][: len(own[0])], own

    base_metrics, base = plain(stage)
    metrics, got = _update(
        tiny_model_dir,
        batch,
        zero_stage=stage,
        micro_batch_tokens=budget,
        logits="chunked",
        logits_chunk_tokens=chunk_tokens,
        gradient_checkpointing=True,
    )
    assert metrics["actor/skipped_steps"] == 0 and metrics["actor/optimizer_steps"] == 1
    # fp32 sums over differently split micro-batches: ~2e-6 relative seen on the grad norm
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(base_metrics[name], rel=1e-5, abs=1e-6), name
    # Adam's first step is ~lr * g / (|g| + eps): eps = 1e-3 keeps float summation-order
    # differences of the gradient from being amplified (test_learner_ray.py).
    moved = max((base[k] - v).abs().max().item() for k, v in _initial(tiny_model_dir).items())
    assert moved > 1e-4  # the update really moves the weights
    for k, v in base.items():
        assert torch.allclose(got[k], v, atol=1e-7, rtol=1e-6), (k, (got[k] - v).abs().max())


@pytest.mark.slow
@pytest.mark.parametrize(("pack", "stage"), [("off", 2), ("on", 3)])
def test_shared_prefix_update_equals_the_plain_one(tiny_model_dir, plain, pack, stage):
    """Prompts computed once per group on real DeepSpeed ranks (the default token budget and
    chunked logits), padded under ZeRO-2 and packed under ZeRO-3 (whose ranks gather each
    module's weights: both must make the same calls): the same update as every row in full, on
    fewer decoder tokens. Groups stay whole per rank (4 groups of 4 over 2 ranks)."""
    batch = _batch()
    base_metrics, base = plain(stage)
    metrics, got = _update(tiny_model_dir, batch, shared_prefix=True, pack=pack, zero_stage=stage)
    # plain: every real token; shared: 4 prompts once + each response but its last token
    lens, prompts = batch.attention_mask.sum(1), batch.prompt_lens
    assert base_metrics["perf/learner_decoder_tokens"] == float(lens.sum())
    shared = float(prompts[::4].sum() + (lens - prompts - 1).sum())
    assert metrics["perf/learner_decoder_tokens"] == shared < float(lens.sum())
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(base_metrics[name], rel=1e-5, abs=1e-6), name
    for k, v in base.items():
        assert torch.allclose(got[k], v, atol=1e-7, rtol=1e-6), (k, (got[k] - v).abs().max())


@pytest.mark.slow
def test_zero3_ranks_agree_when_one_runs_no_response_token(tiny_model_dir):
    """A micro-batch whose responses are all one token long runs no response token after its
    prompt pass, while the other rank's micro-batch at that index does: under ZeRO-3 (each
    module's weights gathered at every call) both must still make the same calls, else the
    gathers part ways (a hang, or another rank's weights). The update is the plain one."""
    rng = random.Random(5)
    groups = []
    for length in (1, 9, 9, 1):  # rank 0 gets groups 0-1, rank 1 groups 2-3 (asserted below)
        prompt = [1] + [rng.randint(4, 17) for _ in range(4)]
        samples = [Sample([rng.randint(4, 13) for _ in range(length)], [-1.0] * length, "",
                          "stop", 0) for _ in range(4)]  # fmt: skip
        groups.append(Group("", prompt, samples))
    advantages = torch.randn(16, generator=torch.Generator().manual_seed(5))
    batch = build_batch(groups, advantages, pad_id=0)
    shards = [batch.select(rows) for rows in shard_by_tokens(batch, 2)]
    plans = plan_microbatches(shards, micro_batch_size=4, micro_batch_tokens=None,
                              chunk_tokens=2048)  # fmt: skip
    runs = [[int(((s.attention_mask[m.rows].sum(1) - s.prompt_lens[m.rows] - 1).clamp(min=0))
             .sum()) for m in plan] for s, plan in zip(shards, plans, strict=True)]  # fmt: skip
    # the case itself: at some index one rank runs no response token and the other does
    assert any((a == 0) != (b == 0) for a, b in zip(*runs, strict=True)), runs
    options = dict(zero_stage=3, micro_batch_size=4, timeout_s=180)
    base_metrics, base = _update(tiny_model_dir, batch, logits="full", **options)
    metrics, got = _update(tiny_model_dir, batch, shared_prefix=True, pack="auto", **options)
    for name in ("actor/pg_loss", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(base_metrics[name], rel=1e-5, abs=1e-6), name
    for k, v in base.items():
        assert torch.allclose(got[k], v, atol=1e-7, rtol=1e-6), (k, (got[k] - v).abs().max())


def _initial(model_dir) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
