r"""Token-level PPO-clip policy loss with asymmetric clip, k3 KL and an entropy bonus.

Per response token t of sample i (``ratio = exp(logp - old_logp)``, A_i the sample's advantage):

    pg_t  = max(-A_i * ratio, -A_i * clip(ratio, 1 - clip_low, 1 + clip_high))
            (dual clip, if ``clip_ratio_c`` is set: pg_t = min(pg_t, -A_i * c) where A_i < 0)
    kl_t  = exp(ref - logp) - (ref - logp) - 1             (k3 estimator of KL(pi || ref))
    l_t   = pg_t + kl_coef * kl_t - entropy_coef * entropy_t

then aggregated over the response mask:

- ``token-mean`` (default): sum_i,t l_t / total_tokens
- ``seq-mean-token-mean``: sum_i [mean_t l_t] / total_seqs
- ``seq-mean-token-sum-norm`` (Dr. GRPO): sum_i [sum_t l_t / norm_len] / total_seqs

``total_tokens`` and ``total_seqs`` default to this call's own counts. A learner that splits a
batch over ranks and micro-batches passes the *global* counts, so that the sum of the pieces'
losses (and gradients) equals the loss of the whole batch: the split-invariance the tests check.
``norm_len`` defaults to the mask's width; pass a constant (the max response length) whenever the
batch is split, since pieces may be padded to different widths.

Choices that are ours: the k3 log-ratio is clamped to [-20, 20] before ``exp`` (an overflow
guard only; verl clamps to [-10, 10]); metrics are token means over this call's mask.

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


@dataclass
class LossConfig:
    """PPO-style policy loss settings (defaults as DESIGN.md section 4 and the paper)."""

    clip_low: float = field(default=0.2, metadata={"ge": 0.0, "lt": 1.0})
    clip_high: float = field(default=0.2, metadata={"ge": 0.0})
    """Upper clip; DAPO's clip-higher uses 0.28."""
    clip_ratio_c: float | None = field(default=None, metadata={"gt": 1.0})
    """Dual-clip constant for negative advantages (off when null; verl uses 3)."""
    aggregation: str = field(default="token-mean", metadata={"choices": AGGREGATIONS})
    norm_len: int | None = field(default=None, metadata={"ge": 1})
    """Denominator of seq-mean-token-sum-norm; null = the response width of each call."""
    kl_coef: float = field(default=0.0, metadata={"ge": 0.0})
    """k3 KL to the reference model; 0 as in the paper (no reference model is loaded)."""
    entropy_coef: float = field(default=0.0, metadata={"ge": 0.0})


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
    >>> [aggregate(v, m, a).item() for a in AGGREGATIONS]  # 6/3 | (2+2)/2 | (4/2+2/2)/2
    [2.0, 2.0, 1.5]
    """
    mask = mask.to(values.dtype)
    masked = values * mask
    if mode == "token-mean":
        denom = mask.sum() if total_tokens is None else total_tokens
        return masked.sum() / denom
    seqs = values.shape[0] if total_seqs is None else total_seqs
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        return per_seq.sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        width = values.shape[-1] if norm_len is None else norm_len
        return (masked.sum(-1) / width).sum() / seqs
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATIONS}")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
    aggregation: str = "token-mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    total_tokens: float | Tensor | None = None,
    total_seqs: float | Tensor | None = None,
    norm_len: float | None = None,
) -> LossOutput:
    """The policy loss of a (micro-)batch. Shapes: log-probs, entropy, mask ``[B, T]``;
    advantages ``[B]`` (one per sample) or ``[B, T]``."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1] broadcast over tokens
    mask = response_mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    surr = -advantages * ratio
    surr_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(surr, surr_clipped)
    if clip_ratio_c is not None:
        pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * clip_ratio_c), pg)
    total = pg
    metrics: dict[str, Tensor] = {}
    if ref_logprobs is not None and kl_coef != 0.0:
        delta = torch.clamp(ref_logprobs - logprobs, -20.0, 20.0)
        kl = torch.exp(delta) - delta - 1.0
        total = total + kl_coef * kl
        metrics["ref_kl"] = _masked_mean(kl.detach(), mask)
    if entropy is not None:
        if entropy_coef != 0.0:
            total = total - entropy_coef * entropy
        metrics["entropy"] = _masked_mean(entropy.detach(), mask)
    loss = aggregate(
        total,
        mask,
        aggregation,
        total_tokens=total_tokens,
        total_seqs=total_seqs,
        norm_len=norm_len,
    )
    with torch.no_grad():
        metrics["pg_loss"] = _masked_mean(pg, mask)
        metrics["pg_clipfrac"] = _masked_mean((surr_clipped > surr).to(mask.dtype), mask)
        metrics["approx_kl"] = _masked_mean(ratio - 1.0 - log_ratio, mask)  # k3 of KL(old||new)
        metrics["ratio_mean"] = _masked_mean(ratio, mask)
    return LossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()})
