"""AVSPO's virtual samples: how many per group, their values, and the union's moments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

STRATEGIES = ("stratified", "fixed", "random", "opposite")


@dataclass(frozen=True)
class VirtualSpec:
    """What AVSPO's virtual rewards are made of: the ``strategy`` (one of STRATEGIES), the task's
    ``reward_range`` (r_lo, r_hi) and ``r_anchor``, the top of an all-low group's values as a
    share of the range."""

    strategy: str
    reward_range: tuple[float, float]
    r_anchor: float


def virtual_counts(
    size: Tensor, acr: float, *, alpha: float, k: int | None, strategy: str
) -> Tensor:
    """K_j per group ``[M]`` (before masking by ``augmented``), always in [1, G_j].

    >>> virtual_counts(torch.tensor([8, 8, 3]), 0.5, alpha=0.5, k=None, strategy="stratified")
    tensor([6, 6, 3])
    """
    if strategy == "opposite" and k is None:  # the authors' code: one sample
        return torch.ones_like(size)
    if k is not None:
        want = torch.full_like(size, int(k))
    else:
        want = torch.ceil(size.to(torch.float64) * (acr**alpha) - 1e-9).to(size.dtype)
    return torch.minimum(want, size).clamp(min=1)


def virtual_rewards(
    spec: VirtualSpec, k_total: Tensor, r_obs: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Virtual rewards of A groups as ``[A, Kmax]``, row j holding v_1..v_K of group j (K =
    ``k_total[j]``) and zeros after; ``r_obs [A]`` is each group's max real reward.

    >>> spec = VirtualSpec("stratified", reward_range=(0.0, 1.0), r_anchor=0.1)
    >>> v = virtual_rewards(spec, torch.tensor([3, 2]), torch.tensor([1.0, 0.0]))
    >>> [[round(x, 6) for x in row] for row in v.tolist()]  # 1*(1-k/4) | 0.1*(2-k+1)/2
    [[0.75, 0.5, 0.25], [0.1, 0.05, 0.0]]
    """
    strategy, (r_lo, r_hi), r_anchor = spec.strategy, spec.reward_range, spec.r_anchor
    dtype = r_obs.dtype
    k_max = int(k_total.max())
    k_pos = torch.arange(1, k_max + 1, dtype=dtype)[None, :]  # [1, Kmax] k = 1..Kmax
    kk = k_total.to(dtype)[:, None]  # [A, 1]
    valid = k_pos <= kk  # [A, Kmax]
    r_obs = r_obs[:, None]  # [A, 1]
    if strategy == "stratified":
        down = r_lo + (r_obs - r_lo) * (1 - k_pos / (kk + 1))
        up = r_lo + r_anchor * (r_hi - r_lo) * (kk - k_pos + 1) / kk
        values = torch.where(r_obs > r_lo, down, up)
    elif strategy == "fixed":
        values = torch.full(valid.shape, 0.5 * (r_lo + r_hi), dtype=dtype)
    elif strategy == "random":  # drawn in group order, k = 1..K within a group
        values = torch.zeros(valid.shape, dtype=dtype)
        draws = torch.rand(int(k_total.sum()), generator=generator, dtype=dtype)
        values[valid] = r_lo + (r_hi - r_lo) * draws
    elif strategy == "opposite":
        values = torch.where(r_obs > r_lo, r_lo, r_hi).to(dtype).expand(valid.shape)
    else:
        raise ValueError(f"unknown AVSPO strategy {strategy!r}; expected one of {STRATEGIES}")
    return torch.where(valid, values, torch.zeros((), dtype=dtype))


def virtual_moments(
    spec: VirtualSpec, k_total: Tensor, r_obs: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Mean and population variance ``[A]`` of each augmented group's K virtual rewards.

    Closed form for the deterministic strategies, so that no ``[A, K]`` tensor is built: the
    ``stratified`` values are an arithmetic sequence a + b * j/n, j = 1..K, whose mean is
    a + b * (K+1) / (2n) and variance b^2 * (K^2 - 1) / (12 n^2) (n = K+1 for a high group,
    n = K for a low one). ``random`` computes them from its draws (:func:`virtual_rewards`).

    >>> spec = VirtualSpec("stratified", reward_range=(0.0, 1.0), r_anchor=0.1)
    >>> m, v = virtual_moments(spec, torch.tensor([6]), torch.tensor([1.0]))
    >>> round(m.item(), 6), round(v.item(), 6)  # mean of 1/7..6/7 = 1/2, var 35/588
    (0.5, 0.059524)
    """
    strategy, (r_lo, r_hi), r_anchor = spec.strategy, spec.reward_range, spec.r_anchor
    kk = k_total.to(r_obs.dtype)
    if strategy == "stratified":
        high = r_obs > r_lo
        step = torch.where(high, r_obs - r_lo, torch.full_like(r_obs, r_anchor * (r_hi - r_lo)))
        n = torch.where(high, kk + 1, kk)
        mean = r_lo + step * (kk + 1) / (2 * n)
        var = step * step * (kk * kk - 1) / (12 * n * n)
        return mean, var
    if strategy == "fixed":
        return torch.full_like(r_obs, 0.5 * (r_lo + r_hi)), torch.zeros_like(r_obs)
    if strategy == "opposite":
        return torch.where(r_obs > r_lo, r_lo, r_hi).to(r_obs.dtype), torch.zeros_like(r_obs)
    if strategy == "random":
        values = virtual_rewards(spec, k_total, r_obs, generator)  # [A, Kmax], zero past K
        mean = values.sum(1) / kk
        valid = torch.arange(values.shape[1])[None, :] < k_total[:, None]
        dev = torch.where(valid, values - mean[:, None], torch.zeros((), dtype=values.dtype))
        return mean, (dev * dev).sum(1) / kk
    raise ValueError(f"unknown AVSPO strategy {strategy!r}; expected one of {STRATEGIES}")


def union_moments(g_real, mean_r, m2_r, n_virt, mean_v, var_v) -> tuple[Tensor, Tensor]:
    """Mean and M2 of R_j u V_j from the two parts' moments (Chan et al.'s parallel formula):
    M2_u = M2_R + M2_V + G K / (G + K) * (mean_R - mean_V)^2, with M2_V = K var_V. Real samples
    are not touched."""
    mean_u = (g_real * mean_r + n_virt * mean_v) / (g_real + n_virt)
    gap = mean_r - mean_v
    return mean_u, m2_r + n_virt * var_v + g_real * n_virt / (g_real + n_virt) * gap * gap
