"""Micro-batch planning (learner/batch.py): token-budget packing, equal micro-batch counts over
ranks, and equal logits-piece counts per micro-batch index. Pure functions, hand-computed."""

from __future__ import annotations

import random

import pytest
import torch

from learner.batch import (
    MicroBatch,
    TrainBatch,
    pack_by_tokens,
    plan_microbatches,
    plan_rows,
    split_to,
)


def test_pack_by_tokens_hand_computed():
    # lengths 10, 3, 7, 4, 2, 8 (rows 0..5), budget 16. Longest first: 10 (0), 8 (5), 7 (2),
    # 4 (3), 3 (1), 2 (4).
    # [0]: 10; adding 8 would be 2 x 10 = 20 > 16 -> closed.
    # [5, 2]: 8, then 7 -> 2 x 8 = 16 <= 16; adding 4 -> 3 x 8 = 24 > 16 -> closed.
    # [3, 1, 4]: 4, 3 -> 2 x 4 = 8; 2 -> 3 x 4 = 12 <= 16.
    # Padded tokens 10 + 16 + 12 = 38 for 34 real tokens; rows ascending inside each.
    assert pack_by_tokens([10, 3, 7, 4, 2, 8], 16) == [[0], [2, 5], [1, 3, 4]]
    # A row longer than the budget is alone: 30 > 16; then 5 + 5 = 2 x 5 = 10.
    assert pack_by_tokens([5, 30, 5], 16) == [[1], [0, 2]]
    # Equal lengths: 3 x 5 = 15 fits, a 4th (20) does not.
    assert pack_by_tokens([5] * 7, 16) == [[0, 1, 2], [3, 4, 5], [6]]


def test_split_to_halves_the_costliest_micro_batch():
    # Costs: [0, 1, 2] 3 x 9 = 27 (lengths 9, 2, 2); [3, 4] 2 x 8 = 16. The first splits into its
    # ceil(3/2) = 2 longest rows [0, 1] (ties by index: 1 before 2) and [2]. Now costs 2 x 9 = 18,
    # 2, 16: to reach 4, [0, 1] splits into [0] and [1].
    lengths = [9, 2, 2, 8, 8]
    assert split_to([[0, 1, 2], [3, 4]], lengths, 3) == [[0, 1], [2], [3, 4]]
    assert split_to([[0, 1, 2], [3, 4]], lengths, 4) == [[0], [1], [2], [3, 4]]
    with pytest.raises(ValueError, match="cannot make 6"):
        split_to([[0, 1, 2], [3, 4]], lengths, 6)  # 5 rows


def test_plan_rows_gives_every_rank_the_same_count():
    # Rank 0 packs into 3 (previous test); rank 1's six 5-token rows into 2 (3 x 5 = 15 each),
    # so rank 1 splits its first (equal costs 15, 15: the first) into [0, 1] and [2].
    plans = plan_rows([[10, 3, 7, 4, 2, 8], [5] * 6], micro_batch_size=4, micro_batch_tokens=16)
    assert plans == [[[0], [2, 5], [1, 3, 4]], [[0, 1], [2], [3, 4, 5]]]
    # Count-based (no budget): consecutive rows, as before the budget existed: 7 rows by 3.
    plans = plan_rows([[1] * 7, [9] * 7], micro_batch_size=3, micro_batch_tokens=None)
    assert plans == [[[0, 1, 2], [3, 4, 5], [6]]] * 2


def test_plan_rows_properties_on_random_shards():
    """Every row once, equal counts, and a micro-batch over budget only when it is one row."""
    rng = random.Random(0)
    for _ in range(200):
        ranks, rows = rng.randint(1, 4), rng.randint(1, 12)
        lengths = [[rng.randint(1, 40) for _ in range(rows)] for _ in range(ranks)]
        budget = rng.randint(1, 120)
        plans = plan_rows(lengths, micro_batch_size=4, micro_batch_tokens=budget)
        assert len({len(p) for p in plans}) == 1
        for plan, ls in zip(plans, lengths, strict=True):
            assert sorted(i for mb in plan for i in mb) == list(range(rows))
            for mb in plan:
                assert mb and (len(mb) == 1 or len(mb) * max(ls[i] for i in mb) <= budget)


def _shard(lengths: list[int], responses: list[int]) -> TrainBatch:
    """Right-padded rows: ``lengths[i]`` tokens, the last ``responses[i]`` of them response."""
    width = max(lengths)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    response = torch.zeros(len(lengths), width)
    for i, (n, r) in enumerate(zip(lengths, responses, strict=True)):
        attention[i, :n] = 1
        response[i, n - r : n] = 1.0
    return TrainBatch(
        input_ids=attention.clone(),
        attention_mask=attention,
        response_mask=response,
        old_logprobs=torch.zeros(len(lengths), width),
        advantages=torch.zeros(len(lengths)),
        policy_version=torch.zeros(len(lengths), dtype=torch.long),
    )


def test_plan_microbatches_takes_the_most_logits_pieces_at_each_index():
    # Rank 0: lengths 10, 6, 6 with 8, 3, 2 response tokens; rank 1: 8, 8, 4 with 1, 6, 2.
    # Budget 12: rank 0 -> [0] (10), [1, 2] (2 x 6); rank 1 -> [0] (8; 2 x 8 > 12), [1] (8),
    # [2] (4; can it join [1]? 2 x 8 = 16 > 12, no) -> 3 micro-batches, so rank 0 splits
    # [1, 2] into [1] and [2] (its only splittable one).
    # Pieces of 2 scored positions (the response tokens): rank 0: 8 -> 4, 3 -> 2, 2 -> 1;
    # rank 1: 1 -> 1, 6 -> 3, 2 -> 1. Per index the maximum: 4, 3, 1.
    shards = [_shard([10, 6, 6], [8, 3, 2]), _shard([8, 8, 4], [1, 6, 2])]
    plans = plan_microbatches(shards, micro_batch_size=4, micro_batch_tokens=12, chunk_tokens=2)
    assert plans == [
        [MicroBatch([0], 4), MicroBatch([1], 3), MicroBatch([2], 1)],
        [MicroBatch([0], 4), MicroBatch([1], 3), MicroBatch([2], 1)],
    ]
