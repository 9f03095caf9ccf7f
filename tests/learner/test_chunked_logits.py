"""Chunked log-probs (learner/logprobs.py: decoder, then the output embedding in pieces) against
the full-logits path, on real transformers models and without DeepSpeed; the learner's policy
loading (learner/policy.py). The DeepSpeed ranks' side is in test_learner_ray.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from learner.batch import build_batch
from learner.config import LearnerConfig
from learner.logprobs import logits_problem, model_logprobs
from learner.loss import LossConfig
from learner.policy import load_policy
from learner.tempered_logits import token_logprobs
from learner.update import microbatch_loss
from rollout.types import Group, Sample
from tests.helpers import random_lm


def _groups(seed: int, lengths: list[int], vocab: int) -> list[Group]:
    """One sample per response length; prompt lengths vary too, so rows are padded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, r in enumerate(lengths):
        prompt = torch.randint(4, vocab, (3 + i % 4,), generator=g).tolist()
        resp = torch.randint(4, vocab, (r,), generator=g).tolist()
        lp = (-0.5 - torch.rand(r, generator=g)).tolist()
        out.append(Group("", prompt, [Sample(resp, lp, "", "stop", 0)]))
    return out


def _batch(seed: int, lengths: list[int], vocab: int):
    adv = torch.linspace(-1.0, 1.0, len(lengths))
    return build_batch(_groups(seed, lengths, vocab), adv, pad_id=0)


def _loss_and_grad(model, batch, *, logits, chunks=None, chunk_tokens=2048, **loss_kw):
    """The rank's micro-batch loss at T = 0.6 with an entropy bonus, its log-probs and entropy
    metric, and the gradient of every parameter."""
    model.zero_grad()
    out, logp = microbatch_loss(
        model,
        batch,
        LossConfig(entropy_coef=0.1, **loss_kw),
        temperature=0.6,
        total_tokens=float(batch.num_tokens),
        total_seqs=float(len(batch)),
        logits=logits,
        chunk_tokens=chunk_tokens,
        chunks=chunks,
    )
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out.loss.detach(), logp.detach(), out.metrics["entropy"], grads


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.mark.parametrize("chunks", [1, 3, 64])
def test_chunked_equals_full_loss_and_gradients_on_the_tied_tiny_model(tiny, chunks):
    """fp32, T = 0.6, entropy bonus on: the same loss, entropy and gradients (tight tolerance:
    only float summation order differs). 64 pieces > the 32 scored positions: empty pieces too."""
    assert tiny.config.tie_word_embeddings  # lm_head.weight is the input embedding
    assert tiny.get_output_embeddings().weight is tiny.get_input_embeddings().weight
    batch = _batch(0, [1, 5, 2, 8, 3, 6, 4, 3], vocab=tiny.config.vocab_size)  # 32 tokens
    full = _loss_and_grad(tiny, batch, logits="full")
    got = _loss_and_grad(tiny, batch, logits="chunked", chunks=chunks)
    assert got[0].item() == pytest.approx(full[0].item(), abs=1e-6)
    assert got[2].item() == pytest.approx(full[2].item(), abs=1e-6)
    mask = batch.response_mask.bool()
    assert torch.allclose(got[1][mask], full[1][mask], atol=1e-6)
    assert got[1][~mask].abs().max() == 0  # only response positions are scored
    assert full[3].keys() == got[3].keys()
    for name, g in full[3].items():
        assert g.abs().max() > 0, name  # every parameter gets a gradient
        assert torch.allclose(got[3][name], g, atol=1e-6, rtol=1e-5), name


def test_chunked_log_probs_are_the_tempered_softmax_of_the_full_logits(tiny):
    """Against a direct computation: log_softmax(logits[t - 1] / T)[x_t] at response positions."""
    batch = _batch(1, [3, 7], vocab=tiny.config.vocab_size)
    with torch.no_grad():
        logp, ent = model_logprobs(
            tiny,
            batch.input_ids,
            batch.attention_mask,
            temperature=0.6,
            with_entropy=True,
            token_mask=batch.response_mask,
            chunks=4,
        )
        logits = tiny(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    for b, t in batch.response_mask.nonzero().tolist():
        want = torch.log_softmax(logits[b, t - 1] / 0.6, -1)
        assert logp[b, t].item() == pytest.approx(want[batch.input_ids[b, t]].item(), abs=1e-5)
        assert ent[b, t].item() == pytest.approx(-(want.exp() * want).sum().item(), abs=1e-5)


def test_a_batch_with_nothing_to_score_still_reaches_every_parameter(tiny):
    """All responses masked out (DAPO's overlong filter): log-probs 0, and every parameter gets
    a (zero) gradient, as in the full path: ZeRO reduces every parameter on every rank."""
    batch = _batch(2, [2, 3], vocab=tiny.config.vocab_size)
    tiny.zero_grad(set_to_none=True)
    logp, _ = model_logprobs(
        tiny,
        batch.input_ids,
        batch.attention_mask,
        token_mask=torch.zeros_like(batch.response_mask),
    )
    assert logp.abs().max() == 0
    logp.sum().backward()
    for name, p in tiny.named_parameters():
        assert p.grad is not None and p.grad.abs().max() == 0, name


class _LargestTensor(TorchDispatchMode):
    """The largest tensor any op creates while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.fixture(scope="module")
def qwen_152k():
    """A Qwen2-style model at Qwen2.5's vocabulary, built from a config (no download): 151,936 x
    64 embeddings, untied output embedding, 2 layers (~19.6M parameters)."""
    return random_lm("Qwen2", 2, 64, 128, 4, 2, 151936, tie_word_embeddings=False)


def test_152k_vocabulary_chunked_matches_full_without_the_full_logits(qwen_152k):
    """Same loss and gradients as the full path, and no tensor as large as the [B, T, V] logits
    is ever created. Sizes: 4 rows, width = prompt (3..6) + 40 response tokens -> T = 46 (the
    longest: prompt 6), B x T x V = 4 x 46 x 151,936 = 27.96M elements; the largest weight or
    gradient is V x H = 9.72M; a piece is 160 / 8 = 20 positions x V = 3.04M. The bound
    B x T x V / 2 = 13.98M separates the two paths (the full path must exceed it)."""
    model = qwen_152k
    v = model.config.vocab_size
    batch = _batch(3, [40, 40, 40, 40], vocab=v)
    b, t = batch.input_ids.shape
    assert (b, t) == (4, 46)
    bound = b * t * v // 2
    sizes = {}
    results = {}
    for mode, chunks in (("full", None), ("chunked", 8)):
        with _LargestTensor() as seen:
            results[mode] = _loss_and_grad(model, batch, logits=mode, chunks=chunks)
        sizes[mode] = seen.numel
    assert sizes["full"] >= b * t * v > bound  # the test can tell the paths apart
    assert sizes["chunked"] < bound, sizes
    full, got = results["full"], results["chunked"]
    assert got[0].item() == pytest.approx(full[0].item(), abs=1e-6)
    assert got[2].item() == pytest.approx(full[2].item(), abs=1e-5)
    for name, g in full[3].items():
        assert torch.allclose(got[3][name], g, atol=1e-6, rtol=1e-5), name


def test_gemma_soft_capping_is_applied_per_piece():
    """Gemma 2 computes cap * tanh(logits / cap) (config.final_logit_softcapping): the chunked
    path applies it too. Cap 2.0 (not Gemma's 30) so that it changes the numbers a lot: the
    uncapped softmax of the same hidden states would be far off (checked)."""
    model = random_lm("Gemma2", 2, 32, 64, 4, 2, 97, head_dim=8, final_logit_softcapping=2.0)
    with torch.no_grad():  # bigger logits, so the cap matters
        model.get_output_embeddings().weight.mul_(20.0)
    batch = _batch(4, [3, 5, 2], vocab=97)
    assert logits_problem(model) is None
    full = _loss_and_grad(model, batch, logits="full")
    got = _loss_and_grad(model, batch, logits="chunked", chunks=2)
    assert got[0].item() == pytest.approx(full[0].item(), abs=1e-6)
    for name, g in full[3].items():
        assert torch.allclose(got[3][name], g, atol=1e-6, rtol=1e-5), name
    with torch.no_grad():  # without the cap the log-probs would differ
        hidden = model.get_decoder()(input_ids=batch.input_ids).last_hidden_state
        uncapped = token_logprobs(model.get_output_embeddings()(hidden), batch.input_ids)[0]
        capped, _ = model_logprobs(model, batch.input_ids, batch.attention_mask)
    assert (uncapped - capped).abs().max() > 0.1


def test_models_whose_logits_are_not_lm_head_of_hidden_fall_back_with_a_reason(tiny):
    from transformers import CohereConfig, CohereForCausalLM, LlamaForCausalLM

    assert logits_problem(tiny) is None
    cohere = CohereForCausalLM(
        CohereConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            logit_scale=0.0625,
        )
    )
    assert "logit_scale=0.0625" in logits_problem(cohere)

    class Scaled(LlamaForCausalLM):  # an unknown transform: only the numeric check sees it
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3.0
            return out

    scaled = Scaled(tiny.config)
    scaled.load_state_dict(tiny.state_dict())
    assert "differ from the full logits" in logits_problem(scaled)


def test_load_policy_applies_attention_and_gradient_checkpointing(tiny_model_dir):
    """learner.attn_implementation reaches transformers; learner.gradient_checkpointing makes the
    backward pass re-run every decoder layer (counted: each layer's forward starts twice per
    step) and gives the same gradients."""
    batch = _batch(5, [3, 4], vocab=19)  # the tiny model's 19 used ids (32 rows)
    runs = {}
    for ckpt in (False, True):
        cfg = LearnerConfig(gradient_checkpointing=ckpt, attn_implementation="eager")
        model = load_policy(tiny_model_dir, cfg, "float32")
        assert model.config._attn_implementation == "eager"
        assert model.is_gradient_checkpointing == ckpt
        calls = []
        for layer in model.model.layers:
            layer.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        runs[ckpt] = (_loss_and_grad(model, batch, logits="chunked"), len(calls))
    layers = len(model.model.layers)
    assert runs[False][1] == layers and runs[True][1] == 2 * layers
    for name, g in runs[False][0][3].items():
        assert torch.allclose(runs[True][0][3][name], g, atol=1e-6), name
    default = load_policy(tiny_model_dir, LearnerConfig(), "float32")
    assert not default.is_gradient_checkpointing
