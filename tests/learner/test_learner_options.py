"""The learner's memory and precision options: presets, value checks, dtype and DeepSpeed
config (learner/config.py, learner/policy.py, conf/learner/)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from launch.validation import ConfigError, to_train_config
from learner.config import LearnerConfig
from learner.policy import deepspeed_config, learner_dtype

CONF = Path(__file__).resolve().parents[2] / "conf"


def load(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))


def test_learner_presets_are_pinned_differences_from_the_schema():
    base = asdict(LearnerConfig())
    for name, differs in (("zero2", {}), ("zero3", {"zero_stage": 3})):
        got = asdict(load(f"learner={name}").learner)
        assert {k: v for k, v in got.items() if v != base[k]} == differs, name
    assert "- zero2" in (CONF / "learner" / "zero3.yaml").read_text()  # built on zero2


def test_the_new_keys_defaults_and_overrides():
    cfg = load().learner
    assert (cfg.logits, cfg.logits_chunk_tokens, cfg.micro_batch_tokens) == ("chunked", 2048, None)
    assert (cfg.gradient_checkpointing, cfg.attn_implementation, cfg.dtype) == (False, None, None)
    cfg = load(
        "learner.logits=full",
        "learner.micro_batch_tokens=8192",
        "learner.gradient_checkpointing=true",
        "learner.attn_implementation=sdpa",
        "learner.dtype=bfloat16",
    ).learner
    assert (cfg.logits, cfg.micro_batch_tokens, cfg.gradient_checkpointing) == ("full", 8192, True)
    assert (cfg.attn_implementation, cfg.dtype) == ("sdpa", "bfloat16")


@pytest.mark.parametrize(
    "override, message",
    [
        ("learner.logits=sparse", "learner.logits: 'sparse' is not one of"),
        ("learner.micro_batch_tokens=0", "learner.micro_batch_tokens: must be >= 1"),
        ("learner.logits_chunk_tokens=0", "learner.logits_chunk_tokens: must be >= 1"),
        ("learner.attn_implementation=flash", "learner.attn_implementation: 'flash' is not one"),
        ("learner.dtype=float16", "learner.dtype: 'float16' is not one of"),
    ],
)
def test_bad_values_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load(override)


def test_learner_dtype_follows_the_model_unless_set_and_refuses_float16():
    assert learner_dtype(LearnerConfig(), "float32") == "float32"  # the CPU default
    assert learner_dtype(LearnerConfig(), "bfloat16") == "bfloat16"  # e.g. the Qwen presets
    assert learner_dtype(LearnerConfig(dtype="float32"), "bfloat16") == "float32"
    with pytest.raises(ValueError, match="cannot train in float16"):
        learner_dtype(LearnerConfig(), "float16")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_bf16_section_is_coherent(stage):
    """bf16: DeepSpeed's bf16 mode, with fp32 gradient accumulation where DeepSpeed allows it
    (ZeRO 1-3; ZeRO-0 refuses a bf16 model with fp32 accumulation). fp32: neither."""
    bf16 = deepspeed_config(LearnerConfig(zero_stage=stage), "bfloat16")
    assert bf16["bf16"] == {"enabled": True} and bf16["zero_optimization"] == {"stage": stage}
    assert bf16.get("data_types") == (None if stage == 0 else {"grad_accum_dtype": "fp32"})
    fp32 = deepspeed_config(LearnerConfig(zero_stage=stage), "float32")
    assert fp32["bf16"] == {"enabled": False} and "data_types" not in fp32
    assert fp32["managed_gradient_accumulation"] is False  # step() is our boundary
