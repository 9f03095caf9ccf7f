"""Which of a step's groups collapsed (all rewards equal): ACR and its strata, with the group
statistics the advantage estimators reuse, so that the estimators (learner/) and the ACR monitor
(diagnostics/acr.py, which also exports :func:`collapse_stats` under the name the spec gives)
agree bit for bit. Pure torch (comm/groups.py's segment ops)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from comm.groups import Groups, collapsed_groups, segment_groups, segment_max, segment_moments


@dataclass(frozen=True)
class CollapseStats:
    """Collapse statistics of one step's real rewards."""

    acr: float  # collapsed groups / groups
    acr_high: float  # collapsed with max(R_j) > r_lo, / groups
    acr_low: float  # collapsed with max(R_j) == r_lo, / groups
    batch_collapsed: bool  # every group collapsed
    tau: float  # the collapse threshold these were computed with
    r_lo: float  # the stratum floor these were computed with
    collapsed: Tensor  # [M] bool, groups in ascending id order
    high: Tensor  # [M] bool, collapsed & max(R_j) > r_lo
    # Kept for the advantage estimators, which need the same group statistics:
    groups: Groups = field(repr=False)
    mean: Tensor = field(repr=False)  # [M] group mean reward
    m2: Tensor = field(repr=False)  # [M] sum of squared deviations from the mean
    max: Tensor = field(repr=False)  # [M] group max reward


def collapse_stats(
    rewards: Tensor, group_ids: Tensor, *, tau: float = 1e-6, r_lo: float = 0.0
) -> CollapseStats:
    """Which groups are collapsed, and ACR with its strata (docs/ARCHITECTURE.md section 9)."""
    rewards = _as_float(rewards)
    groups = segment_groups(group_ids)
    if group_ids.numel() != rewards.numel():
        raise ValueError(f"rewards has {rewards.numel()} entries, group_ids {group_ids.numel()}")
    if groups.num == 0:
        raise ValueError("collapse_stats needs at least one reward")
    mean, m2 = segment_moments(rewards, groups)
    if not bool(torch.isfinite(mean.sum())):  # a NaN/inf reward makes its group's mean one
        _raise_non_finite(rewards)
    collapsed = collapsed_groups(m2, groups.size, tau)
    group_max = segment_max(rewards, groups)
    high = collapsed & (group_max > r_lo)
    m = groups.num
    n_collapsed, n_high = int(collapsed.sum()), int(high.sum())
    return CollapseStats(
        acr=n_collapsed / m,
        acr_high=n_high / m,
        acr_low=(n_collapsed - n_high) / m,
        batch_collapsed=n_collapsed == m,
        tau=tau,
        r_lo=r_lo,
        collapsed=collapsed,
        high=high,
        groups=groups,
        mean=mean,
        m2=m2,
        max=group_max,
    )


def _as_float(x: Tensor) -> Tensor:
    if x.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(x.shape)}")
    return x if x.dtype.is_floating_point else x.to(torch.float32)


def _raise_non_finite(rewards: Tensor) -> None:
    bad = ~torch.isfinite(rewards)
    where = bad.nonzero().squeeze(1)[:5].tolist()
    raise ValueError(f"rewards hold {int(bad.sum())} non-finite values (first at {where})")
