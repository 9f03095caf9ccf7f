#!/usr/bin/env bash
# Part B-lite (tests/gpu/README.md): vLLM on a bare GPU machine from the pack of
# tests/gpu/pack_vllm.py, with Part C's wheels (tests/gpu/pack_wheels.py: Ray, DeepSpeed,
# Hydra), in two device calls back to back on one warm machine: no call may carry more than
# 64 MiB with the repository, and what a call leaves in /tmp lasts only while the machine stays
# warm (~30 s after a call). Both calls run this script:
#
#   bash tests/gpu/run_part_b_lite.sh keep   # call 1, carrying vllm_pack.zip.part01 and the
#                                            # manifest: keeps the part in $VP, says what is missing
#   bash tests/gpu/run_part_b_lite.sh        # call 2, carrying part02, the manifest and
#                                            # tests/gpu/wheels: install, smoke, Part B
#   ITEMS=resume bash tests/gpu/run_part_b_lite.sh   # a rerun on the still-warm machine: the
#                                            # installs are skipped, the parts named run
#
# Call 2 within BUDGET_S (default 420 s: 7 minutes, under the device tool's 600 s a call): the
# pack's install <= INSTALL_S (90 s), the wheels' <= WHEELS_S (45 s), the smoke <= SMOKE_S (45 s:
# tests/gpu/vllm_smoke.py; Part B runs even if it fails), each skipped once it passed on this
# machine, then tests/gpu/check_gpu.py with what is left less 15 s as
# its --timeout, which its parts share (bf16, fp32, resume: each stopped at its share with a FAIL
# line). Logs go to $OUT (the device tool's folder that comes back), a summary to stdout; exit
# status 1 if a step fails, 3 if the pack is incomplete on call 2 (call 1 went to another
# machine: run both again).
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PACK=${PACK:-tests/gpu/vllm_pack}   # what this call carried of the pack
WHEELS=${WHEELS:-tests/gpu/wheels}  # call 2 carries them
VP=${VP:-/tmp/vp}              # the pack's parts, gathered over the calls
VSITE=${VSITE:-/tmp/vllm_site} # vLLM installed from the pack
SITE=${SITE:-/tmp/site}        # Ray, DeepSpeed, Hydra installed from tests/gpu/wheels
BUDGET_S=${BUDGET_S:-420}
ITEMS=${ITEMS:-bf16,fp32,resume}
MODEL=${MODEL:-tiny}
OUT=${OUT:-/tmp/part_b_lite/out}  # the device tool gives each call an empty $OUT
STATE=${STATE:-/tmp/part_b_lite}  # what is done on this machine (kept while it stays warm)
mkdir -p "$VP" "$OUT" "$STATE"
started=$(date +%s)
since() { echo $(($(date +%s) - started)); }

cp "$PACK"/* "$VP"/ 2>/dev/null  # whichever parts this call carried
"$PY" tests/gpu/pack_vllm.py --check "$VP"
complete=$?
if [ "${1:-}" = keep ]; then
  echo "call 1: $(ls "$VP" | grep -c '\.part') part(s) kept in $VP after $(since) s; call 2 next"
  exit 0
fi
if [ "$complete" -ne 0 ]; then
  echo "FAIL pack incomplete in $VP: call 1's part is not on this machine (another machine, or"
  echo "it went cold): run both calls again, the second within 30 s of the first"
  exit 3
fi

step() {  # name, limit (s), command...: skipped when done before on this machine
  local name=$1 limit=$2
  shift 2
  if [ -e "$STATE/$name.done" ]; then
    echo "$name: done before, skipped"
    return 0
  fi
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local code=$?
  tail -n 2 "$OUT/$name.log"
  echo "$name: exit $code after $(since) s"
  [ "$code" -eq 0 ] && touch "$STATE/$name.done"
  return $code
}
step install_vllm "${INSTALL_S:-90}" "$PY" tests/gpu/pack_vllm.py --install "$VP" \
  --target "$VSITE" || exit 1
step install_wheels "${WHEELS_S:-45}" "$PY" -m pip install -q --no-index --no-deps \
  --target "$SITE" "$WHEELS"/*.whl || exit 1
export PYTHONPATH="$VSITE:$SITE${PYTHONPATH:+:$PYTHONPATH}"
step smoke "${SMOKE_S:-45}" "$PY" tests/gpu/pack_vllm.py --smoke  # Part B runs either way
smoke=$?

left=$((BUDGET_S - $(since) - 15))
if [ "$left" -lt 60 ]; then
  echo "FAIL budget: ${left} s left for Part B (BUDGET_S=$BUDGET_S)"
  exit 1
fi
timeout -k 10 $((left + 10)) "$PY" tests/gpu/check_gpu.py --model "$MODEL" --items "$ITEMS" \
  --timeout "$left" > "$OUT/check_gpu.log" 2>&1
code=$?
grep -E "^(PASS|FAIL|GPU:)" "$OUT/check_gpu.log" | cut -c 1-400
echo "Part B: exit $code after $(since) s (its parts: $ITEMS, $left s); smoke: exit $smoke"
[ "$code" -ne 0 ] && exit "$code"
[ "$smoke" -ne 0 ] && exit 1
exit 0
