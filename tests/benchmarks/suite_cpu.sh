#!/usr/bin/env bash
# The CPU a pytest run costs, every process it starts included: Ray's actors too, which
# /usr/bin/time and getrusage miss (the raylet's workers are reaped by nothing that reports to
# pytest: a Ray test file read 17.6 core-s there, 187 here). The run goes in a cgroup of its own
# (cgroup v2's cpu.stat, or v1's cpuacct); needs root, as the tests' docker image and CI have.
#   tests/benchmarks/suite_cpu.sh tests/learner/test_learner_ray.py [more pytest arguments]
# prints: core-s, wall s, and their ratio (the cores it kept busy on average).
set -euo pipefail
cd "$(dirname "$0")/../.."
name="avspo-suite-cpu-$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2
  cg=/sys/fs/cgroup/$name
  usage() { awk '$1 == "usage_usec" { printf "%.1f", $2 / 1e6 }' "$cg/cpu.stat"; }
else  # v1
  cg=/sys/fs/cgroup/cpuacct/$name
  usage() { awk '{ printf "%.1f", $1 / 1e9 }' "$cg/cpuacct.usage"; }
fi
mkdir "$cg"
start=$(date +%s.%N)
rc=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"' \
  _ "$cg" "$@" || rc=$?
for _ in $(seq 60); do [ -z "$(cat "$cg/cgroup.procs")" ] && break; sleep 1; done  # stragglers
wall=$(echo "$(date +%s.%N) - $start" | bc)
core=$(usage)
echo "pytest $*: ${core} core-s in ${wall%.*} s wall ($(echo "scale=2; $core / $wall" | bc) cores busy), exit $rc"
rmdir "$cg" 2>/dev/null || echo "processes left in $cg: $(cat "$cg/cgroup.procs" | tr '\n' ' ')"
exit $rc
