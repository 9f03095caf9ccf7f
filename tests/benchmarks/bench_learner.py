"""Benchmark: learner update throughput (response tokens/s) for 1 vs 2 ranks, ZeRO 1/2/3, on
the embedded tiny model and on a ~100M-parameter Llama built from a config (no download), with
the peak RSS of a rank.

    make bench      # or: .venv/bin/python tests/benchmarks/bench_learner.py [--skip-100m]

Each configuration: one warm-up update, then the median of 3 updates on the same batch (64
samples of 8-24 tokens, micro-batch 16).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def batch_for(vocab: int, samples: int = 64, seed: int = 0):
    from learner.batch import build_batch
    from rollout.types import Group, Sample

    rng = random.Random(seed)
    groups = []
    for _ in range(samples // 8):
        prompt = [1] + [rng.randint(4, vocab - 1) for _ in range(rng.randint(4, 12))]
        groups.append(
            Group(
                "",
                prompt,
                [
                    Sample(
                        [rng.randint(4, vocab - 1) for _ in range(rng.randint(4, 12))] + [2],
                        [],
                        "",
                        "stop",
                        0,
                    )
                    for _ in range(8)
                ],
            )
        )
    for g in groups:
        for s in g.samples:
            s.logprobs = [-1.0] * len(s.response_ids)
    return build_batch(groups, torch.randn(samples), pad_id=0)


def model_100m(folder: str) -> str:
    from tests.helpers import random_lm

    model = random_lm(
        "Llama", 12, 768, 2048, 12, 12, 8192, max_position_embeddings=256, tie_word_embeddings=True
    )
    model.save_pretrained(folder)
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M"


class Probe:
    def rss_mb(self) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    import ray

    from launch.models.bootstrap import ModelConfig, ensure_model
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-100m", action="store_true")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    models = [("tiny 3.4M", ensure_model(ModelConfig()), 32)]
    tmp = tempfile.mkdtemp()
    if not args.skip_100m:
        size = model_100m(tmp)
        models.append((f"llama {size}", tmp, 8192))
    header = ("model", "ranks", "zero", "tokens/s", "s/update", "rank RSS MB")
    print(" ".join(f"{h:>12}" for h in header))
    for name, path, vocab in models:
        batch = batch_for(vocab)
        for ranks, stage in ((1, 1), (1, 2), (2, 1), (2, 2), (2, 3)):
            cfg = LearnerConfig(
                num_ranks=ranks, zero_stage=stage, micro_batch_size=16, timeout_s=1800
            )
            group = LearnerGroup(cfg, LossConfig(), path)
            try:
                group.train_on(batch)  # warm-up
                secs = statistics.median(group.train_on(batch)["timing_s/update"] for _ in range(3))
                rss = max(
                    ray.get(
                        [r.__ray_call__.remote(lambda self: Probe().rss_mb()) for r in group.ranks]
                    )
                )
            finally:
                group.shutdown()
            row = (
                name,
                ranks,
                stage,
                f"{batch.num_tokens / secs:.0f}",
                f"{secs:.3f}",
                f"{rss:.0f}",
            )
            print(" ".join(f"{v:>12}" for v in row))
    ray.shutdown()


if __name__ == "__main__":
    main()
