"""The arithmetic around one update that is the same on any number of ranks, Ray or not: how a
batch is split over the ranks (mini-batches, shards, micro-batch plans) and how the ranks' sums
become the logged metrics. Imports no Ray or DeepSpeed (learner/group.py drives the ranks;
tests/gpu/check_learner_gpu.py drives one in process)."""

from __future__ import annotations

import math

from learner.batch import MicroBatch, TrainBatch, plan_microbatches, shard_by_tokens
from learner.config import LearnerConfig, minibatch_problem


def split_for_ranks(
    batch: TrainBatch, cfg: LearnerConfig, micro_batch_tokens: int | None
) -> tuple[list[list[TrainBatch]], list[tuple[float, float]], list[list[list[MicroBatch]]]]:
    """Per rank, its mini-batches and their micro-batch plans (as many micro-batches and
    logits pieces on every rank: learner/batch.py); each mini-batch's global (tokens,
    sequences). ``micro_batch_tokens``: the resolved budget (the config's, or the automatic
    one)."""
    n, k = len(batch), cfg.num_ranks
    problem = minibatch_problem(n, cfg.mini_batch_size, k)
    if problem:
        raise ValueError(problem)
    size = n // -(-n // (cfg.mini_batch_size or n))  # n / ceil(n / mini_batch_size)
    per_rank: list[list[TrainBatch]] = [[] for _ in range(k)]
    plans: list[list[list[MicroBatch]]] = [[] for _ in range(k)]
    totals = []
    for start in range(0, n, size):
        mini = batch.select(list(range(start, start + size)))
        shards = [mini.select(rows) for rows in shard_by_tokens(mini, k)]
        planned = plan_microbatches(
            shards,
            micro_batch_size=cfg.micro_batch_size,
            micro_batch_tokens=micro_batch_tokens,
            chunk_tokens=cfg.logits_chunk_tokens,
        )
        for r in range(k):
            per_rank[r].append(shards[r])
            plans[r].append(planned[r])
        totals.append((float(max(mini.num_tokens, 1)), float(max(mini.num_seqs, 1))))
    return per_rank, totals, plans


def summarize_ranks(ranks: list[dict], cfg: LearnerConfig) -> dict[str, float]:
    """The update's metrics from every rank's sums (learner/rank.py ``RankMetrics``): loss
    terms are token means over every epoch and rank; counts and grad norms cover every
    optimizer step."""
    tokens = sum(m["tokens"] for m in ranks) or 1.0
    total = lambda name: sum(m[name] for m in ranks)  # noqa: E731
    mean = lambda name: total(name) / tokens  # noqa: E731
    norms = [x for x in ranks[0]["grad_norms"] if math.isfinite(x)]  # global: same on all
    out = {
        "actor/pg_loss": mean("pg_loss"),
        "actor/kl_loss": mean("kl_loss"),
        "actor/entropy": mean("entropy"),
        "actor/pg_clipfrac": mean("pg_clipfrac"),
        "actor/approx_kl": mean("approx_kl"),
        "actor/grad_norm": sum(norms) / len(norms) if norms else float("nan"),
        "actor/grad_norm_max": max(norms) if norms else float("nan"),
        # share of applied optimizer steps whose pre-clip norm exceeded learner.grad_clip
        # (when it binds every step, only the gradient's direction survives)
        "actor/grad_clip_frac": (
            sum(x > cfg.grad_clip for x in norms) / len(norms) if norms else float("nan")
        ),
        "actor/lr": ranks[0]["lr"],
        "actor/skipped_steps": float(ranks[0]["skipped_steps"]),
        "actor/optimizer_steps": float(ranks[0]["optimizer_steps"]),
        "perf/learner_tokens": tokens / cfg.ppo_epochs,
        # through the decoder, per epoch: prompt + response tokens, each shared prompt once
        "perf/learner_decoder_tokens": total("decoder_tokens") / cfg.ppo_epochs,
        "timing_s/update": max(m["seconds"] for m in ranks),
    }
    weighted = total("is_tokens")
    if weighted:
        out["rollout/is_weight_mean"] = total("is_weight") / weighted
        out["rollout/is_clipped_frac"] = total("is_clipped") / weighted
        out["rollout/lagged_token_frac"] = total("lag_tokens") / weighted
    # the numerical engine/learner gap: samples of the learner's own version only
    if total("mismatch_tokens"):
        out["rollout/logprob_abs_diff_mean"] = total("logprob_abs_diff") / total("mismatch_tokens")
        out["rollout/logprob_abs_diff_max"] = max(m["logprob_abs_diff_max"] for m in ranks)
    # older samples (one-step mode): policy lag and numerical gap together
    if total("lag_tokens"):
        out["rollout/logprob_lag_abs_diff_mean"] = total("lag_abs_diff") / total("lag_tokens")
        out["rollout/logprob_lag_abs_diff_max"] = max(m["lag_abs_diff_max"] for m in ranks)
    return out
