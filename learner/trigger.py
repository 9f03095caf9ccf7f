"""AVSPO trigger policies: the threshold ``tau_adapt_t`` that ACR_t must exceed to augment.

``adaptive`` (default; paper Eq. 12):

    tau_{t+1} = clip(tau_t + eta * sign(J_t - J_{t-1}) * (ACR_t - tau_t), tau_min, tau_max)

with tau_0 = 0.5, eta = 0.01, bounds [0.1, 0.9]. J_t is the step's mean real reward *(ours: the
paper does not say how J is measured)*. There is no update after the first step (no J_{t-1},
sign(0) = 0). Step t decides with tau_t (:attr:`tau_adapt`), then :meth:`observe` updates it.

``acr_window`` W > 1 replaces ACR_t by the collapsed share of the groups of the last W steps
(this one included) for the decision, K_t and the update (:class:`TriggerConfig`).

Others: ``fixed`` (constant ``tau_adapt_0``; the paper's ablation at 0.3/0.5/0.7), ``always``
(tau = 0: every step with a collapsed group), ``never`` (tau = 1: ACR_t > 1 is impossible, so
plain GRPO; 1 rather than infinity keeps the logged value valid JSON).

>>> t = make_trigger(TriggerConfig(policy="adaptive", eta=0.5))
>>> t.tau_adapt, t.observe(acr=0.9, mean_reward=0.2), t.tau_adapt   # first step: no update
(0.5, None, 0.5)
>>> t.observe(acr=0.9, mean_reward=0.4); t.tau_adapt  # J rose: 0.5 + 0.5 * (0.9 - 0.5)
0.7
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from comm.collapse import collapse_stats

POLICIES = ("adaptive", "fixed", "always", "never")


@dataclass
class TriggerConfig:
    """When AVSPO augments collapsed groups."""

    policy: str = field(default="adaptive", metadata={"choices": POLICIES})
    """adaptive | fixed | always | never."""
    tau_adapt_0: float = field(default=0.5, metadata={"ge": 0.0, "le": 1.0})
    """Initial threshold (adaptive) or the constant one (fixed)."""
    eta: float = field(default=0.01, metadata={"ge": 0.0})
    """Adaptive step size."""
    tau_min: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    tau_max: float = field(default=0.9, metadata={"ge": 0.0, "le": 1.0})
    acr_window: int = field(default=1, metadata={"ge": 1})
    """ACR_t as the trigger sees it (its decision, K_t and the adaptive update): collapsed groups
    / groups over the last ``acr_window`` steps, this one included (1 = this step's ACR). With
    one prompt per step (the paper's setting) a one-step ACR is 0 or 1, so tau_adapt, eta and
    alpha lose their meaning; a window of >= 32 groups restores it (the paper preset's choice).
    The logged ``acr/*`` metrics are per step whatever this is."""

    def check(self) -> str | None:
        """Cross-field check (run by the config validator)."""
        if not self.tau_min <= self.tau_max:
            return f"tau_min={self.tau_min} > tau_max={self.tau_max}"
        if self.policy == "adaptive" and not self.tau_min <= self.tau_adapt_0 <= self.tau_max:
            return (
                f"tau_adapt_0={self.tau_adapt_0} outside [tau_min, tau_max]="
                f"[{self.tau_min}, {self.tau_max}]"
            )
        return None


class Trigger:
    """Base: a threshold that may move after each step. State is JSON-serialisable."""

    def __init__(self, tau_adapt: float):
        self.tau_adapt = float(tau_adapt)

    def observe(self, acr: float, mean_reward: float) -> None:
        """Record step t's ACR_t and J_t after its decision was taken."""

    def state_dict(self) -> dict:
        return {"tau_adapt": self.tau_adapt}

    def load_state_dict(self, state: dict) -> None:
        self.tau_adapt = float(state["tau_adapt"])


class AdaptiveTrigger(Trigger):
    def __init__(self, cfg: TriggerConfig):
        problem = cfg.check()
        if problem:
            raise ValueError(problem)
        super().__init__(cfg.tau_adapt_0)
        self.eta, self.lo, self.hi = cfg.eta, cfg.tau_min, cfg.tau_max
        self.prev_reward: float | None = None

    def observe(self, acr: float, mean_reward: float) -> None:
        if self.prev_reward is not None:
            direction = math.copysign(1.0, mean_reward - self.prev_reward)
            if mean_reward == self.prev_reward:
                direction = 0.0
            moved = self.tau_adapt + self.eta * direction * (acr - self.tau_adapt)
            self.tau_adapt = min(max(moved, self.lo), self.hi)
        self.prev_reward = float(mean_reward)

    def state_dict(self) -> dict:
        return {"tau_adapt": self.tau_adapt, "prev_reward": self.prev_reward}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.prev_reward = state["prev_reward"]


def make_trigger(cfg: TriggerConfig) -> Trigger:
    if cfg.policy == "adaptive":
        return AdaptiveTrigger(cfg)
    if cfg.policy == "fixed":
        return Trigger(cfg.tau_adapt_0)
    if cfg.policy == "always":
        return Trigger(0.0)
    if cfg.policy == "never":
        return Trigger(1.0)
    raise ValueError(f"unknown trigger policy {cfg.policy!r}; expected one of {POLICIES}")


class AVSPOTrigger:
    """AVSPO's trigger with all of its state: the threshold tau_adapt_t and its update, and the
    ACR window (``acr_window`` > 1: the collapsed and total group counts of the last W - 1
    steps). ``tau``: the collapse threshold on a group's reward std.

    >>> import torch
    >>> t = AVSPOTrigger(TriggerConfig(policy="fixed", tau_adapt_0=0.3, acr_window=2), tau=1e-6)
    >>> seen = []
    >>> def estimate(tau_adapt, acr):  # what the estimator is handed: the decision's inputs
    ...     seen.append((tau_adapt, acr))
    ...     return None
    >>> ids = torch.tensor([0, 0, 1, 1])
    >>> t.step(torch.tensor([1.0, 1.0, 0.0, 1.0]), ids, 0.75, estimate)  # 1 of 2 groups collapsed
    >>> t.step(torch.tensor([1.0, 0.0, 0.0, 1.0]), ids, 0.5, estimate)  # 0 of 2: (1 + 0) / 4
    >>> seen
    [(0.3, 0.5), (0.3, 0.25)]
    """

    def __init__(self, cfg: TriggerConfig, tau: float):
        self.threshold = make_trigger(cfg)
        self.tau = tau
        self.window: deque[tuple[int, int]] = deque(maxlen=cfg.acr_window - 1)
        self.last: dict[str, float] = {}  # the step's tau_adapt and ACR as the trigger saw them

    @property
    def tau_adapt(self) -> float:
        return self.threshold.tau_adapt

    def step(self, rewards: Tensor, group_ids: Tensor, mean_reward: float, estimate: Callable):
        """One step: ``estimate(tau_adapt_t, the windowed ACR or None for this step's own)``
        decides and computes the advantages (an AdvantageResult), then the window takes this
        step's groups and the threshold updates on ACR_t and J_t = ``mean_reward``. Returns
        what ``estimate`` returned; :attr:`last` holds the decision's two inputs."""
        tau_adapt, now, windowed = self.tau_adapt, None, None
        if self.window.maxlen:
            collapsed = collapse_stats(rewards, group_ids, tau=self.tau).collapsed
            now = (int(collapsed.sum()), collapsed.numel())
            seen = (*self.window, now)
            windowed = sum(c for c, _ in seen) / sum(n for _, n in seen)
        result = estimate(tau_adapt, windowed)
        if now is not None:
            self.window.append(now)
        acr = windowed if windowed is not None else result.acr
        self.threshold.observe(acr, mean_reward)
        self.last = {"avspo/tau_adapt": tau_adapt, "avspo/acr_trigger": acr}
        return result

    def state_dict(self) -> dict:
        return {
            "trigger": self.threshold.state_dict(),
            "acr_window": [list(x) for x in self.window],
        }

    def load_state_dict(self, state: dict) -> None:
        self.threshold.load_state_dict(state["trigger"])
        self.window.clear()
        self.window.extend(tuple(x) for x in state.get("acr_window", []))
