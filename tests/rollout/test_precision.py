"""An fp32 vLLM engine runs Triton's dots in full fp32 (issue 62): vLLM's fp32 attention is its
Triton backend, where ``tl.dot`` defaults to TF32; the worker sets ``TRITON_F32_DEFAULT=ieee``
before vLLM starts, for fp32 only, and the engine's description names the attention backend
vLLM chose (read from the model's layers)."""

from __future__ import annotations

import os

import pytest
import torch

from rollout import vllm_engine
from rollout.collective import attention_backends
from rollout.config import RolloutConfig
from rollout.worker import make_engine


@pytest.mark.parametrize(
    "dtype, before, want",
    [("float32", None, "ieee"), ("bfloat16", None, None), ("float32", "tf32", "tf32")],
)
def test_the_worker_sets_full_precision_dots_for_fp32_engines_before_vllm_starts(
    monkeypatch, dtype, before, want
):
    """What the environment holds when the engine is built (vLLM's engine processes inherit it);
    a value the user set stays."""
    if before is None:
        monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    else:
        monkeypatch.setenv("TRITON_F32_DEFAULT", before)
    seen = {}

    class Engine:  # stands in for VLLMEngine: what matters is the environment it starts in
        def __init__(self, *args, **kwargs):
            seen["env"] = os.environ.get("TRITON_F32_DEFAULT")

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Engine)
    make_engine(RolloutConfig(engine="vllm"), "unused", dtype)
    assert seen["env"] == want


def test_the_hf_engine_leaves_the_environment_alone(monkeypatch, tiny_model_dir):
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    make_engine(RolloutConfig(engine="hf"), tiny_model_dir, "float32")
    assert "TRITON_F32_DEFAULT" not in os.environ


def test_the_attention_backends_are_read_from_the_models_layers():
    class Backend:
        def __init__(self, name):
            self.name = name

        def get_name(self):
            return self.name

    class Attention(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.attn_backend = Backend(name)

    model = torch.nn.Sequential(
        Attention("TRITON_ATTN"), torch.nn.Linear(2, 2), Attention("TRITON_ATTN"),
        torch.nn.Sequential(Attention("FLEX_ATTENTION")),
    )  # fmt: skip
    assert attention_backends(model) == ["FLEX_ATTENTION", "TRITON_ATTN"]
    assert attention_backends(torch.nn.Linear(2, 2)) == []
