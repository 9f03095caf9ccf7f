"""Train batches from reward groups: layout, log-prob alignment, sharding over ranks."""

from __future__ import annotations

import random

import pytest
import torch

from learner.batch import build_batch, shard_by_tokens
from learner.loss import policy_loss
from rollout.types import Group, Sample


def _groups(seed=0, n_groups=6, n=4):
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        prompt = [1] + [rng.randint(4, 18) for _ in range(rng.randint(2, 6))]
        samples = []
        for _ in range(n):
            r = rng.randint(1, 6)
            samples.append(
                Sample(
                    [rng.randint(4, 18) for _ in range(r)],
                    [-rng.random() for _ in range(r)],
                    "x",
                    "stop",
                    g % 2,
                )
            )
        groups.append(Group(f"p{g}", prompt, samples))
    return groups


def test_layout_and_masks():
    groups = _groups()
    adv = torch.arange(24, dtype=torch.float32)
    b = build_batch(groups, adv, pad_id=0)
    assert len(b) == 24 and torch.equal(b.advantages, adv)
    rows = [(grp, s) for grp in groups for s in grp.samples]
    for i, (g, s) in enumerate(rows):
        p, r = len(g.prompt_ids), len(s.response_ids)
        assert b.input_ids[i, : p + r].tolist() == g.prompt_ids + s.response_ids
        assert b.attention_mask[i].sum() == p + r and (b.input_ids[i, p + r :] == 0).all()
        assert b.response_mask[i].nonzero().squeeze(1).tolist() == list(range(p, p + r))
        assert b.old_logprobs[i, p : p + r].tolist() == pytest.approx(s.logprobs)
    assert b.num_tokens == sum(len(s.response_ids) for g in groups for s in g.samples)
    with pytest.raises(ValueError, match="advantages"):
        build_batch(groups, adv[:-1], pad_id=0)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_shards_have_equal_counts_and_balanced_tokens(ranks):
    b = build_batch(_groups(seed=ranks, n_groups=6, n=4), torch.zeros(24), pad_id=0)
    shards = shard_by_tokens(b, ranks)
    assert sorted(i for s in shards for i in s) == list(range(24))
    assert {len(s) for s in shards} == {24 // ranks}
    tokens = b.response_mask.sum(1)
    loads = [float(tokens[s].sum()) for s in shards]
    # greedy longest-first: the spread is at most the longest single sample (6 tokens)
    assert max(loads) - min(loads) <= float(tokens.max())
    with pytest.raises(ValueError, match="evenly"):
        shard_by_tokens(b, 5)


def test_loss_over_shards_equals_loss_over_the_batch():
    """Shards cut to their own width, global token counts: the summed loss is the batch loss."""
    b = build_batch(_groups(seed=3), torch.randn(24), pad_id=0)
    torch.manual_seed(1)
    logp = b.old_logprobs + 0.1 * torch.randn_like(b.old_logprobs)
    full = policy_loss(logp, b.old_logprobs, b.advantages, b.response_mask).loss
    pieces = 0.0
    for rows in shard_by_tokens(b, 3):
        s = b.select(rows)
        width = s.input_ids.shape[1]
        assert width <= b.input_ids.shape[1]
        pieces += policy_loss(
            logp[rows, :width],
            s.old_logprobs,
            s.advantages,
            s.response_mask,
            total_tokens=b.num_tokens,
        ).loss
    assert pieces.item() == pytest.approx(full.item(), abs=1e-6)
