"""What an engine's numeric precision needs from its process's environment, set before vLLM
starts (rollout/worker.py ``make_engine``; Triton reads it when it compiles a kernel, and vLLM's
engine processes inherit it). Imports nothing heavy: a test calls it without vLLM.

fp32: vLLM's fp32 attention is its Triton backend (FlashAttention takes 16-bit types only), whose
``tl.dot`` multiplies fp32 inputs in TF32 (10-bit mantissas) unless told otherwise;
``TRITON_F32_DEFAULT=ieee`` makes it full fp32, as the learner's fp32 forward is (the gap of an
fp32 engine to an fp32 learner is a defect test: tests/gpu/vllm_logprob_items.py
``engine_gap_fp32``). bf16 and fp16 take FlashAttention on a GPU: nothing to set.
"""

from __future__ import annotations

FP32_ENV = {"TRITON_F32_DEFAULT": "ieee"}


def precision_env(dtype: str) -> dict[str, str]:
    """The variables an engine of ``dtype`` needs (a value the user already set stays: the
    caller sets only those missing).

    >>> precision_env("float32")
    {'TRITON_F32_DEFAULT': 'ieee'}
    >>> precision_env("bfloat16")
    {}
    """
    return dict(FP32_ENV) if dtype == "float32" else {}
