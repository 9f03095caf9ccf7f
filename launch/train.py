"""``python -m launch.train [hydra overrides]``: the main job (DESIGN.md section 9).

Composes and validates the whole config first (an unknown key or bad value stops it with one
message naming the key, before any actor starts), then runs the driver loop (launch/loop.py):
rollout workers -> verifier pool -> learner group (advantage stage + ACR monitor + DeepSpeed
update) -> weight sync, with held-out evaluation at step 0, every ``trainer.eval_every`` steps
and at the end. The run directory (``trainer.run_dir``, default Hydra's output directory) gets
the resolved ``config.yaml`` and ``metrics.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from launch.config import exit_on_config_error, to_train_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(raw: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    with exit_on_config_error():
        cfg = to_train_config(raw)
    run_dir = Path(cfg.trainer.run_dir or HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    print(f"run directory: {run_dir}", flush=True)

    from launch.loop import Trainer

    with exit_on_config_error():
        trainer = Trainer(cfg, run_dir, log=lambda line: print(line, flush=True))
    try:
        final = trainer.run()
    finally:
        trainer.shutdown()
    start = final["eval/accuracy_start"]
    print(
        f"held-out accuracy: {start:.3f} at step 0 -> "
        f"{final['eval/accuracy']:.3f} at step {cfg.trainer.total_steps}; "
        f"metrics in {run_dir / 'metrics.jsonl'}"
    )


if __name__ == "__main__":
    main()
