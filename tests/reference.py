"""Slow, loop-over-groups reference implementations, written straight from docs/ARCHITECTURE.md
section 4.

They share no code with ``learner/advantage.py`` or ``diagnostics/`` (plain Python floats and the
``statistics`` module), so agreement between the two is evidence, not tautology.
"""

from __future__ import annotations

import math
import statistics

import torch


def _groups(group_ids: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        out.setdefault(g, []).append(i)
    return dict(sorted(out.items()))


def _collapsed(values: list[float], tau: float) -> bool:
    return len(values) == 1 or statistics.pstdev(values) < tau


def _std(values: list[float], unbiased: bool) -> float:
    return statistics.stdev(values) if unbiased else statistics.pstdev(values)


def _div(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def ref_collapse(rewards, group_ids, tau=1e-6, r_lo=0.0):
    groups = _groups(group_ids)
    collapsed, high = [], []
    for idx in groups.values():
        vals = [rewards[i] for i in idx]
        c = _collapsed(vals, tau)
        collapsed.append(c)
        high.append(c and max(vals) > r_lo)
    m = len(groups)
    return {
        "acr": sum(collapsed) / m,
        "acr_high": sum(high) / m,
        "acr_low": (sum(collapsed) - sum(high)) / m,
        "collapsed": collapsed,
    }


def ref_grpo(rewards, group_ids, eps=1e-6, scale_by_std=True, unbiased=True, tau=1e-6):
    out = [0.0] * len(rewards)
    for idx in _groups(group_ids).values():
        vals = [rewards[i] for i in idx]
        if _collapsed(vals, tau):
            continue
        mean = statistics.fmean(vals)
        for i in idx:
            c = rewards[i] - mean
            out[i] = _div(c, _std(vals, unbiased) + eps) if scale_by_std else c
    return out


def ref_rloo(rewards, group_ids, tau=1e-6):
    out = [0.0] * len(rewards)
    for idx in _groups(group_ids).values():
        vals = [rewards[i] for i in idx]
        if _collapsed(vals, tau):
            continue
        for i in idx:
            others = [rewards[j] for j in idx if j != i]
            out[i] = rewards[i] - statistics.fmean(others)
    return out


def ref_avspo(
    rewards,
    group_ids,
    *,
    tau_adapt,
    alpha=0.5,
    tau=1e-6,
    eps=1e-6,
    strategy="stratified",
    r_anchor=0.1,
    reward_range=(0.0, 1.0),
    k=None,
    unbiased=True,
    random_values=None,
):
    """``random_values``: an iterator of the uniform draws in [0, 1), consumed group by group."""
    r_lo, r_hi = reward_range
    groups = _groups(group_ids)
    acr = sum(_collapsed([rewards[i] for i in idx], tau) for idx in groups.values()) / len(groups)
    out = ref_grpo(rewards, group_ids, eps=eps, unbiased=unbiased, tau=tau)
    ks = []
    for idx in groups.values():
        vals = [rewards[i] for i in idx]
        if not (_collapsed(vals, tau) and acr > tau_adapt):
            ks.append(0)
            continue
        g = len(vals)
        if strategy == "opposite" and k is None:
            kk = 1
        elif k is not None:
            kk = max(1, min(g, k))
        else:
            kk = max(1, min(g, math.ceil(g * acr**alpha - 1e-9)))
        r_obs = max(vals)
        if strategy == "stratified":
            if r_obs > r_lo:
                virt = [r_lo + (r_obs - r_lo) * (1 - j / (kk + 1)) for j in range(1, kk + 1)]
            else:
                virt = [
                    r_lo + r_anchor * (r_hi - r_lo) * (kk - j + 1) / kk for j in range(1, kk + 1)
                ]
        elif strategy == "fixed":
            virt = [0.5 * (r_lo + r_hi)] * kk
        elif strategy == "random":
            virt = [r_lo + (r_hi - r_lo) * next(random_values) for _ in range(kk)]
        else:  # opposite
            virt = [r_lo if r_obs > r_lo else r_hi] * kk
        union = vals + virt
        mean = statistics.fmean(union)
        std = _std(union, unbiased)
        for i in idx:
            out[i] = _div(rewards[i] - mean, std + eps)
        ks.append(kk)
    return out, ks, acr


def to_list(t: torch.Tensor) -> list:
    return t.tolist()
