#!/usr/bin/env bash
# GPU checks, Parts A and C in one device call on a bare PyTorch machine (tests/gpu/README.md,
# "Parts A and C, Part B"): installs tests/gpu/wheels (made here by tests/gpu/pack_wheels.py)
# into a folder of its own, then runs Part A (check_learner_gpu.py) and Part C
# (check_train_gpu.py). Neither part stops the other; the figures and logs go to $OUT, a summary
# to stdout; exit 1 if either fails.
#
#   OUT=/somewhere bash tests/gpu/run_gpu_checks.sh
#
# Budget, within the device tool's 590 s a call: install <= 60 s (+5 s to kill), Part A <= 260 s
# and Part C <= 190 s (their own global timeouts; +10 s each to kill): 535 s at most. The H200
# took 132-154 s for Part A's first three children; the fp32 one adds ~40 s (an estimate).
# For a rehearsal elsewhere: DEVICE=cpu, PYTHON=<interpreter>, WHEELS=<pack for its Python>,
# and the parts' own timeouts PART_A_S, PART_C_S (seconds).
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
WHEELS=${WHEELS:-tests/gpu/wheels}
SITE=${SITE:-/tmp/site}
PART_A_S=${PART_A_S:-260}
PART_C_S=${PART_C_S:-190}
OUT=${OUT:?set OUT to the folder for the figures and logs}
mkdir -p "$OUT"
started=$(date +%s)
since() { echo "$(($(date +%s) - started)) s"; }

{
  uname -m
  "$PY" -VV
  "$PY" -m pip --version
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # lzma: the pack's Ray programs are LZMA-compressed in their wheel (pack_wheels.py)
  "$PY" -c "import lzma, torch, transformers; print('lzma ok; torch', torch.__version__,
'cuda', torch.cuda.is_available(), '; transformers', transformers.__version__)"
  echo "wheels: $(ls "$WHEELS"/*.whl | wc -l) files, $(du -sm "$WHEELS" | cut -f1) MiB"
} > "$OUT/setup.log" 2>&1
tail -n 3 "$OUT/setup.log"

timeout -k 5 60 "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl \
  >> "$OUT/setup.log" 2>&1
echo "install: exit $? after $(since)"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import ray, deepspeed, hydra; print('imports: ray', ray.__version__, 'deepspeed',
deepspeed.__version__, 'hydra', hydra.__version__)" 2>&1 | tail -n 1

part() {  # name, script, its own global timeout (the outer limit 10 s more)
  timeout -k 10 $(($3 + 10)) "$PY" "tests/gpu/$2" --device "$DEVICE" --timeout "$3" \
    --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  local code=$?
  grep -E "^(PASS|FAIL)" "$OUT/$1.log" | cut -c 1-400
  echo "$1: exit $code after $(since)"
  return $code
}
part learner_gpu check_learner_gpu.py "$PART_A_S"
a=$?
part train_gpu check_train_gpu.py "$PART_C_S"
c=$?
echo "done: Part A exit $a, Part C exit $c, $(since) in all"
[ "$a" -eq 0 ] && [ "$c" -eq 0 ]
