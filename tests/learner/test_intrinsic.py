"""INTUITOR / RENT rewards (reward/intrinsic.py): the learner's scores equal a direct computation
from the logits on the tiny model (chunked and full paths, and through 2 DeepSpeed ranks), and a
few updates on those rewards move the policy the right way on a fixed batch."""

from __future__ import annotations

import math

import pytest
import torch

from learner.advantage import grpo_advantages
from learner.batch import build_batch
from learner.logprobs import model_intrinsic, model_logprobs
from learner.loss import policy_loss
from reward.intrinsic import IntrinsicRewardConfig, mix_rewards, response_means
from rollout.types import Group, Sample

T = 1.3  # a sampling temperature != 1 (the scores use softmax(z / T)); > 1: mixed groups


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _sampled_batch(model, n_groups=3, n=4, length=6, seed=0):
    """Groups whose responses are sampled from ``model`` at T (on-policy), old log-probs its own."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for j in range(n_groups):
        prompt = [1, 4 + j, 5 + j, 17]
        samples = []
        for _ in range(n):
            ids = list(prompt)
            with torch.no_grad():
                for _ in range(length):
                    z = model(input_ids=torch.tensor([ids])).logits[0, -1] / T
                    ids.append(int(torch.multinomial(torch.softmax(z, -1), 1, generator=g)))
            samples.append(Sample(ids[len(prompt) :], [0.0] * length, "", "length", 0))
        groups.append(Group(f"p{j}", prompt, samples))
    batch = build_batch(groups, torch.zeros(n_groups * n), pad_id=0)
    with torch.no_grad():
        old, _ = model_logprobs(
            model, batch.input_ids, batch.attention_mask, temperature=T, logits="full",
            token_mask=batch.response_mask,
        )  # fmt: skip
    batch.old_logprobs = old
    return groups, batch


def _direct(model, batch):
    """Entropy and KL(U || p) per response token straight from the full logits."""
    with torch.no_grad():
        z = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits / T
    logp = torch.log_softmax(z.double(), -1)[:, :-1]  # position t-1 predicts token t
    ent = -(logp.exp() * logp).sum(-1)
    cert = -math.log(z.shape[-1]) - logp.mean(-1)
    pad = lambda x: torch.nn.functional.pad(x, (1, 0))  # noqa: E731
    mask = batch.response_mask
    return response_means(pad(ent), mask), response_means(pad(cert), mask)


def test_scores_equal_a_direct_computation_from_the_logits(tiny_model_dir):
    model = _model(tiny_model_dir)
    _, batch = _sampled_batch(model)
    want_ent, want_cert = _direct(model, batch)
    for mode, chunks in (("full", None), ("chunked", 1), ("chunked", 5)):
        ent, cert = model_intrinsic(
            model, batch.input_ids, batch.attention_mask, batch.response_mask,
            temperature=T, logits=mode, chunks=chunks, chunk_tokens=7,
        )  # fmt: skip
        assert torch.allclose(
            response_means(ent, batch.response_mask).double(), want_ent, atol=1e-5
        )
        assert torch.allclose(response_means(cert, batch.response_mask).double(), want_cert,
                              atol=1e-5)  # fmt: skip
        outside = batch.response_mask == 0
        assert ent[outside].abs().max() == 0 and cert[outside].abs().max() == 0
    # KL(U || p) >= 0 and H <= log V for every token
    assert (want_cert > 0).all() and (want_ent < math.log(model.config.vocab_size)).all()


@pytest.mark.parametrize("source", ["self_certainty", "neg_entropy"])
def test_updates_on_the_intrinsic_reward_move_it_the_right_way(tiny_model_dir, source):
    """One GRPO step on the preset's reward (scored by the production path: model_intrinsic,
    response_means, mix_rewards with INTUITOR's / RENT's weights) makes the samples with more
    self-certainty (less entropy), measured directly from the logits, more likely relative to
    their group: sum_i (Q_i - mean_group Q) * (log pi_new(y_i) - log pi_old(y_i)) > 0, Q the
    quantity. A sign error anywhere in the reward would make it negative."""
    model = _model(tiny_model_dir)
    _, batch = _sampled_batch(model)
    mask = batch.response_mask
    ent, cert = model_intrinsic(
        model, batch.input_ids, batch.attention_mask, mask, temperature=T, logits="chunked"
    )
    weights = {"self_certainty": 1.0} if source == "self_certainty" else {"neg_entropy": 1.0}
    mix = IntrinsicRewardConfig(verifier=0.0, **weights)
    verdict_scores = torch.zeros(len(batch))  # the verifier's weight is 0 here
    reward = mix_rewards(verdict_scores, response_means(ent, mask), response_means(cert, mask), mix)
    groups = torch.arange(3).repeat_interleave(4)
    adv = grpo_advantages(reward, groups).advantages
    assert adv.abs().sum() > 0  # some group is mixed at this temperature

    def seq_logp():
        logp, _ = model_logprobs(
            model, batch.input_ids, batch.attention_mask, temperature=T, logits="full",
            token_mask=mask,
        )  # fmt: skip
        return logp

    policy_loss(seq_logp(), batch.old_logprobs, adv, mask).loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.sqrt(sum((p.grad**2).sum() for p in params))
    with torch.no_grad():  # a small normalised gradient step: first order, whatever the scale
        for p in params:
            p -= 1e-3 * p.grad / norm
    with torch.no_grad():
        gained = ((seq_logp() - batch.old_logprobs) * mask).sum(-1).double()  # [N]
    ent0, cert0 = _direct(_model(tiny_model_dir), batch)
    q = cert0 if source == "self_certainty" else -ent0
    centred = (q.view(3, 4) - q.view(3, 4).mean(-1, keepdim=True)).view(-1)
    assert (centred * gained).sum() > 0, (centred.tolist(), gained.tolist())


@pytest.mark.slow
def test_the_learner_group_scores_like_the_direct_computation(ray_cluster, tiny_model_dir):
    """2 DeepSpeed ranks (ZeRO-3: the output embedding gathered per piece on both ranks), rows
    sharded by tokens and put back in order."""
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig

    model = _model(tiny_model_dir)
    _, batch = _sampled_batch(model)  # 12 rows: 6 per rank
    want_ent, want_cert = _direct(model, batch)
    cfg = LearnerConfig(num_ranks=2, zero_stage=3, micro_batch_size=2, timeout_s=600)
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir, temperature=T)
    try:
        got = group.intrinsic(batch)
    finally:
        group.shutdown()
    assert torch.allclose(got[:, 0].double(), want_ent, atol=1e-5)
    assert torch.allclose(got[:, 1].double(), want_cert, atol=1e-5)
