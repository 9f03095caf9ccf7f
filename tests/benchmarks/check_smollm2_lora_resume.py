"""Check (not in CI: two SmolLM2 launches, ~3 min on 2 cores): ``experiment=smollm2_cpu`` with
LoRA adapters trains 3 steps saving a checkpoint each step, and a new run continued from the
step-1 checkpoint gives steps 2 and 3 exactly (every metric but wall-clock ones). The tiny-model
LoRA resume is in CI (tests/e2e/test_one_step.py).

    .venv/bin/python tests/benchmarks/check_smollm2_lora_resume.py     # prints PASS or FAIL
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "experiment=smollm2_cpu", "trainer.total_steps=3", "trainer.prompts_per_step=4",
    "rollout.n_samples=4", "task.num_test=8", "trainer.eval_every=0", "trainer.eval_pass_k=0",
    "trainer.save_every=1", "logger.report=false", "learner.lora.rank=16",
    "learner.lora.alpha=32", "learner.lr=1e-4",
]  # fmt: skip


def train(run_dir: Path, *extra: str) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "launch.train", f"trainer.run_dir={run_dir}",
           f"hydra.run.dir={run_dir}/hydra", *RUN, *extra]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"FAIL: {run_dir.name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    print(f"{run_dir.name}: {time.monotonic() - t0:.0f} s")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="smollm2-lora-resume-"))
    whole = train(work / "whole")
    ckpt = work / "whole" / "checkpoints" / "step_000001"
    resumed = train(work / "resumed", f"trainer.resume={ckpt}")
    wall = ("timing_s/", "perf/")
    bad = []
    for step in (2, 3):
        a = {k: v for k, v in whole[step].items() if not k.startswith(wall)}
        b = {k: v for k, v in resumed[step].items() if not k.startswith(wall)}
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        print(f"step {step}: {len(a)} values, {len(differ)} differ {differ[:5]}")
        bad += differ
    print("PASS" if not bad else "FAIL")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
