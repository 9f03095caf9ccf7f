"""Every ``learner`` and ``algorithm.loss`` key that is handed down a layer arrives: the learner
config -> DeepSpeed's config dict (learner/policy.py ``deepspeed_config``), AdamW and its
warm-up (``make_optimizer``), the transformers model and its adapters (``load_policy``,
learner/lora.py ``wrap``), the split of a batch over ranks (learner/update.py
``split_for_ranks``) and the update's metrics (``summarize_ranks``); the loss config -> the
micro-batch loss (``microbatch_loss`` -> learner/loss.py ``policy_loss``). Each key is set to a
value other than its default and must change what the lower layer gets. No Ray, no DeepSpeed:
the shipped tiny model or a random one of a few thousand weights."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from learner.config import LearnerConfig, LoraConfig
from learner.logprobs import model_logprobs
from learner.lora import wrap
from learner.loss import LossConfig, policy_loss
from learner.policy import deepspeed_config, load_policy, make_optimizer
from learner.update import RankMetrics, microbatch_loss, split_for_ranks, summarize_ranks
from tests.helpers import random_lm, train_batch


def learner(**settings) -> LearnerConfig:
    return dataclasses.replace(LearnerConfig(), **settings)


# ---- DeepSpeed's config -----------------------------------------------------------------------

# (key and a non-default value, the model dtype, the path in DeepSpeed's dict, its value there)
DEEPSPEED_CASES = [
    ({"micro_batch_size": 4}, "float32", ("train_micro_batch_size_per_gpu",), 4),
    ({"grad_clip": 0.5}, "float32", ("gradient_clipping",), 0.5),
    ({"zero_stage": 3}, "float32", ("zero_optimization", "stage"), 3),
    ({"dtype": "bfloat16"}, "float32", ("bf16", "enabled"), True),  # learner.dtype over model's
]


@pytest.mark.parametrize(
    "settings, model_dtype, path, want",
    DEEPSPEED_CASES,
    ids=[next(iter(c[0])) for c in DEEPSPEED_CASES],
)
def test_each_key_reaches_deepspeeds_config(settings, model_dtype, path, want):
    from learner.policy import learner_dtype

    def at(cfg: LearnerConfig):
        value = deepspeed_config(cfg, learner_dtype(cfg, model_dtype))
        for key in path:
            value = value[key]
        return value

    assert at(learner(**settings)) == want != at(LearnerConfig())


# ---- the optimizer and its schedule ------------------------------------------------------------


def optimizer_of(**settings):
    weight = torch.nn.Parameter(torch.zeros(2))
    return make_optimizer([weight], learner(**settings))


@pytest.mark.parametrize(
    "key, value, group_key",
    [
        ("lr", 3e-4, "lr"),  # no warm-up: the first step's rate
        ("betas", [0.8, 0.95], "betas"),
        ("adam_eps", 1e-5, "eps"),
        ("weight_decay", 0.1, "weight_decay"),
    ],
)
def test_each_key_reaches_adamw(key, value, group_key):
    (got,) = optimizer_of(**{key: value})[0].param_groups
    (default,) = optimizer_of()[0].param_groups
    want = tuple(value) if key == "betas" else value
    assert got[group_key] == want != default[group_key]


def test_warmup_steps_ramp_the_rate():
    # 4 warm-up steps at lr 1e-3: 1/4, 2/4, 3/4, then 1 of it; none: the full rate at once
    optimizer, schedule = optimizer_of(lr=1e-3, warmup_steps=4)
    rates = []
    for _ in range(5):
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert optimizer_of(lr=1e-3)[1].get_last_lr() == [1e-3]


# ---- the model and its adapters -----------------------------------------------------------------


def test_load_policy_forwards_dtype_attention_checkpointing_and_lora(tiny_model_dir):
    default = load_policy(tiny_model_dir, LearnerConfig(), "float32")
    assert default.config._attn_implementation != "eager" and not default.is_gradient_checkpointing
    assert not hasattr(default, "peft_config") and default.dtype == torch.float32
    cfg = learner(attn_implementation="eager", gradient_checkpointing=True, lora=LoraConfig(rank=2))
    model = load_policy(tiny_model_dir, cfg, "bfloat16")
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    assert model.is_gradient_checkpointing and model.training
    assert model.peft_config["default"].r == 2
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    # the frozen KL reference gets neither adapters nor checkpointing
    reference = load_policy(tiny_model_dir, cfg, "float32", trainable=False)
    assert not hasattr(reference, "peft_config") and not reference.is_gradient_checkpointing


LORA = LoraConfig(rank=2)


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("rank", 4, "r"),
        ("alpha", 4.0, "lora_alpha"),
        ("dropout", 0.1, "lora_dropout"),
        ("target_modules", ["q_proj"], "target_modules"),
    ],
)
def test_each_lora_key_reaches_peft(key, value, field):
    def peft_config(cfg: LoraConfig):
        return getattr(
            wrap(random_lm("Llama", 1, 16, 32, 2, 2, 50), cfg).peft_config["default"], field
        )

    got, default = peft_config(dataclasses.replace(LORA, **{key: value})), peft_config(LORA)
    if key == "target_modules":  # peft keeps a set of names; "all-linear" as given
        got = sorted(got)
    assert got == value != default


# ---- the loss config through the micro-batch loss ---------------------------------------------


@pytest.fixture(scope="module")
def loss_setup():
    """A random Llama and a batch whose old log-probs are the model's own shifted by -1, +1,
    -2.5, ... per token (ratios e, 1/e, e^2.5: outside every clip range), advantages of both
    signs; a reference model with perturbed weights (a non-zero KL)."""
    model = random_lm("Llama", 1, 16, 32, 2, 2, 50)
    _, batch = train_batch(model, seed=3)
    shifts = torch.tensor([-1.0, 1.0, -2.5, 2.5])
    pattern = shifts.repeat(batch.old_logprobs.shape[1] // 4 + 1)[: batch.old_logprobs.shape[1]]
    with torch.no_grad():
        kw = dict(temperature=0.7, token_mask=batch.response_mask)
        logp, _ = model_logprobs(model, batch.input_ids, batch.attention_mask, **kw)
    batch.old_logprobs = (logp + pattern) * batch.response_mask
    batch.advantages = torch.linspace(-1.5, 1.5, len(batch))
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return model, batch, reference


def loss_of(setup, cfg: LossConfig) -> float:
    model, batch, reference = setup
    totals = dict(total_tokens=float(batch.num_tokens), total_seqs=float(len(batch)))
    out, _ = microbatch_loss(model, batch, cfg, temperature=0.7, reference=reference, **totals)
    return float(out.loss.detach())


def direct_loss(setup, cfg: LossConfig) -> float:
    """The loss from learner/loss.py's ``policy_loss`` called on the model's own log-probs."""
    model, batch, reference = setup
    kw = dict(temperature=0.7, token_mask=batch.response_mask)
    logp, entropy = model_logprobs(
        model, batch.input_ids, batch.attention_mask, with_entropy=True, **kw
    )
    ref, _ = model_logprobs(reference, batch.input_ids, batch.attention_mask, **kw)
    totals = dict(total_tokens=float(batch.num_tokens), total_seqs=float(len(batch)))
    args = (logp, batch.old_logprobs, batch.advantages, batch.response_mask, cfg)
    out = policy_loss(*args, ref_logprobs=ref, entropy=entropy, **totals)
    return float(out.loss.detach())


# (the key's non-default setting, the base it is set on): one key per case
LOSS_CASES = [
    ({"clip_low": 0.4}, {}),
    ({"clip_high": 0.5}, {}),
    ({"clip_ratio_c": 2.0}, {}),  # negative advantages at ratio e^2.5 = 12.2: capped at 2, not 3
    ({"clip_ratio_c": None}, {}),
    ({"clip_mode": "dynamic"}, {}),
    ({"clip_ratio_max": 1.5}, {"clip_mode": "dynamic"}),  # rare tokens' upper bound: 1.5, not 10
    ({"aggregation": "seq-mean-token-mean"}, {}),  # responses of 2 to 5 tokens
    ({"aggregation": "seq-mean-token-sum-norm"}, {"norm_len": 8}),
    ({"norm_len": 16}, {"aggregation": "seq-mean-token-sum-norm", "norm_len": 8}),  # null: an error
    ({"kl_coef": 0.5}, {}),
    ({"entropy_coef": 0.5}, {}),
]


@pytest.mark.parametrize(
    "settings, base",
    LOSS_CASES,
    ids=[",".join(f"{k}={v}" for k, v in c[0].items()) for c in LOSS_CASES],
)
def test_each_loss_key_reaches_the_loss(loss_setup, settings, base):
    cfg, default = LossConfig(**base | settings), LossConfig(**base)
    got = loss_of(loss_setup, cfg)
    assert got == pytest.approx(direct_loss(loss_setup, cfg), rel=1e-6)
    assert got != pytest.approx(loss_of(loss_setup, default), rel=1e-4), "the key changed nothing"


# ---- the split over ranks and the update's metrics ---------------------------------------------


@pytest.fixture(scope="module")
def batch16():
    _, batch = train_batch(random_lm("Llama", 1, 16, 32, 2, 2, 50), n_groups=4, n=4)
    return batch  # 16 samples, 4 groups of 4


def shape_of(batch, tokens: int | None = 10**6, **settings) -> dict:
    """What split_for_ranks makes of ``batch``: ranks, mini-batches, rank 0's micro-batches
    (their rows), logits pieces. ``tokens``: the micro-batch token budget (None: by
    ``micro_batch_size``)."""
    cfg = learner(**{"num_ranks": 2, "mini_batch_size": None} | settings)
    per_rank, totals, plans = split_for_ranks(batch, cfg, tokens)
    return dict(
        ranks=len(per_rank),
        minibatches=len(totals),
        micro=[[len(m.rows) for m in plan] for plan in plans[0]],
        chunks=[[m.chunks for m in plan] for plan in plans[0]],
    )


def test_each_key_reaches_the_split_over_ranks(batch16):
    base = shape_of(batch16)
    # one mini-batch of 8 per rank in one micro-batch, its logits in one piece
    assert base == dict(ranks=2, minibatches=1, micro=[[8]], chunks=[[1]])
    assert shape_of(batch16, num_ranks=4)["ranks"] == 4
    assert shape_of(batch16, mini_batch_size=8)["minibatches"] == 2  # 16 / 8
    assert shape_of(batch16, None, micro_batch_size=2)["micro"] == [[2, 2, 2, 2]]
    # pieces of at most 4 scored positions: more than one piece for 8 responses of 2-5 tokens
    assert shape_of(batch16, logits_chunk_tokens=4)["chunks"][0][0] > 1


def rank_sums(norms: list[float]) -> dict:
    """One rank's sums (learner/update.py RankMetrics): 120 response tokens, grad ``norms``."""
    sums = RankMetrics(tokens=120.0, optimizer_steps=len(norms), grad_norms=norms, lr=1e-3)
    return dataclasses.asdict(sums)


@pytest.mark.parametrize(
    "key, value, metric, want, default",
    [
        # grad norms 0.7 and 2.0: 1 of 2 over 1.0 (default), both over 0.5
        ("grad_clip", 0.5, "actor/grad_clip_frac", 1.0, 0.5),
        # 120 response tokens over every epoch: 40 per epoch in 3
        ("ppo_epochs", 3, "perf/learner_tokens", 40.0, 120.0),
    ],
)
def test_each_key_reaches_the_update_metrics(key, value, metric, want, default):
    ranks = [rank_sums([0.7, 2.0])]
    assert summarize_ranks(ranks, learner(**{key: value}))[metric] == want
    assert summarize_ranks(ranks, LearnerConfig())[metric] == default
