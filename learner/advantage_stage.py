"""The advantage stage: estimator (by name) + AVSPO trigger, once per training step.

It sits between reward collection and the update (DESIGN.md section 2). Pure torch, no Ray: the
learner group front owns one and calls it on each step's real rewards.

>>> from learner.config import AlgorithmConfig
>>> stage = AdvantageStage(AlgorithmConfig(), reward_range=(0.0, 1.0), seed=0)
>>> res, m = stage(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
>>> m["avspo/triggered"], m["avspo/tau_adapt"]   # ACR 0.5 is not > tau_adapt_0 = 0.5
(0.0, 0.5)
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.advantage import AdvantageResult, get_estimator
from learner.config import AlgorithmConfig
from learner.trigger import make_trigger


class AdvantageStage:
    def __init__(
        self, cfg: AlgorithmConfig, *, reward_range: tuple[float, float], seed: int
    ) -> None:
        self.cfg = cfg
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.estimator = get_estimator(cfg.estimator)
        self.trigger = make_trigger(cfg.trigger)
        self.generator = torch.Generator().manual_seed(seed)  # `random` virtual rewards only

    def __call__(self, rewards: Tensor, group_ids: Tensor) -> tuple[AdvantageResult, dict]:
        """Advantages of one step, and its ``avspo/*`` metrics; then the trigger updates."""
        tau_adapt = self.trigger.tau_adapt
        result = self.estimator(
            rewards,
            group_ids,
            self.cfg,
            tau_adapt=tau_adapt,
            reward_range=self.reward_range,
            generator=self.generator,
        )
        self.trigger.observe(result.acr, float(rewards.double().mean()))
        n_aug = int(result.augmented.sum())
        metrics = {
            "avspo/triggered": float(result.triggered),
            "avspo/tau_adapt": tau_adapt,
            "avspo/k": float(result.k.sum()) / n_aug if n_aug else 0.0,
            "avspo/virtual_samples": float(result.num_virtual),
            "avspo/groups_augmented": float(n_aug),
        }
        return result, metrics

    def state_dict(self) -> dict:
        """JSON-serialisable: trigger state and the virtual-sample RNG."""
        return {
            "trigger": self.trigger.state_dict(),
            "generator": self.generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.trigger.load_state_dict(state["trigger"])
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
