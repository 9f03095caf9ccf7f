"""PPO-clip policy loss: hand values, clip boundaries, split invariance per aggregation mode."""

from __future__ import annotations

import math

import pytest
import torch

from learner.loss import AGGREGATIONS, LossConfig, aggregate, policy_loss


def test_hand_computed_token_mean_with_kl_and_entropy():
    # Two tokens, A = -1. Token 1: ratio 0.5 -> surr 0.5, clipped 0.8 -> pg = 0.8 (clipped).
    # Token 2: ratio 1 -> pg = 1. k3 KL with ref - logp = log 2 on token 1: 2 - ln2 - 1 = 0.306853;
    # token 2: ref = logp -> 0. Entropy (1, 3).
    # l = pg + 0.1 * kl - 0.01 * ent = (0.8 + 0.0306853 - 0.01, 1 + 0 - 0.03); mean = 0.8953426
    logp = torch.log(torch.tensor([[0.5, 1.0]]))
    out = policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([-1.0]),
        torch.ones(1, 2),
        LossConfig(kl_coef=0.1, entropy_coef=0.01),
        ref_logprobs=logp + torch.tensor([[math.log(2), 0.0]]),
        entropy=torch.tensor([[1.0, 3.0]]),
    )
    assert out.loss.item() == pytest.approx(0.8953426, abs=1e-6)
    assert out.metrics["pg_clipfrac"].item() == 0.5
    assert out.metrics["kl_loss"].item() == pytest.approx(0.306853 / 2, abs=1e-6)
    assert out.metrics["pg_loss"].item() == pytest.approx(0.9, abs=1e-6)  # (0.8 + 1) / 2, no KL
    assert out.metrics["entropy"].item() == 2.0
    # approx_kl (k3 of old vs new): token 1: 0.5 - 1 - ln 0.5 = 0.193147; token 2: 0
    # -> mean 0.0965736
    assert out.metrics["approx_kl"].item() == pytest.approx(0.0965736, abs=1e-6)


def test_aggregation_modes_by_hand():
    # per-token values (masked): seq 0 = (1, 3, -), seq 1 = (2, -, -)
    v = torch.tensor([[1.0, 3.0, 7.0], [2.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(v, m, "token-mean").item() == 2.0  # 6 / 3
    assert aggregate(v, m, "seq-mean-token-mean").item() == 2.0  # (2 + 2) / 2
    with pytest.raises(ValueError, match="norm_len"):  # the padded width is not a constant
        aggregate(v, m, "seq-mean-token-sum-norm")
    assert aggregate(v, m, "seq-mean-token-sum-norm", norm_len=4).item() == 0.75  # (1 + 0.5) / 2
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(v, m, "sum")


def _grad_wrt_logp(ratio: float, adv: float, **kw):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    cfg = LossConfig(**kw)
    out = policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), cfg)
    out.loss.backward()
    return logp.grad.item(), out.metrics["pg_clipfrac"].item()


@pytest.mark.parametrize(
    "ratio, adv, clipped",
    [
        (1.19, 1.0, False),  # inside the high clip: gradient -A * ratio
        (1.21, 1.0, True),  # above 1 + 0.2 with A > 0: no gradient
        (0.5, 1.0, False),  # below the low clip with A > 0: the unclipped term is larger
        (0.81, -1.0, False),  # inside the low clip with A < 0
        (0.79, -1.0, True),  # below 1 - 0.2 with A < 0: no gradient
        (2.0, -1.0, False),  # above the high clip with A < 0, below dual clip 3: gradient flows
    ],
)
def test_clip_boundaries(ratio, adv, clipped):
    grad, frac = _grad_wrt_logp(ratio, adv)
    # d/dlogp of -A * ratio = -A * ratio
    assert frac == float(clipped)
    assert grad == (0.0 if clipped else pytest.approx(-adv * ratio, rel=1e-5))


def test_asymmetric_clip_high():
    # clip_high 0.28 (DAPO): ratio 1.25 with A > 0 is inside [0.8, 1.28], so it is not clipped
    grad, frac = _grad_wrt_logp(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert frac == 0.0 and grad == pytest.approx(-1.25, rel=1e-5)
    grad, frac = _grad_wrt_logp(1.3, 1.0, clip_low=0.2, clip_high=0.28)
    assert frac == 1.0 and grad == 0.0


def test_dual_clip():
    # A = -1, ratio 4 > c = 3: the loss is capped at -A * c = 3 with no gradient.
    logp = torch.tensor([[math.log(4.0)]], requires_grad=True)
    cfg = LossConfig(clip_ratio_c=3.0)
    out = policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0) and logp.grad.item() == 0.0


def _random_batch(seed: int, batch: int = 12, width: int = 9):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    old = -torch.rand(batch, width, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(batch, width, generator=gen, dtype=torch.float64) * 0.3
    ref = old + torch.randn(batch, width, generator=gen, dtype=torch.float64) * 0.3
    ent = torch.rand(batch, width, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    return logp, old, ref, ent, adv, mask.double(), lengths


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("seed", range(5))
def test_split_invariance_loss_and_gradient(mode, seed):
    """Whole-batch loss/grad == sum over any split into micro-batches (ranks), each cut to its
    own padded width, when the global token and sequence counts are passed."""
    logp, old, ref, ent, adv, mask, lengths = _random_batch(seed)
    cfg = LossConfig(aggregation=mode, kl_coef=0.05, entropy_coef=0.01, norm_len=9)

    full_lp = logp.clone().requires_grad_(True)
    full = policy_loss(full_lp, old, adv, mask, cfg, entropy=ent, ref_logprobs=ref).loss
    full.backward()

    gen = torch.Generator().manual_seed(100 + seed)
    perm = torch.randperm(len(adv), generator=gen)
    cuts = sorted(torch.randperm(len(adv) - 1, generator=gen)[:3].add(1).tolist())
    pieces = torch.tensor_split(perm, cuts)
    total_tokens, total_seqs = mask.sum(), len(adv)
    split_lp = logp.clone().requires_grad_(True)
    split_loss = torch.zeros((), dtype=torch.float64)
    for rows in pieces:
        w = int(lengths[rows].max())  # each piece padded only to its own longest response
        piece = policy_loss(
            split_lp[rows, :w],
            old[rows, :w],
            adv[rows],
            mask[rows, :w],
            cfg,
            entropy=ent[rows, :w],
            ref_logprobs=ref[rows, :w],
            total_tokens=total_tokens,
            total_seqs=total_seqs,
        ).loss
        split_loss = split_loss + piece
    split_loss.backward()
    assert split_loss.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(split_lp.grad, full_lp.grad, atol=1e-12)


def test_masked_tokens_get_no_gradient():
    logp, old, _, _, adv, mask, _ = _random_batch(0)
    lp = logp.clone().requires_grad_(True)
    policy_loss(lp, old, adv, mask).loss.backward()
    assert (lp.grad[mask == 0] == 0).all() and (lp.grad[mask == 1] != 0).any()


def test_dual_clip_is_on_by_default_and_can_be_turned_off():
    # A = -1, ratio 4: default c = 3 caps the term at 3 (no gradient); c = None gives 4
    logp = torch.tensor([[math.log(4.0)]])
    args = (logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert policy_loss(*args).loss.item() == pytest.approx(3.0)
    assert policy_loss(*args, LossConfig(clip_ratio_c=None)).loss.item() == pytest.approx(4.0)


def test_log_ratio_is_clamped():
    # old = -inf-ish (engine log-prob -1000), logp = 0: log-ratio 1000 clamped to 20, so the
    # ratio is e^20 (finite) and, with A > 0 above the clip, the loss is -A * 1.2 and finite
    out = policy_loss(
        torch.zeros(1, 1), torch.full((1, 1), -1000.0), torch.tensor([1.0]), torch.ones(1, 1)
    )
    assert out.loss.item() == pytest.approx(-1.2)
    assert math.isfinite(out.metrics["approx_kl"].item())  # e^20 - 1 - 20, not inf


def test_truncated_importance_weights_scale_each_token():
    # A = 1, ratio 1 on both tokens: pg = -1 each; weights (2.0, 0.5): loss = (-2 - 0.5) / 2
    w = torch.tensor([[2.0, 0.5]])
    out = policy_loss(
        torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), is_weights=w
    )
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.metrics["pg_loss"].item() == pytest.approx(-1.25)


def test_seq_mean_modes_count_only_sequences_with_tokens():
    # A fully masked row (DAPO's overlong filter) is not a sequence of the mean (verl's
    # seq_mask): row 0 mean (1 + 3) / 2 = 2, row 1 masked -> 2 / 1 = 2 (not 2 / 2 = 1);
    # sum-norm with norm_len 4: (4 / 4) / 1 = 1.
    v = torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    m = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate(v, m, "seq-mean-token-mean").item() == 2.0
    assert aggregate(v, m, "seq-mean-token-sum-norm", norm_len=4).item() == 1.0
    from learner.batch import TrainBatch

    b = TrainBatch(
        input_ids=torch.zeros(2, 2, dtype=torch.long),
        attention_mask=torch.ones(2, 2, dtype=torch.long),
        response_mask=m,
        old_logprobs=torch.zeros(2, 2),
        advantages=torch.zeros(2),
        policy_version=torch.zeros(2, dtype=torch.long),
    )
    assert b.num_seqs == 1  # what the learner group passes as the global sequence count
