"""Advantage Collapse Rate (ACR): per-step collapse statistics and the run-long monitor.

Math (docs/ARCHITECTURE.md sections 4-5; paper arXiv 2605.21125, Eq. 4/11). A step has groups j =
1..N, group j holds the real rewards R_j = (r_j1..r_jG) of the G samples of one prompt.

- Group j is *collapsed* when ``sigma_pop(R_j) < tau`` (population std, tau = 1e-6) or G = 1:
  GRPO's advantages, and so its gradient, vanish for it.
- ``ACR_t = #collapsed / N``. Strata: *high* when ``max(R_j) > r_lo`` (all correct, or all equal at
  a positive partial credit), *low* when ``max(R_j) == r_lo`` (all incorrect).
- ``ACR100`` = mean of ``ACR_t`` over the first 100 steps; the paper's early predictor of final
  accuracy (runs with ACR100 > 0.5 rarely exceed 35% accuracy). ``acr/acr100_steps`` says how
  many steps it covers (fewer than 100 in a shorter run, or before step 100).

Choices that are ours (the paper is silent), all configurable in :class:`MonitorConfig`:

- ``acr/ema`` starts at the first step's value (no bias correction), then
  ``ema = beta * ema + (1 - beta) * acr``, beta = 0.9.
- ``acr/volatility`` is the population std over the last 25 steps.
- ``acr/effective`` and ``acr/wasted_token_frac`` call an advantage zero when ``|A| < 1e-8``.
- The early-warning alert may fire only after ``alert_min_steps`` steps (default 10), so that one
  unlucky first step does not fire it; it fires at most once per run.

>>> s = collapse_stats(torch.tensor([1., 1., 0., 0., 1., 0.]), torch.tensor([0, 0, 1, 1, 2, 2]))
>>> round(s.acr, 4), round(s.acr_high, 4), round(s.acr_low, 4), s.batch_collapsed
(0.6667, 0.3333, 0.3333, False)
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from comm.collapse import CollapseStats, collapse_stats  # noqa: F401 - also the spec's entry point
from comm.groups import segment_sum

logger = logging.getLogger(__name__)

ZERO_ADVANTAGE = 1e-8  # |A| below this counts as "no gradient" for acr/effective


@dataclass
class MonitorConfig:
    """The ACR monitor's settings (the ``acr`` node of the run config; defaults per
    docs/ARCHITECTURE.md section 5). The collapse threshold is ``algorithm.tau`` and the stratum
    floor the task's lowest reward: both are given to :class:`ACRMonitor` by its owner, not
    configured twice."""

    ema_beta: float = field(default=0.9, metadata={"ge": 0.0, "lt": 1.0})
    window: int = field(default=100, metadata={"ge": 1})
    """Steps in ``acr/window`` (mean)."""
    volatility_window: int = field(default=25, metadata={"ge": 1})
    """Steps in ``acr/volatility`` (population std)."""
    early_steps: int = field(default=100, metadata={"ge": 1})
    """ACR100 averages ``acr/raw`` over this many first steps, then freezes."""
    alert_level: float = field(default=0.5, metadata={"ge": 0.0, "le": 1.0})
    """The early warning fires once when ACR100 (running mean before it freezes) exceeds this."""
    alert_min_steps: int = field(default=10, metadata={"ge": 1})
    """Steps observed before the alert may fire."""


class ACRMonitor:
    """Turns each step's rewards and advantages into the metrics of docs/ARCHITECTURE.md section 5.

    Call :meth:`update` once per training step with that step's real rewards, the advantages
    the advantage stage produced, group ids and response lengths (tokens). All per-step math is
    vectorised over groups; only the per-prompt history (string keys) is a dictionary update.
    """

    def __init__(
        self,
        cfg: MonitorConfig | None = None,
        *,
        tau: float = 1e-6,
        r_lo: float = 0.0,
        strata: bool = True,
    ):
        """``tau``: collapse threshold on a group's population reward std (``algorithm.tau``);
        ``r_lo``: the task's lowest reward (a collapsed group at it is the *low* stratum);
        ``strata``: whether all-correct / all-incorrect mean anything for the reward (not for
        intrinsic rewards such as INTUITOR's and RENT's: ``acr/high``, ``acr/low`` and the
        always/never-solved prompt counts are then left out)."""
        self.cfg = cfg or MonitorConfig()
        self.tau, self.r_lo, self.strata = tau, r_lo, strata
        self.steps = 0
        self.ema: float | None = None
        self.recent: deque[float] = deque(maxlen=max(self.cfg.window, self.cfg.volatility_window))
        self.early_sum = 0.0  # sum of acr/raw over the first `early_steps` steps
        self.alert_step: int | None = None  # monitor step at which the early warning fired
        # prompt key -> [times seen, times collapsed high (always solved), times collapsed low]
        self.prompt_history: dict[str, list[int]] = {}
        self.collapsed: list[bool] = []  # the last step's groups, ascending group id

    @property
    def acr100(self) -> float:
        """Mean ``acr/raw`` over the first ``early_steps`` steps (running mean before that)."""
        seen = min(self.steps, self.cfg.early_steps)
        return self.early_sum / seen if seen else math.nan

    def update(
        self,
        rewards: Tensor,
        group_ids: Tensor,
        advantages: Tensor,
        response_lengths: Tensor,
        *,
        prompt_keys: list[str] | None = None,
        verifier_reasons: list[str] | None = None,
        stats: CollapseStats | None = None,
    ) -> dict[str, float]:
        """Record one step; returns its ``acr/*`` (and ``reward/verifier_*``) metrics.

        ``prompt_keys`` (optional) names each group's prompt, in ascending group-id order, for
        the per-prompt collapse history. ``verifier_reasons`` (optional) are the verdict reasons
        of the step's samples (reward/verifiers.py REASONS). ``stats``
        (optional) are the step's :func:`collapse_stats` already computed by the advantage
        stage (``AdvantageResult.stats``); they are reused when computed with this monitor's
        tau and r_lo, so the step's group statistics are computed once.
        """
        reusable = (
            stats is not None
            and (stats.tau, stats.r_lo) == (self.tau, self.r_lo)
            and int(stats.groups.size.sum()) == rewards.numel()
        )
        if not reusable:
            stats = collapse_stats(rewards, group_ids, tau=self.tau, r_lo=self.r_lo)
        groups = stats.groups
        self.collapsed = stats.collapsed.tolist()
        if advantages.shape != rewards.shape or response_lengths.shape != rewards.shape:
            raise ValueError("rewards, advantages and response_lengths must all have shape [N]")
        acr = stats.acr
        metrics = {
            "acr/raw": acr,
            "frac_reward_zero_std": acr,  # TRL's name for the same quantity
            "acr/batch_collapsed": float(stats.batch_collapsed),
        }
        if self.strata:
            metrics |= {"acr/high": stats.acr_high, "acr/low": stats.acr_low}

        metrics |= wasted_work(advantages, response_lengths, groups)
        metrics |= self._over_time(acr)
        if prompt_keys is not None:
            self._record_prompts(prompt_keys, stats)
        if verifier_reasons is not None:
            metrics.update(verifier_metrics(verifier_reasons))
        return metrics

    def _over_time(self, acr: float) -> dict[str, float]:
        """Count the step and return the ACR's EMA, window mean, volatility, ACR100 and the
        early warning (which may fire here)."""
        self.steps += 1
        self.ema = (
            acr
            if self.ema is None
            else self.cfg.ema_beta * self.ema + (1 - self.cfg.ema_beta) * acr
        )
        self.recent.append(acr)
        if self.steps <= self.cfg.early_steps:
            self.early_sum += acr
        window = list(self.recent)[-self.cfg.window :]
        vol = torch.tensor(list(self.recent)[-self.cfg.volatility_window :], dtype=torch.float64)
        self._maybe_alert()
        return {
            "acr/ema": self.ema,
            "acr/window": sum(window) / len(window),
            "acr/volatility": float(vol.std(unbiased=False)),
            "acr/acr100": self.acr100,
            "acr/acr100_steps": float(min(self.steps, self.cfg.early_steps)),
            "acr/early_warning": float(self.alert_step is not None),
        }

    def _maybe_alert(self) -> None:
        if self.alert_step is not None or self.steps < self.cfg.alert_min_steps:
            return
        if self.acr100 > self.cfg.alert_level:
            self.alert_step = self.steps
            frozen = self.steps >= self.cfg.early_steps
            logger.warning(
                "ACR early warning at step %d: ACR%d%s = %.3f > %.2f. Runs this collapsed rarely "
                "reach good accuracy (paper: ACR100 > 0.5 -> mostly < 35%%); consider AVSPO, an "
                "easier task level or more samples per prompt.",
                self.steps,
                self.cfg.early_steps,
                "" if frozen else " (running)",
                self.acr100,
                self.cfg.alert_level,
            )

    def _record_prompts(self, prompt_keys: list[str], stats: CollapseStats) -> None:
        if len(prompt_keys) != stats.groups.num:
            raise ValueError(f"{len(prompt_keys)} prompt keys for {stats.groups.num} groups")
        high = stats.high.tolist()
        low = (stats.collapsed & ~stats.high).tolist()
        for key, h, lo in zip(prompt_keys, high, low, strict=True):
            rec = self.prompt_history.setdefault(key, [0, 0, 0])
            rec[0] += 1
            rec[1] += h
            rec[2] += lo

    def prompt_summary(self) -> dict[str, int]:
        """Prompts seen, always solved (every visit all-correct), never solved (all-incorrect)."""
        recs = self.prompt_history.values()
        if not self.strata:
            return {"prompts_seen": len(self.prompt_history)}
        return {
            "prompts_seen": len(self.prompt_history),
            "always_solved": sum(1 for n, h, _ in recs if h == n),
            "never_solved": sum(1 for n, _, lo in recs if lo == n),
        }

    def state_dict(self) -> dict:
        """JSON-serialisable state for checkpoints."""
        return {
            "steps": self.steps,
            "ema": self.ema,
            "recent": list(self.recent),
            "early_sum": self.early_sum,
            "alert_step": self.alert_step,
            "prompt_history": {k: list(v) for k, v in self.prompt_history.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.ema = state["ema"]
        self.recent = deque(state["recent"], maxlen=self.recent.maxlen)
        self.early_sum = float(state["early_sum"])
        self.alert_step = state["alert_step"]
        self.prompt_history = {k: list(v) for k, v in state["prompt_history"].items()}


def wasted_work(advantages: Tensor, response_lengths: Tensor, groups) -> dict[str, float]:
    """What the update actually wasted after the advantage stage: ``acr/effective`` (groups
    whose samples all have abs(A) < 1e-8) and ``acr/wasted_token_frac`` (their tokens' share)."""
    zero_adv = advantages.abs() < ZERO_ADVANTAGE  # [N]
    nonzero_per_group = segment_sum((~zero_adv).to(torch.int64), groups)  # [M]
    lengths = response_lengths.to(torch.float64)
    total_tokens = float(lengths.sum())
    wasted = float(lengths[zero_adv].sum())
    return {
        "acr/effective": float((nonzero_per_group == 0).float().mean()),
        "acr/wasted_token_frac": wasted / total_tokens if total_tokens > 0 else 0.0,
    }


def extra_metrics(extras: list[dict[str, float] | None]) -> dict[str, float]:
    """``reward/extra/<key>``: the mean of each number a reward function returned beside its
    score (verl's dict), over the samples that have it.

    >>> extra_metrics([{"acc": 1.0}, None, {"acc": 0.0, "format": 1.0}])
    {'reward/extra/acc': 0.5, 'reward/extra/format': 1.0}
    """
    sums: dict[str, list[float]] = {}
    for extra in extras:
        for key, value in (extra or {}).items():
            sums.setdefault(key, []).append(value)
    return {f"reward/extra/{k}": sum(v) / len(v) for k, v in sums.items()}


def verifier_metrics(reasons: list[str]) -> dict[str, float]:
    """``reward/verifier_error_frac`` and ``reward/verifier_timeout_frac`` of a step's verdicts.

    Logged beside ACR because a broken verifier (every item an error -> reward 0) looks exactly
    like all-incorrect collapse.

    >>> verifier_metrics(["ok", "timeout", "error", "wrong"])
    {'reward/verifier_error_frac': 0.25, 'reward/verifier_timeout_frac': 0.25}
    """
    n = len(reasons)
    if n == 0:
        return {"reward/verifier_error_frac": 0.0, "reward/verifier_timeout_frac": 0.0}
    return {
        "reward/verifier_error_frac": sum(r == "error" for r in reasons) / n,
        "reward/verifier_timeout_frac": sum(r == "timeout" for r in reasons) / n,
    }
