"""Per-token log-probs, entropy and self-certainty of given logits at a sampling temperature."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 2048  # positions per logits piece (learner.logits_chunk_tokens)


def piece_logprobs(logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool):
    """``(logp [..., c], entropy [..., c] or None)`` of ``targets`` under one piece of logits
    ``[..., c, V]`` at ``temperature``, in fp32."""
    z = logits.float() / temperature  # [..., c, V]
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)  # [..., c]
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [..., c]
    return logp, entropy


def token_logprobs(
    logits: Tensor,
    input_ids: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[Tensor, Tensor | None]:
    """``(logp [B, T], entropy [B, T] or None)`` of ``input_ids [B, T]`` under ``logits
    [B, T, V]`` divided by ``temperature`` (learner/logprobs.py); position 0 gets 0.

    >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens
    >>> lp, ent = token_logprobs(logits, torch.tensor([[0, 1, 2]]), with_entropy=True)
    >>> lp.tolist()  # 0, log(1/4), log(1/4)
    [[0.0, -1.3862943649291992, -1.3862943649291992]]
    >>> [round(x, 4) for x in ent[0].tolist()]  # entropy log(4) at the scored positions
    [0.0, 1.3863, 1.3863]
    >>> z = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])  # at T = 2: softmax([1, 0])[1] = 1/(1+e)
    >>> round(token_logprobs(z, torch.tensor([[0, 1]]), temperature=2.0)[0][0, 1].item(), 4)
    -1.3133
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b, t = input_ids.shape
    width = max(1, chunk_tokens // max(b, 1))  # positions per chunk
    grad = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    for start in range(0, t - 1, width):
        end = min(start + width, t - 1)
        args = (logits[:, start:end], input_ids[:, start + 1 : end + 1], temperature, with_entropy)
        if grad:
            lp, ent = checkpoint(piece_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = piece_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)
    pad = lambda xs: torch.nn.functional.pad(  # noqa: E731
        torch.cat(xs, 1) if xs else logits.new_zeros(b, 0, dtype=torch.float32), (1, 0)
    )
    return pad(logps), (pad(entropies) if with_entropy else None)


def piece_intrinsic(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Per position of ``logits [..., V]`` at ``temperature``: the entropy H(p) and the
    self-certainty KL(U || p) = -log V - mean_v log p_v (INTUITOR), both fp32, in nats."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    certainty = -math.log(logits.shape[-1]) - logp_all.mean(-1)
    return entropy, certainty
