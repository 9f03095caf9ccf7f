"""``python -m launch.train [hydra overrides]``: the main job (DESIGN.md section 9).

Today it composes and validates the whole config (an unknown key or bad value stops it with one
message naming the key, exit code 2) and prints it. The driver loop (rollout -> verifier pool ->
advantage stage + ACR monitor -> DeepSpeed update -> weight sync) lands with its issues; until
then this says so plainly instead of pretending to train.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from launch.config import ConfigError, to_train_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        config = to_train_config(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    print(OmegaConf.to_yaml(OmegaConf.structured(config)), end="")
    print(
        f"config OK (algorithm={config.algorithm.name}). The training driver is not built yet: "
        "the algorithm core (advantage estimators, AVSPO, ACR monitor, policy loss) is, and "
        "`make test` exercises it. Rollout, verifiers, learner and the loop come next."
    )


if __name__ == "__main__":
    main()
