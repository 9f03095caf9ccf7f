#!/usr/bin/env bash
# The two SmolLM2 runs of docs/RESULTS.md (GRPO, then AVSPO), one after the other, each resuming
# from its latest checkpoint if a previous session was cut off. Run from the repository root:
#   nohup tests/benchmarks/smollm2_runs.sh > runs/smollm2_runs.log 2>&1 &
# Then: .venv/bin/python -m launch.analyze runs/smol_grpo runs/smol_avspo
set -euo pipefail
STEPS=${STEPS:-40}
PY=${PY:-.venv/bin/python}
for algo in grpo avspo_fast; do
  run_dir=runs/smol_${algo%_fast}
  if [ -f "$run_dir/DONE" ]; then echo "$run_dir done already"; continue; fi
  "$PY" -m launch.train experiment=smollm2_cpu algorithm=$algo trainer.total_steps=$STEPS \
    trainer.save_every=10 trainer.resume=auto trainer.run_dir=$run_dir
  touch "$run_dir/DONE"
done
