"""How a learner rank builds its policy: dtype, transformers model, DeepSpeed config.

Precision: the learner computes in ``learner.dtype`` (null = ``model.dtype``, float32 on the CPU
default). ``bfloat16`` loads the weights in bf16 and turns on DeepSpeed's bf16 mode, in which the
ZeRO optimizer keeps fp32 master weights and Adam state; gradients accumulate over micro-batches
in fp32 (``data_types.grad_accum_dtype``) under ZeRO 1-3 (ZeRO-0 accepts only bf16
accumulation). float16 is refused: it needs loss scaling, which this learner does not configure.

>>> cfg = deepspeed_config(LearnerConfig(zero_stage=3), "bfloat16")
>>> cfg["bf16"], cfg["data_types"], cfg["zero_optimization"]
({'enabled': True}, {'grad_accum_dtype': 'fp32'}, {'stage': 3})
>>> "data_types" in deepspeed_config(LearnerConfig(), "float32")
False
"""

from __future__ import annotations

import torch

from learner.config import LearnerConfig

DTYPES = ("float32", "bfloat16")


def learner_dtype(cfg: LearnerConfig, model_dtype: str) -> str:
    """``learner.dtype``, else the model's; a dtype the learner cannot train in is an error.

    >>> learner_dtype(LearnerConfig(), "bfloat16")  # null: the model's
    'bfloat16'
    >>> learner_dtype(LearnerConfig(dtype="float32"), "bfloat16")
    'float32'
    """
    dtype = cfg.dtype or model_dtype
    if dtype not in DTYPES:
        raise ValueError(
            f"the learner cannot train in {dtype} (model.dtype): set learner.dtype to one of "
            f"{list(DTYPES)} (float16 needs loss scaling, which the learner does not configure)"
        )
    return dtype


def deepspeed_config(cfg: LearnerConfig, dtype: str) -> dict:
    """The DeepSpeed config of a rank (``step()`` is the accumulation boundary we choose)."""
    bf16 = dtype == "bfloat16"
    config = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size or 1,  # bookkeeping only
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # step() is the boundary we choose
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
    }
    if bf16 and cfg.zero_stage >= 1:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def make_optimizer(params, cfg: LearnerConfig):
    """AdamW over ``params`` with ``learner.lr``, ``betas``, ``adam_eps`` and ``weight_decay``,
    and its schedule: linear warm-up over ``learner.warmup_steps`` optimizer steps, then
    constant. Returns ``(optimizer, scheduler)``.

    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> _, schedule = make_optimizer([w], LearnerConfig(lr=1e-3, warmup_steps=4))
    >>> schedule.get_last_lr()  # step 0: 1/4 of the rate
    [0.00025]
    """
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    warmup = cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )
    return optimizer, scheduler


def load_policy(model_path: str, cfg: LearnerConfig, dtype: str, *, trainable: bool = True):
    """The transformers causal LM in ``dtype`` with ``learner.attn_implementation``; a trainable
    one gets ``learner.gradient_checkpointing`` (non-reentrant; in ``train()`` mode, the only
    mode in which transformers checkpoints) and, with ``learner.lora.rank`` > 0, adapters."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": getattr(torch, dtype)}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    if trainable and cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    if trainable and cfg.lora.rank > 0:
        from learner.lora import wrap

        model = wrap(model, cfg.lora)
    return model


def available_ram_bytes() -> float:
    """The node's available RAM (``MemAvailable`` of /proc/meminfo, given in kB)."""
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return float(fields["MemAvailable"].split()[0]) * 1024


ACTIVATION_BYTES_PER_TOKEN_LAYER = 34  # x hidden size, 16-bit (Korthikanti et al. 2022)


def auto_micro_batch_tokens(
    model_config, dtype: str, free_bytes: float, fraction: float, sharing: int = 1
) -> int:
    """A micro-batch token budget that fits ``fraction`` of ``free_bytes`` (shared by ``sharing``
    ranks): activations ~ 34 x hidden x layers bytes per token in 16-bit, twice that in fp32
    (Korthikanti et al. 2022, attention scores excluded: sdpa/flash keep none). Clamped to
    [256, 65536] tokens.

    >>> from types import SimpleNamespace
    >>> tiny = SimpleNamespace(hidden_size=256, num_hidden_layers=4)
    >>> auto_micro_batch_tokens(tiny, "float32", 18e9, 0.25, sharing=2)  # 2.25 GB / 69,632 B
    32312
    """
    text = getattr(model_config, "get_text_config", lambda: model_config)()
    elem = 4 if dtype == "float32" else 2
    per_token = ACTIVATION_BYTES_PER_TOKEN_LAYER * text.hidden_size * text.num_hidden_layers
    per_token = per_token * elem / 2
    tokens = int(free_bytes * fraction / max(sharing, 1) / per_token)
    return max(256, min(65536, tokens))


def skip_shm_all_reduce() -> None:
    """Keep DeepSpeed from loading its CPU shared-memory all-reduce op at
    ``init_distributed``: the op serves only ``inference_all_reduce`` (tensor-parallel
    inference), while a training all-reduce goes through torch.distributed (gloo here) either
    way. Loading it cost a JIT build on a machine's first start (~35 s, and a lock that a rank
    killed mid-build left behind for every later run to wait on) and /dev/shm buffers that a
    killed rank left behind. DeepSpeed reads which ops it may load from
    ``deepspeed.ops.__compatible_ops__``, a dict it probes once and keeps so that edits stay."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {
        **deepspeed.ops.__compatible_ops__,
        "deepspeed_shm_comm": False,
    }
