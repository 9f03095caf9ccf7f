"""DCPO's smooth advantage standardisation (arXiv 2509.02333): each prompt's rewards are also
standardised against every reward it got on earlier visits, and the smaller-magnitude blend is
kept, so a group that collapsed now can still carry a signal. Pure torch; the per-prompt state
(:class:`PromptHistory`) is checkpointed by the advantage stage."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from comm.collapse import collapse_stats
from learner.advantage import (
    AdvantageResult,
    apply_advantages,
    grpo_denominator,
    result_of,
    zero_where,
)


@dataclass
class PromptHistory:
    """The ``dcpo`` estimator's state: ``stats[key]`` = (visits, n, mean, M2) of every reward the
    prompt ``key`` got so far; JSON-serialisable, checkpointed by the advantage stage."""

    stats: dict[str, list] = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"prompt_history": {k: list(v) for k, v in self.stats.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.stats = {k: list(v) for k, v in state.get("prompt_history", {}).items()}


def dcpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    history: list[tuple[int, int, float, float] | None],
    *,
    eps: float = 1e-6,
    unbiased: bool = True,
    tau: float = 1e-6,
) -> tuple[AdvantageResult, list[tuple[int, int, float, float]]]:
    r"""DCPO's smooth advantage standardisation (SAS; Yang et al. 2025, arXiv 2509.02333, and
    its code, lime-RL/DCPO ``compute_dcpo_outcome_advantage``).

    ``history[j]``: group j's prompt before this step, ``(visits, n, mean, m2)`` of every reward
    it got so far (None: first visit). With i = visits including this one, per sample:

    - A_new = (r - mean(R_j)) / (std(R_j) + eps), 0 if the group is collapsed now (as GRPO);
    - A_total = (r - mean_total) / (std_total + eps) over all n + G_j rewards of the prompt
      (earlier visits and this group), 0 if those are collapsed too (pop. std < tau);
    - SA_1 = A_total / i + (1 - 1/i) A_new,  SA_2 = A_new / i + (1 - 1/i) A_total;
    - A = SA_1 if |SA_1| < |SA_2| else SA_2 (the smaller magnitude; a tie takes SA_2).

    So a group collapsed now still gets (1/i or (i-1)/i of) its history's signal. Returns the
    result (``augmented``: groups collapsed now that got a non-zero advantage from history) and
    each group's updated ``(visits, n, mean, m2)``.

    Where we chose: mean_total and std_total are the exact pooled statistics of all the prompt's
    rewards (Chan's update of (n, mean, m2)); the authors' code pools per-visit means and
    unbiased stds with equal weights (the same for equal group sizes, up to the std's degrees of
    freedom). ``unbiased`` applies to both stds, as GRPO's ``algorithm.unbiased_std``.

    Worked example (tests pin it): a prompt's 3rd visit, G = 4, R = [1, 0, 0, 0] after [1, 0, 0, 0]
    and [1, 1, 0, 0]: A_new = 1.5 / -0.5; 4 of 12 correct: A_total = 1.3540 / -0.6770;
    SA = 1.4027 (SA_2) for the correct sample, -0.5590 (SA_1) for the others.

    >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    >>> res, new = dcpo_advantages(r, torch.zeros(4, dtype=torch.long), [(2, 8, 0.375, 1.875)])
    >>> [round(a, 4) for a in res.advantages.tolist()], new
    ([1.4027, -0.559, -0.559, -0.559], [(3, 12, 0.3333333333333333, 2.6666666666666665)])
    """
    stats = collapse_stats(rewards, group_ids, tau=tau)
    m = stats.groups.num
    if len(history) != m:
        raise ValueError(f"{len(history)} prompt histories for {m} groups")
    dtype = stats.mean.dtype
    size = stats.groups.size.to(dtype)
    prior = [h or (0, 0, 0.0, 0.0) for h in history]
    visits = torch.tensor([p[0] + 1 for p in prior], dtype=dtype)  # i, this visit included
    n0 = torch.tensor([p[1] for p in prior], dtype=dtype)
    mean0 = torch.tensor([p[2] for p in prior], dtype=dtype)
    m2_0 = torch.tensor([p[3] for p in prior], dtype=dtype)
    n = n0 + size
    delta = stats.mean - mean0
    mean_t = mean0 + delta * size / n
    m2_t = m2_0 + stats.m2 + delta * delta * n0 * size / n
    collapsed_t = torch.sqrt(m2_t / n) < tau
    r = rewards.to(dtype)
    denom_new = grpo_denominator(stats, eps=eps, scale_by_std=True, unbiased=unbiased)
    a_new = apply_advantages(r, stats, stats.mean, denom_new)
    dof_t = (n - 1 if unbiased else n).clamp(min=1)
    a_tot = apply_advantages(
        r, stats, mean_t, zero_where(torch.sqrt(m2_t / dof_t) + eps, collapsed_t)
    )
    w = (1.0 / visits)[stats.groups.index]  # [N] 1/i of each sample's group
    sa_1 = w * a_tot + (1 - w) * a_new
    sa_2 = w * a_new + (1 - w) * a_tot
    advantages = torch.where(sa_1.abs() < sa_2.abs(), sa_1, sa_2)
    nonzero = torch.zeros(m, dtype=torch.bool)
    nonzero[stats.groups.index[advantages != 0]] = True  # [M] a sample got a signal
    augmented = stats.collapsed & nonzero
    updated = [(int(visits[j]), int(n[j]), float(mean_t[j]), float(m2_t[j])) for j in range(m)]
    result = result_of(stats, advantages, augmented=augmented, triggered=bool(augmented.any()))
    return result, updated


def dcpo_sequential(rewards, group_ids, keys, cfg, history: PromptHistory) -> AdvantageResult:
    """DCPO when a prompt occurs in more than one group of a step (``keys``: each group's
    prompt): one group at a time."""
    stats = collapse_stats(rewards, group_ids, tau=cfg.tau)
    index = stats.groups.index
    advantages = torch.zeros_like(rewards, dtype=stats.mean.dtype)
    augmented = torch.zeros(stats.groups.num, dtype=torch.bool)
    for j, key in enumerate(keys):
        rows = (index == j).nonzero().squeeze(-1)
        res, (state,) = dcpo_advantages(
            rewards[rows],
            torch.zeros(len(rows), dtype=torch.long),
            [history.stats.get(key)],
            eps=cfg.eps,
            unbiased=cfg.unbiased_std,
            tau=cfg.tau,
        )
        advantages[rows] = res.advantages
        augmented[j] = bool(res.augmented[0])
        history.stats[key] = list(state)
    return result_of(stats, advantages, augmented=augmented, triggered=bool(augmented.any()))
