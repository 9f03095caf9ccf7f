#!/usr/bin/env bash
# The two SmolLM2 runs of docs/RESULTS.md (GRPO, then AVSPO), one after the other, each resuming
# from its latest checkpoint if a previous invocation was cut off. Run from the repository root:
#   nohup tests/benchmarks/smollm2_runs.sh > runs/smollm2_runs.log 2>&1 &
# Then: .venv/bin/python -m launch.analyze runs/smol_grpo runs/smol_avspo
set -euo pipefail
# Its own Ray instance kills its workers only at 99% node memory (Ray's default is 95%): a test
# suite run beside it (a Ray instance of its own, default threshold) gives way first. Seen: a
# 2-rank learner test beside it got this run's learner rank OOM-killed at 95%.
export RAY_memory_usage_threshold=${RAY_memory_usage_threshold:-0.99}
STEPS=${STEPS:-40}
PY=${PY:-.venv/bin/python}
for algo in grpo avspo_fast; do
  run_dir=runs/smol_${algo%_fast}
  if [ -f "$run_dir/DONE" ]; then echo "$run_dir done already"; continue; fi
  "$PY" -m launch.train experiment=smollm2_cpu algorithm=$algo trainer.total_steps=$STEPS \
    trainer.save_every=10 trainer.resume=auto trainer.run_dir=$run_dir
  touch "$run_dir/DONE"
done
