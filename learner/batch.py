"""Train batches from reward groups, and their split over learner ranks (pure torch).

A step's groups (rollout/types.py) and the advantage stage's per-sample advantages become one
right-padded batch of ``prompt + response`` sequences:

- ``input_ids [B, T]``, ``attention_mask [B, T]``;
- ``response_mask [B, T]``: 1 on response tokens (their log-probs enter the loss);
- ``old_logprobs [B, T]``: the generating policy's log-prob of each response token, 0 elsewhere;
- ``advantages [B]``; ``policy_version [B]``.

Position t of the per-token tensors belongs to token ``input_ids[:, t]``, predicted from the
logits at t - 1 (learner/logprobs.py).

Sharding over ranks (:func:`shard_by_tokens`): every rank gets the same number of samples, and
response tokens are balanced by a greedy longest-first assignment. Micro-batches
(:func:`plan_microbatches`, planned by the driver where every rank's shard is known): either
``micro_batch_size`` consecutive rows, or packed by a token budget (longest first, at most
``micro_batch_tokens`` padded tokens each); either way every rank runs the same number of
micro-batches, and each micro-batch index the same number of logits pieces, because DeepSpeed's
ZeRO collectives (gradient reduction, ZeRO-3's parameter gathers) must match across ranks. The
loss uses global token and sequence counts (learner/loss.py) so that neither split changes the
loss or the gradient.

>>> from rollout.types import Group, Sample
>>> g = Group("1+1=", [1, 5, 14, 5, 17], [Sample([6, 2], [-0.1, -0.2], "2", "stop", 3)])
>>> b = build_batch([g], torch.tensor([0.5]), pad_id=0)
>>> b.input_ids.tolist(), b.response_mask.tolist()
([[1, 5, 14, 5, 17, 6, 2]], [[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]])
>>> b.old_logprobs[0, 5:].tolist(), b.advantages.tolist(), b.policy_version.tolist()
([-0.10000000149011612, -0.20000000298023224], [0.5], [3])
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from learner.logprobs import num_chunks, scored_positions
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
    prompt_lens: Tensor | None = None  # [B] long: row r's prompt is input_ids[r, :prompt_lens[r]]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Response tokens (what token-mean aggregation divides by)."""
        return int(self.response_mask.sum())

    @property
    def num_seqs(self) -> int:
        """Rows with at least one response token in the loss (what seq-mean aggregations
        divide by: a fully masked row is not a sequence of the mean)."""
        return int((self.response_mask.sum(-1) > 0).sum())

    def to(self, device) -> TrainBatch:
        """The same batch with every tensor on ``device``."""
        moved = {
            f.name: None if (v := getattr(self, f.name)) is None else v.to(device)
            for f in fields(self)
        }
        return TrainBatch(**moved)

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
            prompt_lens=None if self.prompt_lens is None else self.prompt_lens[rows],
        )


def build_batch(
    groups: list[Group], advantages: Tensor, *, pad_id: int, masked_out: Tensor | None = None
) -> TrainBatch:
    """One row per sample, in group order then sample order (the order advantages follow).
    ``masked_out [B]`` (bool, optional): samples whose tokens stay out of the loss (response
    mask 0; DAPO's overlong filter). Rows are padded as Python lists and become tensors at once
    (a tensor per row cost ~15 ms a default step)."""
    rows = [(g.prompt_ids, s) for g in groups for s in g.samples]
    if len(rows) != advantages.numel():
        raise ValueError(f"{len(rows)} samples but {advantages.numel()} advantages")
    for i, (_, s) in enumerate(rows):
        if len(s.logprobs) != len(s.response_ids):
            raise ValueError(
                f"sample {i}: {len(s.response_ids)} response tokens but {len(s.logprobs)} log-probs"
            )
    width = max(len(p) + len(s.response_ids) for p, s in rows)
    prompt_lens = torch.tensor([len(p) for p, _ in rows], dtype=torch.long)  # [B]
    ends = prompt_lens + torch.tensor([len(s.response_ids) for _, s in rows])  # [B]
    pad = [pad_id] * width
    zeros = [0.0] * width
    input_ids = torch.tensor(
        [(p + s.response_ids + pad)[:width] for p, s in rows], dtype=torch.long
    )
    old = torch.tensor(
        [(zeros[: len(p)] + s.logprobs + zeros)[:width] for p, s in rows], dtype=torch.float32
    )
    pos = torch.arange(width)[None, :]  # [1, W]
    attention = (pos < ends[:, None]).long()  # [B, W]
    response = (pos >= prompt_lens[:, None]) & (pos < ends[:, None])
    if masked_out is not None:
        response &= ~masked_out.bool()[:, None]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response.float(),
        old_logprobs=old,
        advantages=advantages.detach().to(torch.float32).reshape(-1),
        policy_version=torch.tensor([s.policy_version for _, s in rows], dtype=torch.long),
        prompt_lens=prompt_lens,
    )


def prompt_units(batch: TrainBatch) -> list[list[int]]:
    """Runs of consecutive rows with the same prompt (a group's samples, as build_batch lays
    them out), each a list of rows; single rows when the batch has no ``prompt_lens``.

    >>> from rollout.types import Group, Sample
    >>> s = Sample([6], [-0.1], "2", "stop", 0)
    >>> b = build_batch([Group("a", [1, 5], [s, s]), Group("b", [1, 7], [s])], torch.zeros(3),
    ...                 pad_id=0)
    >>> prompt_units(b)
    [[0, 1], [2]]
    """
    if batch.prompt_lens is None:
        return [[r] for r in range(len(batch))]
    units: list[list[int]] = []
    last = None
    for r, (ids, n) in enumerate(
        zip(batch.input_ids.tolist(), batch.prompt_lens.tolist(), strict=True)
    ):
        key = tuple(ids[:n])
        if key == last:
            units[-1].append(r)
        else:
            units.append([r])
        last = key
    return units


def shard_by_tokens(batch: TrainBatch, num_ranks: int) -> list[list[int]]:
    """Rows for each rank: equal counts (``len(batch)`` must divide evenly), response tokens
    balanced greedily (longest first, to the least-loaded rank that still has room). Whole
    groups (:func:`prompt_units`) go to one rank when they are all the same size and their
    number divides evenly, so that a rank computes each prompt once (learner/shared_prefix.py
    ``shared_prefix_hidden``); otherwise single rows.
    """
    n = len(batch)
    if n % num_ranks:
        raise ValueError(f"{n} samples do not split evenly over {num_ranks} ranks")
    units = prompt_units(batch)
    if len({len(u) for u in units}) != 1 or len(units) % num_ranks:
        units = [[r] for r in range(n)]
    per_rank = len(units) // num_ranks
    row_tokens = batch.response_mask.sum(1).tolist()
    tokens = [sum(row_tokens[r] for r in u) for u in units]
    order = sorted(range(len(units)), key=lambda i: (-tokens[i], i))
    shards: list[list[int]] = [[] for _ in range(num_ranks)]
    counts = [0] * num_ranks
    load = [0.0] * num_ranks
    for i in order:
        rank = min(
            (r for r in range(num_ranks) if counts[r] < per_rank), key=lambda r: (load[r], r)
        )
        shards[rank].extend(units[i])
        counts[rank] += 1
        load[rank] += tokens[i]
    return [sorted(s) for s in shards]


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward of a rank: ``rows`` of its mini-batch shard, and how many pieces the
    chunked logits are computed in (learner/logprobs.py; the same on every rank at one index)."""

    rows: list[int]
    chunks: int = 1


def pack_by_tokens(
    lengths: list[int], max_tokens: int, units: list[list[int]] | None = None
) -> list[list[int]]:
    """Rows (indices into ``lengths``) in micro-batches of at most ``max_tokens`` padded tokens
    (rows x longest length): rows sorted longest first (ties: lower index first), each
    micro-batch takes the next row while (its rows + 1) x its first (longest) length still fits;
    a row longer than the budget is a micro-batch of its own. Rows ascending inside each.
    ``units`` (lists of rows: a group's samples) are packed whole the same way, longest unit
    first, so that a group's prompt is computed once.

    >>> pack_by_tokens([10, 3, 7, 4, 2, 8], 16)  # 10 | 8+7 (2 x 8) | 4+3+2 (3 x 4)
    [[0], [2, 5], [1, 3, 4]]
    >>> pack_by_tokens([30, 5, 5], 16)  # 30 > 16 alone, then 5 + 5
    [[0], [1, 2]]
    >>> units = [[0, 1], [2, 3], [4, 5]]  # 4 x 6 = 24 > 20 | 4 rows x 4 = 16
    >>> pack_by_tokens([6, 5, 2, 2, 4, 3], 20, units=units)
    [[0, 1], [2, 3, 4, 5]]
    """
    units = [[i] for i in range(len(lengths))] if units is None else units
    longest_of = [max(lengths[i] for i in u) for u in units]
    order = sorted(range(len(units)), key=lambda k: (-longest_of[k], min(units[k])))
    out: list[list[int]] = []
    longest = 0
    for k in order:
        if out and (len(out[-1]) + len(units[k])) * longest <= max_tokens:
            out[-1].extend(units[k])
        else:
            out.append(list(units[k]))
            longest = longest_of[k]
    return [sorted(rows) for rows in out]


def split_to(microbatches: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """Split micro-batches until there are ``count``: each time the one with the most padded
    tokens (rows x longest; ties: the first) with at least 2 rows, into its ceil(n/2) longest
    rows and the rest, in its place.

    >>> split_to([[0, 1, 2], [3, 4, 5]], [5] * 6, 3)  # both 15 tokens: the first splits
    [[0, 1], [2], [3, 4, 5]]
    """
    out = [list(rows) for rows in microbatches]
    while len(out) < count:
        cost = [len(r) * max(lengths[i] for i in r) if len(r) > 1 else -1 for r in out]
        k = max(range(len(out)), key=lambda j: (cost[j], -j))
        if cost[k] < 0:
            raise ValueError(f"{sum(map(len, out))} rows cannot make {count} micro-batches")
        rows = sorted(out[k], key=lambda i: (-lengths[i], i))
        half = (len(rows) + 1) // 2
        out[k : k + 1] = [sorted(rows[:half]), sorted(rows[half:])]
    return out


def plan_rows(
    lengths: list[list[int]],
    *,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
    units: list[list[list[int]]] | None = None,
) -> list[list[list[int]]]:
    """Per rank (``lengths[r]``: its rows' sequence lengths), its micro-batches' rows, with the
    same number of micro-batches on every rank: ``micro_batch_size`` consecutive rows, or
    :func:`pack_by_tokens` (whole ``units[r]`` when given); then ranks with fewer micro-batches
    :func:`split_to` the most.

    >>> plan_rows([[10, 3, 7, 4, 2, 8], [5] * 6], micro_batch_size=4, micro_batch_tokens=16)
    [[[0], [2, 5], [1, 3, 4]], [[0, 1], [2], [3, 4, 5]]]
    """
    if micro_batch_tokens is None:
        if micro_batch_size is None:
            raise ValueError("plan_rows: set micro_batch_size or micro_batch_tokens")
        plans = [
            [
                list(range(s, min(s + micro_batch_size, len(ls))))
                for s in range(0, len(ls), micro_batch_size)
            ]
            for ls in lengths
        ]
    else:
        units = units or [None] * len(lengths)
        pairs = zip(lengths, units, strict=True)
        plans = [pack_by_tokens(ls, micro_batch_tokens, u) for ls, u in pairs]
    count = max(len(p) for p in plans)
    return [split_to(p, ls, count) for p, ls in zip(plans, lengths, strict=True)]


def plan_microbatches(
    shards: list[TrainBatch],
    *,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
    chunk_tokens: int,
) -> list[list[MicroBatch]]:
    """Every rank's micro-batches of one mini-batch (``shards[r]``: rank r's rows): rows by
    :func:`plan_rows` on sequence lengths; at each index, the logits pieces of the rank with the
    most scored (response) positions, so every rank runs as many (ZeRO-3 gathers the output
    embedding once per piece)."""
    lengths = [s.attention_mask.sum(1).tolist() for s in shards]
    plans = plan_rows(
        lengths,
        micro_batch_size=micro_batch_size,
        micro_batch_tokens=micro_batch_tokens,
        units=[prompt_units(s) for s in shards],
    )

    def pieces(shard: TrainBatch, rows: list[int]) -> int:
        mask = shard.response_mask[rows]  # [n, T]
        return num_chunks(scored_positions(mask, tuple(mask.shape)), chunk_tokens)

    chunks = [
        max(pieces(s, plan[j]) for s, plan in zip(shards, plans, strict=True))
        for j in range(len(plans[0]))
    ]
    return [[MicroBatch(rows, chunks[j]) for j, rows in enumerate(plan)] for plan in plans]
