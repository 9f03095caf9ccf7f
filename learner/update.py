"""The arithmetic of one update that is the same on any number of ranks, Ray or not: how a batch
is split over the ranks (mini-batches, shards, micro-batch plans), one micro-batch's loss, a
rank's sums (:class:`RankMetrics`) and how they become the logged metrics. Imports no Ray or
DeepSpeed (learner/group.py drives the ranks; tests/gpu/check_learner_gpu.py drives one in
process)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from learner.batch import MicroBatch, TrainBatch, plan_microbatches, shard_by_tokens
from learner.config import LearnerConfig, minibatch_problem
from learner.logprobs import model_logprobs
from learner.loss import LOG_RATIO_CLAMP, LossConfig, LossOutput, policy_loss
from learner.shared_prefix import distinct_prompts
from learner.tempered_logits import CHUNK_TOKENS


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
    clipped = sum(x > cfg.grad_clip for x in norms)
    out = {
        "actor/pg_loss": mean("pg_loss"),
        "actor/kl_loss": mean("kl_loss"),
        "actor/entropy": mean("entropy"),
        "actor/pg_clipfrac": mean("pg_clipfrac"),
        "actor/approx_kl": mean("approx_kl"),
        "actor/grad_norm": sum(norms) / len(norms) if norms else float("nan"),
        "actor/grad_norm_max": max(norms) if norms else float("nan"),
        # share of applied optimizer steps with a gradient (norm > 0) whose pre-clip norm
        # exceeded learner.grad_clip (when it binds every step, only the gradient's direction
        # survives); a step whose advantages were all zero has nothing to clip: 0 / 0 = nan
        # when no step had a gradient. _all_steps: over every applied step, zero ones too.
        "actor/grad_clip_frac": _share(clipped, sum(x > 0 for x in norms)),
        "actor/grad_clip_frac_all_steps": _share(clipped, len(norms)),
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


def _share(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


@dataclass
class RankMetrics:
    """One rank's sums over a ``train`` call (every epoch): token-weighted loss terms, the
    optimizer steps and their grad norms, and the engine/learner log-prob mismatch."""

    tokens: float = 0.0  # response tokens seen (over every epoch)
    pg_loss: float = 0.0  # token sums of each metric, divided by ``tokens`` by the group
    kl_loss: float = 0.0
    entropy: float = 0.0
    pg_clipfrac: float = 0.0
    approx_kl: float = 0.0
    optimizer_steps: int = 0
    skipped_steps: int = 0
    grad_norms: list[float] = field(default_factory=list)
    mismatch_tokens: float = 0.0  # tokens over which the mismatch below was measured
    logprob_abs_diff: float = 0.0  # sum of |logp_learner - logp_engine|, same policy version
    logprob_abs_diff_max: float = 0.0
    lag_tokens: float = 0.0  # tokens of samples older than the learner's version
    lag_abs_diff: float = 0.0  # their sum of |logp_learner - logp_engine| (lag + numerics)
    lag_abs_diff_max: float = 0.0
    is_tokens: float = 0.0  # tokens over which the IS weights below were applied
    is_weight: float = 0.0  # sum of the applied truncated IS weights
    is_clipped: float = 0.0  # tokens whose weight hit the cap
    lr: float = 0.0
    seconds: float = 0.0
    decoder_tokens: float = 0.0  # tokens through the decoder with gradients (every epoch)

    def add_loss(self, metrics: dict, tokens: float) -> None:
        self.tokens += tokens
        for name in ("pg_loss", "kl_loss", "entropy", "pg_clipfrac", "approx_kl"):
            setattr(self, name, getattr(self, name) + float(metrics.get(name, 0.0)) * tokens)

    def add_mismatch(self, learner, engine, mask, cap: float | None, lagged=None) -> None:
        """Log-prob gap on response tokens, split by whether the sample is of the learner's
        policy version (the numerical gap) or older (``lagged [B]`` bool: policy lag plus the
        numerical gap); IS weights as applied (1 without a cap/bypass)."""
        m = mask.bool()
        full = learner - engine  # [B, T]
        old = torch.zeros_like(m) if lagged is None else lagged.bool()[:, None] & m

        def gap(part):  # (tokens, sum, max) of |learner - engine| over ``part``
            d = full[part].abs()
            return float(part.sum()), float(d.sum()), float(d.max()) if d.numel() else 0.0

        n, total, peak = gap(m & ~old)
        self.mismatch_tokens += n
        self.logprob_abs_diff += total
        self.logprob_abs_diff_max = max(self.logprob_abs_diff_max, peak)
        n, total, peak = gap(old)
        self.lag_tokens += n
        self.lag_abs_diff += total
        self.lag_abs_diff_max = max(self.lag_abs_diff_max, peak)
        diff = full[m]
        self.is_tokens += float(m.sum())
        if cap is None:
            self.is_weight += float(m.sum())
            return
        weights, clipped = truncated_is_weights(diff, cap)
        self.is_weight += float(weights.sum())
        self.is_clipped += float(clipped.sum())


def truncated_is_weights(log_ratio: torch.Tensor, cap: float):
    """``(min(exp(log_ratio), cap), exp(log_ratio) > cap)``, the log-ratio clamped at +20
    first (learner/loss.py)."""
    raw = torch.exp(torch.clamp(log_ratio, max=LOG_RATIO_CLAMP))
    return torch.clamp(raw, max=cap), raw > cap


def microbatch_loss(
    model,
    mb: TrainBatch,
    cfg: LossConfig,
    *,
    temperature: float,
    total_tokens: float,
    total_seqs: float,
    reference=None,
    logits: str = "chunked",
    chunk_tokens: int = CHUNK_TOKENS,
    chunks: int | None = None,
    shared_prefix: bool = False,
    pack: str = "auto",
) -> tuple[LossOutput, torch.Tensor]:
    """Forward ``mb`` through ``model`` (a DeepSpeed engine or any causal LM, on its device),
    score its response tokens at ``temperature`` (learner/logprobs.py: ``logits`` mode, pieces of
    ``chunk_tokens`` positions, ``chunks`` pieces when given) and return the policy loss of this
    piece of a mini-batch (with the mini-batch's global counts) and the current log-probs
    ``[B, T]`` (0 outside the response). ``shared_prefix``: each distinct prompt runs once
    (learner/shared_prefix.py ``shared_prefix_hidden``, in the ``pack`` layout)."""
    if cfg.aggregation == "seq-mean-token-sum-norm" and cfg.norm_len is None:
        raise ValueError("loss.norm_len must be set (the max response length) for Dr. GRPO")
    mb = mb.to(model.device)
    score = dict(
        temperature=temperature,
        logits=logits,
        chunk_tokens=chunk_tokens,
        token_mask=mb.response_mask,
        prompt_lens=mb.prompt_lens if shared_prefix else None,
        pack=pack,
    )
    logp, entropy = model_logprobs(
        model, mb.input_ids, mb.attention_mask, with_entropy=True, chunks=chunks, **score
    )
    ref_logp = None
    if reference is not None:
        with torch.no_grad():
            ref_logp, _ = model_logprobs(reference, mb.input_ids, mb.attention_mask, **score)
    out = policy_loss(
        logp,
        mb.old_logprobs,
        mb.advantages,
        mb.response_mask,
        cfg,
        ref_logprobs=ref_logp,
        entropy=entropy,
        is_weights=mb.is_weights,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
    )
    return out, logp


def decoder_tokens(mb: TrainBatch, shared_prefix: bool) -> float:
    """Tokens a forward pass of ``mb`` runs through the decoder: every real token, or with the
    shared prefix each distinct prompt once plus each response but its last token."""
    if not shared_prefix or mb.prompt_lens is None:
        return float(mb.attention_mask.sum())
    first, _ = distinct_prompts(mb.input_ids, mb.prompt_lens)
    responses = (mb.attention_mask.sum(1) - mb.prompt_lens - 1).clamp(min=0)
    return float(mb.prompt_lens[first].sum() + responses.sum())
