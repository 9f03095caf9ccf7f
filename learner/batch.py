"""Train batches from reward groups, and their split over learner ranks (pure torch).

A step's groups (rollout/types.py) and the advantage stage's per-sample advantages become one
right-padded batch of ``prompt + response`` sequences:

- ``input_ids [B, T]``, ``attention_mask [B, T]``;
- ``response_mask [B, T]``: 1 on response tokens (their log-probs enter the loss);
- ``old_logprobs [B, T]``: the generating policy's log-prob of each response token, 0 elsewhere;
- ``advantages [B]``; ``policy_version [B]``.

Position t of the per-token tensors belongs to token ``input_ids[:, t]``, predicted from the
logits at t - 1 (learner/logprobs.py).

Sharding over ranks (:func:`shard_by_tokens`): every rank gets the same number of samples (so all
ranks run the same number of micro-steps and collectives), and response tokens are balanced by a
greedy longest-first assignment. The loss uses global token and sequence counts (learner/loss.py)
so that the split does not change the loss or the gradient.

>>> from rollout.types import Group, Sample
>>> g = Group("1+1=", [1, 5, 14, 5, 17], [Sample([6, 2], [-0.1, -0.2], "2", "stop", 3)])
>>> b = build_batch([g], torch.tensor([0.5]), pad_id=0)
>>> b.input_ids.tolist(), b.response_mask.tolist()
([[1, 5, 14, 5, 17, 6, 2]], [[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]])
>>> b.old_logprobs[0, 5:].tolist(), b.advantages.tolist(), b.policy_version.tolist()
([-0.10000000149011612, -0.20000000298023224], [0.5], [3])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rollout.types import Group


@dataclass
class TrainBatch:
    input_ids: Tensor  # [B, T] long, right-padded prompt + response
    attention_mask: Tensor  # [B, T] long
    response_mask: Tensor  # [B, T] float, 1 on response tokens
    old_logprobs: Tensor  # [B, T] float, generating policy's log-probs on response tokens
    advantages: Tensor  # [B] float
    policy_version: Tensor  # [B] long
    is_weights: Tensor | None = None  # [B, T] truncated IS weights (learner recompute mode)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Response tokens (what token-mean aggregation divides by)."""
        return int(self.response_mask.sum())

    def select(self, rows: Tensor | list[int]) -> TrainBatch:
        """The given rows, trimmed to their own longest sequence."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(1).max()) if len(rows) else 0
        return TrainBatch(
            input_ids=self.input_ids[rows, :width],
            attention_mask=self.attention_mask[rows, :width],
            response_mask=self.response_mask[rows, :width],
            old_logprobs=self.old_logprobs[rows, :width],
            advantages=self.advantages[rows],
            policy_version=self.policy_version[rows],
            is_weights=None if self.is_weights is None else self.is_weights[rows, :width],
        )


def build_batch(
    groups: list[Group], advantages: Tensor, *, pad_id: int, masked_out: Tensor | None = None
) -> TrainBatch:
    """One row per sample, in group order then sample order (the order advantages follow).
    ``masked_out [B]`` (bool, optional): samples whose tokens stay out of the loss (response
    mask 0; DAPO's overlong filter)."""
    rows = [(g.prompt_ids, s) for g in groups for s in g.samples]
    if len(rows) != advantages.numel():
        raise ValueError(f"{len(rows)} samples but {advantages.numel()} advantages")
    width = max(len(p) + len(s.response_ids) for p, s in rows)
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    response = torch.zeros((b, width), dtype=torch.float32)
    old = torch.zeros((b, width), dtype=torch.float32)
    for i, (prompt, s) in enumerate(rows):
        p, r = len(prompt), len(s.response_ids)
        if len(s.logprobs) != r:
            raise ValueError(f"sample {i}: {r} response tokens but {len(s.logprobs)} log-probs")
        input_ids[i, : p + r] = torch.tensor(prompt + s.response_ids)
        attention[i, : p + r] = 1
        response[i, p : p + r] = 0.0 if masked_out is not None and masked_out[i] else 1.0
        old[i, p : p + r] = torch.tensor(s.logprobs)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response,
        old_logprobs=old,
        advantages=advantages.detach().to(torch.float32).reshape(-1),
        policy_version=torch.tensor([s.policy_version for _, s in rows], dtype=torch.long),
    )


def shard_by_tokens(batch: TrainBatch, num_ranks: int) -> list[list[int]]:
    """Rows for each rank: equal counts (``len(batch)`` must divide evenly), response tokens
    balanced greedily (longest first, to the least-loaded rank that still has room).
    """
    n = len(batch)
    if n % num_ranks:
        raise ValueError(f"{n} samples do not split evenly over {num_ranks} ranks")
    per_rank = n // num_ranks
    tokens = batch.response_mask.sum(1).tolist()
    order = sorted(range(n), key=lambda i: (-tokens[i], i))
    shards: list[list[int]] = [[] for _ in range(num_ranks)]
    load = [0.0] * num_ranks
    for i in order:
        rank = min(
            (r for r in range(num_ranks) if len(shards[r]) < per_rank), key=lambda r: (load[r], r)
        )
        shards[rank].append(i)
        load[rank] += tokens[i]
    return [sorted(s) for s in shards]
