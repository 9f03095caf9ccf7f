r"""Per-token log-probs and entropy of a causal LM's logits at a sampling temperature.

The engines sample from softmax(z / T) and report the log-probs of that distribution
(rollout/types.py), so the learner scores the same distribution: for the token at position t,

    logp_t = log_softmax(z_{t-1} / T)[x_t],   H_t = -sum_v p_v log p_v,  p = softmax(z_{t-1} / T)

for the current, old and reference policies alike (DESIGN.md section 4). Position 0 gets 0.

Memory: the fp32 softmax of a [B, L, V] logits tensor is the learner's largest buffer at real
vocabularies (32 x 4k x 152k fp32 is ~80 GB). Here it is computed in chunks of at most
``chunk_tokens`` positions; when gradients are needed each chunk runs under activation
checkpointing, so only one chunk's fp32 softmax exists at a time, in the forward and in the
backward pass. The logits themselves are the model's output (issue: computing them from the
hidden states in chunks is the next step for 150k vocabularies).

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

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 8192  # positions (over the whole micro-batch) per fp32 softmax chunk


def _chunk(logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool):
    z = logits.float() / temperature  # [B, c, V]
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)  # [B, c]
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, c]
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
    [B, T, V]`` divided by ``temperature`` (module docstring); position 0 gets 0."""
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
            lp, ent = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _chunk(*args)
        logps.append(lp)
        entropies.append(ent)
    pad = lambda xs: torch.nn.functional.pad(  # noqa: E731
        torch.cat(xs, 1) if xs else logits.new_zeros(b, 0, dtype=torch.float32), (1, 0)
    )
    return pad(logps), (pad(entropies) if with_entropy else None)
