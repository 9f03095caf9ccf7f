"""Token log-probs and entropy at the sampling temperature (learner/tempered_logits.py), and the
rank's micro-batch loss (learner/rank.py: microbatch_loss) on a real transformers model, no
DeepSpeed."""

from __future__ import annotations

import math

import pytest
import torch

from learner.batch import build_batch
from learner.loss import AGGREGATIONS, LossConfig
from learner.tempered_logits import token_logprobs
from learner.update import microbatch_loss
from rollout.types import Group, Sample


def test_token_logprobs_align_with_the_generating_convention():
    # A fixed table of logits: logp at t must equal log_softmax(logits[t-1] / T)[ids[t]].
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    for temperature in (1.0, 0.6):
        got, ent = token_logprobs(logits, ids, temperature=temperature, with_entropy=True)
        for b in range(2):
            assert got[b, 0] == 0 and ent[b, 0] == 0
            for t in range(1, 5):
                logp = torch.log_softmax(logits[b, t - 1] / temperature, -1)
                assert got[b, t].item() == pytest.approx(logp[ids[b, t]].item(), abs=1e-6)
                h = -(logp.exp() * logp).sum()
                assert ent[b, t].item() == pytest.approx(h.item(), abs=1e-6)


def test_entropy_hand_computed():
    # logits [0, log 3] -> p = (1/4, 3/4): H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    _, ent = token_logprobs(logits, torch.tensor([[0, 1]]), with_entropy=True)
    assert ent[0, 1].item() == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(4 / 3), abs=1e-6)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 7, 10_000])
def test_chunked_values_and_gradients_equal_the_whole(chunk_tokens):
    """Any chunk size gives the same log-probs, entropy and gradients (checkpointed chunks)."""
    torch.manual_seed(1)
    base = torch.randn(3, 6, 11)
    ids = torch.randint(0, 11, (3, 6))
    weights = torch.randn(3, 6)

    def run(chunk):
        logits = base.clone().requires_grad_(True)
        lp, ent = token_logprobs(
            logits, ids, temperature=0.7, with_entropy=True, chunk_tokens=chunk
        )
        ((lp + 0.3 * ent) * weights).sum().backward()
        return lp.detach(), ent.detach(), logits.grad

    whole = run(10**9)
    got = run(chunk_tokens)
    for a, b in zip(whole, got, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _groups(seed: int, lengths: list[int]) -> list[Group]:
    """One group per response length (prompt lengths vary too, so padded widths differ)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, r in enumerate(lengths):
        prompt = [1] + torch.randint(4, 17, (2 + i % 3,), generator=g).tolist() + [17]
        resp = torch.randint(4, 14, (r,), generator=g).tolist()
        lp = (-0.5 - torch.rand(r, generator=g)).tolist()
        out.append(Group("", prompt, [Sample(resp, lp, "", "stop", 0)]))
    return out


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_microbatch_split_does_not_change_loss_or_gradient(model, aggregation):
    """The rank's micro-batch loss with global counts: micro-batches of 1 (each padded to its own
    width) sum to the whole batch's loss and gradient, for every aggregation. Dr. GRPO's
    seq-mean-token-sum-norm divides by the constant norm_len (the max response length), not by
    each micro-batch's padded width (which gave different weights per micro-batch)."""
    groups = _groups(0, [1, 5, 2, 8, 3, 6])
    batch = build_batch(groups, torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.4]), pad_id=0)
    cfg = LossConfig(aggregation=aggregation, norm_len=8)
    totals = dict(total_tokens=float(batch.num_tokens), total_seqs=float(len(batch)))

    def loss_and_grad(pieces):
        model.zero_grad()
        total = 0.0
        for rows in pieces:
            out, _ = microbatch_loss(model, batch.select(rows), cfg, temperature=0.6, **totals)
            out.loss.backward()
            total += out.loss.item()
        return total, torch.cat([p.grad.flatten().clone() for p in model.parameters()])

    whole_loss, whole_grad = loss_and_grad([list(range(6))])
    split_loss, split_grad = loss_and_grad([[i] for i in range(6)])
    assert split_loss == pytest.approx(whole_loss, abs=1e-6)
    # Equal up to float32 summation order (each micro-batch pads to its own width): measured
    # 2.4e-6 at max |g| 0.48 (seq-mean-token-mean, pinned FAST_TINY), i.e. 5e-6 of the
    # gradient's scale; bound 1e-5 of it. A wrong count is an error of a whole sample's share
    # (1/6 of the batch here), 4 orders of magnitude above.
    scale = float(whole_grad.abs().max())
    assert float((split_grad - whole_grad).abs().max()) <= 1e-5 * scale


def test_dr_grpo_without_a_constant_norm_len_is_an_error(model):
    batch = build_batch(_groups(1, [2, 3]), torch.tensor([1.0, -1.0]), pad_id=0)
    cfg = LossConfig(aggregation="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="norm_len"):
        microbatch_loss(model, batch, cfg, temperature=1.0, total_tokens=5.0, total_seqs=2.0)


def test_entropy_coef_changes_the_gradient_and_entropy_is_reported(model):
    batch = build_batch(_groups(2, [3, 4]), torch.tensor([1.0, -1.0]), pad_id=0)
    grads, entropies = [], []
    for coef in (0.0, 0.5):
        model.zero_grad()
        out, _ = microbatch_loss(
            model,
            batch,
            LossConfig(entropy_coef=coef),
            temperature=1.0,
            total_tokens=7.0,
            total_seqs=2.0,
        )
        out.loss.backward()
        grads.append(torch.cat([p.grad.flatten().clone() for p in model.parameters()]))
        entropies.append(out.metrics["entropy"].item())
    assert entropies[0] == entropies[1] > 0  # logged whatever the coefficient
    assert not torch.allclose(grads[0], grads[1])  # the bonus is applied
