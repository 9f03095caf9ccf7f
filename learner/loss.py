r"""Token-level PPO-clip policy loss with asymmetric and dual clip, truncated importance
weights, k3 KL and an entropy bonus.

Per response token t of sample i (A_i the sample's advantage, w_t the truncated importance
weight, 1 unless given):

    log_ratio_t = clamp(logp_t - old_t, -20, 20)              (overflow guard, as verl)
    ratio_t     = exp(log_ratio_t)
    pg_t  = w_t * max(-A_i * ratio_t, -A_i * clip(ratio_t, 1 - clip_low, 1 + clip_high))
            dual clip (``clip_ratio_c``, default 3, verl's default): for A_i < 0 the term is
            capped at -A_i * c before the weight
    kl_t  = exp(ref - logp) - (ref - logp) - 1               (k3 estimator of KL(pi || ref))
    l_t   = pg_t + kl_coef * kl_t - entropy_coef * H_t

With ``clip_mode="dynamic"`` (DCPO's dynamic-adaptive clipping, arXiv 2509.02333 and its code)
the bounds depend on the old probability q_t = exp(old_t) of the sampled token: the ratio must
satisfy |r (r - 1)| <= eps / q_t, i.e.

    low_t  = 0.5 + 0.5 * sqrt(max(1 - 4 * clip_low / q_t, 0))
    high_t = min(0.5 + 0.5 * sqrt(1 + 4 * clip_high / q_t), clip_ratio_max)   (10, as DCPO)

so rare tokens may move further than likely ones (q = 1: [0.8, 1.171] at DCPO's 0.16/0.2).

then aggregated over the response mask:

- ``token-mean`` (default): sum_i,t l_t / total_tokens
- ``seq-mean-token-mean``: sum_i [mean_t l_t] / total_seqs
- ``seq-mean-token-sum-norm`` (Dr. GRPO): sum_i [sum_t l_t / norm_len] / total_seqs, with a
  constant ``norm_len`` (the configured max response length unless set), so that a token's weight
  does not depend on which micro-batch it lands in.

``total_tokens`` and ``total_seqs`` default to this call's own counts; a sequence counts only
when it has a token in the mask (a fully masked row is not a sequence of the mean). A learner
that splits a batch over ranks and micro-batches passes the *global* counts, so that the sum of
the pieces' losses (and gradients) equals the loss of the whole batch: the split-invariance the
tests check.

Truncated importance sampling (``is_weights``): when the learner recomputes the old log-probs
(``learner.old_logprobs=recompute``), w_t = min(exp(old_learner_t - logp_engine_t), cap) corrects
for the engine sampling from a slightly different distribution than the learner's (bf16, other
kernels); cap 2.0 as in the authors' code and TRL. The k3 log-ratio is clamped to [-20, 20] too.

Metrics are token means over this call's mask: ``pg_loss`` (the mean policy-gradient term,
weights included), ``kl_loss`` (mean k3 KL), ``entropy``, ``pg_clipfrac``, ``approx_kl``.

>>> lp = torch.log(torch.tensor([[1.5, 0.5]]))
>>> out = policy_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
>>> round(out.loss.item(), 4), out.metrics["pg_clipfrac"].item()  # (-1.2 - 0.5) / 2
(-0.85, 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0
CLIP_MODES = ("fixed", "dynamic")


@dataclass
class LossConfig:
    """PPO-style policy loss settings (defaults as docs/ARCHITECTURE.md section 4 and the paper)."""

    clip_low: float = field(default=0.2, metadata={"ge": 0.0, "lt": 1.0})
    clip_high: float = field(default=0.2, metadata={"ge": 0.0})
    """Upper clip; DAPO's clip-higher uses 0.28."""
    clip_ratio_c: float | None = field(default=3.0, metadata={"gt": 1.0})
    """Dual-clip constant for negative advantages (verl's default 3; null = off)."""
    clip_mode: str = field(default="fixed", metadata={"choices": CLIP_MODES})
    """``fixed`` (PPO: [1 - clip_low, 1 + clip_high]) or ``dynamic`` (DCPO: bounds from each
    token's old probability, module docstring)."""
    clip_ratio_max: float = field(default=10.0, metadata={"gt": 1.0})
    """Ceiling of the dynamic upper bound (DCPO: 10)."""
    aggregation: str = field(default="token-mean", metadata={"choices": AGGREGATIONS})
    norm_len: int | None = field(default=None, metadata={"ge": 1})
    """Constant denominator of seq-mean-token-sum-norm (Dr. GRPO); null = the configured max
    response length, ``rollout.sampling.max_new_tokens``."""
    kl_coef: float = field(default=0.0, metadata={"ge": 0.0})
    """k3 KL to the reference model; 0 as in the paper (no reference model is loaded)."""
    entropy_coef: float = field(default=0.0, metadata={"ge": 0.0})
    """Entropy bonus: l_t -= entropy_coef * H_t (``actor/entropy`` is logged either way)."""


@dataclass
class LossOutput:
    loss: Tensor  # scalar, differentiable
    metrics: dict[str, Tensor]  # detached scalars


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    total_tokens: float | Tensor | None = None,
    total_seqs: float | Tensor | None = None,
    norm_len: float | None = None,
) -> Tensor:
    """Reduce per-token ``values [B, T]`` over ``mask [B, T]`` to a scalar (module docstring).

    >>> v, m = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> [aggregate(v, m, a, norm_len=4).item() for a in AGGREGATIONS]  # 6/3|(2+2)/2|(4/4+2/4)/2
    [2.0, 2.0, 0.75]
    """
    mask = mask.to(values.dtype)
    masked = values * mask
    if mode == "token-mean":
        denom = mask.sum() if total_tokens is None else total_tokens
        return masked.sum() / denom
    # sequences with at least one token (a fully masked row, e.g. DAPO's overlong filter, is
    # not one: verl's seq_mask)
    seqs = (mask.sum(-1) > 0).sum().clamp(min=1) if total_seqs is None else total_seqs
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        return per_seq.sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        if norm_len is None:
            raise ValueError("seq-mean-token-sum-norm needs a constant norm_len (max length)")
        return (masked.sum(-1) / norm_len).sum() / seqs
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATIONS}")


def dynamic_clip_bounds(
    old_logprobs: Tensor, clip_low: float, clip_high: float, ratio_max: float = 10.0
) -> tuple[Tensor, Tensor]:
    """DCPO's per-token ratio bounds from the old log-probs (module docstring).

    >>> q = torch.tensor([1.0, 0.5, 0.01, 0.001])
    >>> low, high = dynamic_clip_bounds(q.log(), 0.16, 0.2)
    >>> [round(x, 4) for x in low.tolist()], [round(x, 4) for x in high.tolist()]
    ([0.8, 0.5, 0.5, 0.5], [1.1708, 1.3062, 5.0, 10.0])
    """
    q = torch.exp(old_logprobs.float()).clamp(min=1e-12)
    low = 0.5 + 0.5 * torch.sqrt((1.0 - 4.0 * clip_low / q).clamp(min=0.0))
    high = (0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * clip_high / q)).clamp(max=ratio_max)
    return low.to(old_logprobs.dtype), high.to(old_logprobs.dtype)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _regularised(pg, logprobs, mask, ref_logprobs, kl_coef, entropy, entropy_coef):
    """``pg`` plus the k3 KL to the reference (``kl_coef``) minus the entropy bonus
    (``entropy_coef``), and their metrics (``kl_loss``, ``entropy``)."""
    total, metrics = pg, {}
    if ref_logprobs is not None and kl_coef != 0.0:
        delta = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.exp(delta) - delta - 1.0
        total = total + kl_coef * kl
        metrics["kl_loss"] = _masked_mean(kl.detach(), mask)
    if entropy is not None:
        if entropy_coef != 0.0:
            total = total - entropy_coef * entropy
        metrics["entropy"] = _masked_mean(entropy.detach(), mask)
    return total, metrics


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cfg: LossConfig | None = None,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    is_weights: Tensor | None = None,
    total_tokens: float | Tensor | None = None,
    total_seqs: float | Tensor | None = None,
) -> LossOutput:
    """The policy loss of a (micro-)batch. Shapes: log-probs, entropy, mask ``[B, T]``;
    advantages ``[B]`` (one per sample) or ``[B, T]``; ``is_weights [B, T]`` (no gradient).
    ``cfg``: the loss settings (default :class:`LossConfig`); ``total_tokens``/``total_seqs``:
    the mini-batch's counts when this call scores one piece of it."""
    cfg = cfg or LossConfig()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1] broadcast over tokens
    mask = response_mask.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    surr = -advantages * ratio
    if cfg.clip_mode == "dynamic":
        low, high = dynamic_clip_bounds(
            old_logprobs.detach(), cfg.clip_low, cfg.clip_high, cfg.clip_ratio_max
        )
    elif cfg.clip_mode == "fixed":
        low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    else:
        raise ValueError(f"unknown clip_mode {cfg.clip_mode!r}; expected one of {CLIP_MODES}")
    surr_clipped = -advantages * torch.clamp(ratio, low, high)
    pg = torch.maximum(surr, surr_clipped)
    if cfg.clip_ratio_c is not None:
        pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * cfg.clip_ratio_c), pg)
    if is_weights is not None:
        pg = pg * is_weights.detach()
    total, metrics = _regularised(
        pg, logprobs, mask, ref_logprobs, cfg.kl_coef, entropy, cfg.entropy_coef
    )
    loss = aggregate(
        total,
        mask,
        cfg.aggregation,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
        norm_len=cfg.norm_len,
    )
    with torch.no_grad():
        metrics["pg_loss"] = _masked_mean(pg, mask)
        metrics["pg_clipfrac"] = _masked_mean((surr_clipped > surr).to(mask.dtype), mask)
        metrics["approx_kl"] = _masked_mean(ratio - 1.0 - log_ratio, mask)  # k3 of KL(old||new)
    return LossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()})
