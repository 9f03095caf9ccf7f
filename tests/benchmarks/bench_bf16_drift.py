"""Benchmark: how far a bf16 learner's weights move against an fp32 one's (issue 46 item 2).

    .venv/bin/python tests/benchmarks/bench_bf16_drift.py [--updates 5] [--lr 5e-6] [overrides]

Why bf16 SmolLM2 learned nothing in E7 (docs/RESULTS.md), and what dithered masters change:
the learner of ``experiment=smollm2_cpu`` (2 DeepSpeed ranks, its ZeRO stage, micro-batches of
16) takes ``--updates`` updates on one step's batch (bench_learner_flops.py ``step_batch``: the
task's prompts as the engines see them, random responses, advantages N(0, 1); old log-probs
recomputed, no importance cap) in float32, in bfloat16 with DeepSpeed's masters on the bf16
grid (``learner.bf16_masters=grid``) and in bfloat16 with dithered masters (``dither``,
learner/bf16_masters.py). Each run's change of the exported weights, dw (float64), is compared:

- the share of weights that changed at all, mean |dw| and the norm of dw;
- bf16's dw against fp32's: the cosine, the norm ratio and their product, the share of fp32's
  step that bf16's weights moved along it.

On the grid a weight moves only once its master has drifted half a bf16 spacing (2^-9 to 2^-8
of its magnitude): Adam moves a weight up to ~lr a step, so at lr 5e-6 most weights stay put
for tens of updates; dithered masters start at uniform places inside their rounding cells, and
weights flip in proportion to their drift from the first update. Last line: ``bf16 dithered
moved F of fp32's step along it (cos C, norm ratio R); P% of its weights changed, fp32 Q%``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def drift(cfg, path: str, dtype: str, updates: int, batch, **learner) -> torch.Tensor:
    """The change of the exported weights (tests/helpers.py ``weight_change``) of the preset's
    learner with old log-probs recomputed, no importance cap, and ``learner`` set."""
    from dataclasses import replace

    from tests.helpers import weight_change

    lcfg = replace(cfg.learner, old_logprobs="recompute", tis_cap=None, **learner)
    return weight_change(lcfg, cfg.algorithm.loss, path, dtype, batch, updates)


def main() -> None:
    import ray

    from launch.models.bootstrap import ensure_model
    from tests.benchmarks.bench_learner_flops import step_batch
    from tests.helpers import load

    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--lr", type=float, default=5e-6, help="the preset's")
    parser.add_argument("overrides", nargs="*", help="config overrides")
    args = parser.parse_args()
    cfg = load("experiment=smollm2_cpu", f"learner.lr={args.lr}", *args.overrides)
    path = ensure_model(cfg.model, log=lambda *_: None)
    batch = step_batch(cfg, path)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    runs = {
        "float32": drift(cfg, path, "float32", args.updates, batch),
        "bfloat16 grid": drift(cfg, path, "bfloat16", args.updates, batch, bf16_masters="grid"),
        "bfloat16": drift(cfg, path, "bfloat16", args.updates, batch, bf16_masters="dither"),
    }  # fmt: skip
    ref = runs["float32"]
    for name, d in runs.items():
        print(f"{name:15s} changed {float((d != 0).float().mean()):.2%} of weights, "
              f"mean |dw| {float(d.abs().mean()):.3e}, |dw| {float(d.norm()):.4f}")  # fmt: skip
    for name in ("bfloat16 grid", "bfloat16"):
        d = runs[name]
        cos, ratio = float(d @ ref / (d.norm() * ref.norm())), float(d.norm() / ref.norm())
        label = "bf16 dithered" if name == "bfloat16" else "bf16 on the grid"
        print(f"{label} moved {cos * ratio:.3f} of fp32's step along it (cos {cos:.3f}, norm "
              f"ratio {ratio:.3f}); {float((d != 0).float().mean()):.1%} of its weights "
              f"changed, fp32 {float((ref != 0).float().mean()):.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
