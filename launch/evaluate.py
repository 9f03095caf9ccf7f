"""``python -m launch.evaluate [overrides]``: held-out evaluation (launch/heldout.py: greedy
pass@1, pass@k) of a model or a checkpoint (``trainer.resume=<checkpoint folder>``), as JSON on
stdout. The sampled pass@k uses the seed the training run used at that checkpoint's step."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from launch.config import exit_on_config_error, to_train_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    with exit_on_config_error():
        cfg = to_train_config(raw)
    from launch.loop import Trainer

    log = functools.partial(print, file=sys.stderr)  # stdout is the JSON result
    with exit_on_config_error():
        trainer = Trainer(cfg, Path.cwd(), log=log, learner=False)
    try:
        metrics = trainer.evaluate(trainer.checkpoint_step())
    finally:
        trainer.shutdown()
    print(
        json.dumps({"model": trainer.model_path, "num_problems": len(trainer.task.test), **metrics})
    )


if __name__ == "__main__":
    main()
