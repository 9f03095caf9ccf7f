"""``python -m launch.evaluate [overrides]``: held-out evaluation (launch/heldout.py: greedy
pass@1, pass@k) of a model or a checkpoint (``trainer.resume=<checkpoint folder>``), as JSON on
stdout. The sampled pass@k uses the seed the training run used at that checkpoint's step. A
test-only task (e.g. ``task=math500 task.test_file=...``) needs no train split, and
``trainer.eval_tasks`` evaluates several tasks at once (launch/heldout.py ``evaluate_held_out``)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from launch.validation import exit_on_config_error, to_train_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    with exit_on_config_error():
        cfg = to_train_config(raw)
    from launch.heldout import evaluate_held_out
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
