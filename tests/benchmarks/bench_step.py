"""Benchmark: wall time of one training step of the embedded default, split into generation,
verification, the advantage stage, learner update, weight sync and the rest (orchestration:
the driver's own work, Ray calls, batch building), per rollout engine.

    make bench   # or: .venv/bin/python tests/benchmarks/bench_step.py [--steps 20] [--engines hf]

Runs ``python -m launch.train`` (the default config: 64 prompts x 8 samples, AVSPO, 2 ZeRO-2
ranks) with evaluation, checkpoints and the report off, and reads ``timing_s/*`` from its
metrics.jsonl. Step 1 (first calls, lazy initialisation) is left out; figures are medians over
the remaining steps, and shares are of the median step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("generate", "verify", "advantage", "learner", "weight_sync", "other")


def run(engine: str, steps: int, extra: list[str]) -> tuple[list[dict], float]:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"rollout={engine}",
            f"trainer.total_steps={steps}",
            "trainer.eval_every=0",
            "trainer.eval_pass_k=0",
            "trainer.save_every=0",
            "logger.report=false",
            f"trainer.run_dir={tmp}/run",
            f"hydra.run.dir={tmp}/hydra",
            *extra,
        ]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "launch.train", *overrides], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        wall = time.perf_counter() - t0
        lines = (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if json.loads(x)["step"] > 1], wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--engines", nargs="+", default=["vllm", "hf"])
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = ap.parse_args()
    print(f"{'engine':<6} {'step s':>7} " + " ".join(f"{p:>18}" for p in PARTS) + "  process s")
    for engine in args.engines:
        rows, wall = run(engine, args.steps, args.overrides)
        step = statistics.median(r["timing_s/step"] for r in rows)
        cells = []
        for p in PARTS:
            t = statistics.median(r[f"timing_s/{p}"] for r in rows)
            cells.append(f"{t:7.3f} ({100 * t / step:4.1f}%)")
        print(f"{engine:<6} {step:7.3f} " + " ".join(f"{c:>18}" for c in cells) + f"  {wall:8.1f}")
    print("(median of steps 2..N; 'other' = step - the five stages: the driver's orchestration)")


if __name__ == "__main__":
    main()
