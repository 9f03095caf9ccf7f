"""``python -m launch.evaluate [overrides]``: held-out evaluation (launch/heldout.py: greedy
pass@1, pass@k) of a model or a checkpoint (``trainer.resume=<checkpoint folder>``), as JSON on
stdout. The sampled pass@k uses the seed the training run used at that checkpoint's step. A
test-only task (e.g. ``task=math500 task.test_file=...``) needs no train split, and
``trainer.eval_tasks`` evaluates several tasks at once (:func:`evaluate_held_out`, which the
training loop calls too)."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from launch.config import TrainConfig, exit_on_config_error, to_train_config
from launch.heldout import evaluate
from rollout.seeding import derive_seed

if TYPE_CHECKING:
    from launch.stages import Stages
    from reward.tasks import Task, TaskConfig


def evaluate_held_out(
    cfg: TrainConfig, stages: Stages, step: int, phase: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Held-out evaluation of every eval set (launch/heldout.py); with ``trainer.eval_tasks``,
    per-task metrics ``eval/<task>/...`` and their averages as ``eval/...``. ``phase`` is told
    which pass of which set runs (the console's progress)."""
    t = cfg.trainer
    sampling = cfg.rollout.sampling
    if t.eval_max_new_tokens:
        sampling = dataclasses.replace(sampling, max_new_tokens=t.eval_max_new_tokens)

    def verifier(task: Task, task_cfg: TaskConfig):
        return lambda groups, problems: stages.verifier.verify(
            groups, problems, task, task_cfg.truncated
        )

    def progress(i: int, name: str | None):
        if phase is None:
            return None
        m = len(stages.eval_sets)
        where = f"evaluation {i}/{m} ({name})" if m > 1 else "evaluation"
        return lambda text: phase(f"{where}: {text}")

    per_set = {
        name: evaluate(
            stages.rollout.generate,
            verifier(task, task_cfg),
            task.test,
            sampling,
            k=t.eval_pass_k,
            n=t.eval_samples,
            temperature=t.eval_temperature,
            seed=derive_seed(t.seed, "eval", step),
            solved_at=task.reward_range[1],
            phase=progress(i, name),
        )
        for i, (name, (task, task_cfg)) in enumerate(stages.eval_sets.items(), 1)
    }
    if list(per_set) == [None]:
        return per_set[None]
    out = {k.replace("eval/", f"eval/{n}/"): v for n, m in per_set.items() for k, v in m.items()}
    for key in per_set[next(iter(per_set))]:  # the same keys for every set
        out[key] = sum(m[key] for m in per_set.values()) / len(per_set)
    return out


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    with exit_on_config_error():
        cfg = to_train_config(raw)
    from launch.resume import checkpoint_step
    from launch.stages import build_stages

    log = functools.partial(print, file=sys.stderr)  # stdout is the JSON result
    with exit_on_config_error():
        stages = build_stages(cfg, Path.cwd(), log=log, train=False)
    try:
        step = checkpoint_step(stages.resume_from)
        metrics = evaluate_held_out(cfg, stages, step, phase=log)
    finally:
        stages.shutdown()
    problems = sum(len(task.test) for task, _ in stages.eval_sets.values())
    print(json.dumps({"model": stages.model_path, "num_problems": problems, **metrics}))


def cli() -> None:
    """``python -m launch.evaluate``: the config checked first, as ``launch.train`` does (a bad
    key or value: exit 2, one line), then :func:`main`."""
    from launch.train import cli as checked

    checked(main)


if __name__ == "__main__":
    cli()
