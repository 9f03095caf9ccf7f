r"""Group-relative advantage estimators: GRPO, Dr. GRPO, RLOO, AVSPO and DCPO, looked up by name.

Notation (docs/ARCHITECTURE.md section 4): group j holds the real rewards R_j = (r_j1..r_jG) of one
prompt's G samples (G may differ between groups). ``std`` is the unbiased std unless
``unbiased=False``. A group is *collapsed* when ``sigma_pop(R_j) < tau`` or G = 1 (see
``diagnostics/acr.py``), and ``ACR_t`` is the share of collapsed groups in the step.

- ``grpo``:    A_ji = (r_ji - mean(R_j)) / (std(R_j) + eps)
- ``dr_grpo``: A_ji = r_ji - mean(R_j)                                  (no std division)
- ``rloo``:    A_ji = r_ji - mean(R_j \ r_ji) = G/(G-1) * (r_ji - mean(R_j))
- ``avspo``:   as ``grpo``, except that when ``ACR_t > tau_adapt`` every collapsed group j gets
  K_j virtual rewards V_j joined to its statistics (paper Eq. 8-10, 13-14):
  A_ji = (r_ji - mean(R_j u V_j)) / (std(R_j u V_j) + eps), real samples only;
  K_j = max(1, min(G_j, ceil(G_j * ACR_t ** alpha))), or a fixed ``k`` (clipped to [1, G_j]).
- ``dcpo``: DCPO's smooth advantage standardisation (:func:`dcpo_advantages`): GRPO's
  advantage and one against every reward the prompt got so far, blended by the visit count,
  the smaller magnitude kept; needs each group's prompt key (per-prompt state, checkpointed).
- ``avspo_release``: the authors' released rule (their TRL fork): as ``grpo`` with eps = 1e-4,
  except that a group whose rewards all equal r_lo (or all equal r_hi) gets one virtual sample
  of the opposite label (r_hi, or r_lo) joined to its statistics; ``scope="step"`` fires only
  when the whole step is at one label (the fork's batch is one group: the two agree there).

Every collapsed group gets exactly 0 from ``grpo``/``dr_grpo``/``rloo`` (never NaN, whatever
eps). Virtual values for k = 1..K (r_lo, r_hi = the task's reward range):

- ``stratified`` (paper default): if r_obs = max(R_j) > r_lo:
  v_k = r_lo + (r_obs - r_lo) * (1 - k/(K+1));
  else v_k = r_lo + r_anchor * (r_hi - r_lo) * (K-k+1)/K.
- ``fixed``: v_k = (r_lo + r_hi) / 2.
- ``random``: v_k ~ Uniform(r_lo, r_hi) from the given generator (torch's global one if None).
- ``opposite`` (the authors' released code): K = 1 (or a fixed ``k``), v = r_hi for a low group,
  r_lo for a high one.

Departures from the paper, all ours: eps = 1e-6 (TRL uses 1e-4); the ``stratified`` formula is
written relative to r_lo and the range so that it equals the paper's exactly for rewards in
[0, 1] and stays meaningful for other ranges; ``ceil`` is taken of ``G * ACR**alpha - 1e-9`` so
that float rounding of an exact integer (e.g. 8 * 0.25 ** 0.5) does not add a sample; a fixed
``k`` is clipped to G_j like the adaptive one.

Worked example (docs/ARCHITECTURE.md section 4): G = 8 all correct, ACR_t = 0.5 > tau_adapt = 0.3
-> K = 6, v = 6/7..1/7, union mean 11/14, real advantage 0.7276 (population std) / 0.7011
(unbiased):

>>> r = torch.tensor([1.0] * 8 + [0.0, 1.0] * 4, dtype=torch.float64)
>>> g = torch.tensor([0] * 8 + [1] * 8)
>>> res = avspo_advantages(r, g, tau_adapt=0.3, eps=0.0)
>>> res.acr, res.k.tolist(), round(res.advantages[0].item(), 4)
(0.5, [6, 0], 0.7011)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from comm.collapse import CollapseStats, collapse_stats
from comm.groups import segment_sum
from learner.virtual_samples import (
    STRATEGIES,
    VirtualSpec,
    union_moments,
    virtual_counts,
    virtual_moments,
)

AUGMENT = ("both", "incorrect", "correct")  # which collapsed groups AVSPO may augment
RELEASE_SCOPES = ("group", "step")  # what the released rule tests for a single label


@dataclass(frozen=True)
class AdvantageResult:
    """What an estimator returns for one step."""

    advantages: Tensor  # [N] per sample, same dtype as the rewards
    collapsed: Tensor  # [M] bool
    augmented: Tensor  # [M] bool, got virtual samples
    num_virtual: int  # virtual samples added in the step
    acr: float  # ACR_t of the real rewards
    k: Tensor = field(repr=False)  # [M] long, virtual samples per group (0 if not augmented)
    triggered: bool = False  # AVSPO: ACR_t > tau_adapt; avspo_release: the rule fired somewhere
    stats: CollapseStats | None = field(default=None, repr=False)  # of the real rewards
    metrics: dict[str, float] = field(default_factory=dict)  # the estimator's own (dcpo/*)

    @property
    def group_index(self) -> Tensor:
        """``[N]`` long: group of each sample in 0..M-1 (ascending group id); built on demand."""
        return self.stats.groups.index


def result_of(stats: CollapseStats, advantages: Tensor, **extra) -> AdvantageResult:
    m = stats.groups.num
    base = dict(
        advantages=advantages,
        stats=stats,
        collapsed=stats.collapsed,
        augmented=torch.zeros(m, dtype=torch.bool),
        num_virtual=0,
        acr=stats.acr,
        k=torch.zeros(m, dtype=torch.long),
    )
    base.update(extra)
    return AdvantageResult(**base)


# Every estimator here is a per-group affine map A_ji = (r_ji - center_j) / denom_j: the group
# statistics are computed on [M]-sized tensors and the N samples are touched once, in
# apply_advantages.
# denom_j = +inf makes a group's advantages exactly 0 (collapsed groups, or a zero std with
# eps = 0), never NaN.


def apply_advantages(
    rewards: Tensor, stats: CollapseStats, center: Tensor, denom: Tensor
) -> Tensor:
    g = stats.groups
    return ((g.per_sample(rewards) - g.broadcast(center)) / g.broadcast(denom)).reshape(-1)


def zero_where(denom: Tensor, zero: Tensor | None = None) -> Tensor:
    """``denom`` with +inf where ``zero`` (or where it is not positive)."""
    bad = denom <= 0 if zero is None else zero | (denom <= 0)
    return torch.where(bad, torch.full_like(denom, torch.inf), denom)


def grpo_denominator(
    stats: CollapseStats, *, eps: float, scale_by_std: bool, unbiased: bool
) -> Tensor:
    size = stats.groups.size.to(stats.m2.dtype)
    if scale_by_std:
        dof = (size - 1 if unbiased else size).clamp(min=1)
        denom = torch.sqrt(stats.m2 / dof) + eps  # [M] std + eps
    else:
        denom = torch.ones_like(size)
    return zero_where(denom, stats.collapsed)


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    unbiased: bool = True,
    tau: float = 1e-6,
) -> AdvantageResult:
    """GRPO (``scale_by_std=True``) or Dr. GRPO (``False``) advantages.

    >>> res = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([5, 5, 5, 5]))
    >>> [round(a, 4) for a in res.advantages.tolist()]  # mean 0.25, unbiased std 0.5
    [1.5, -0.5, -0.5, -0.5]
    """
    stats = collapse_stats(rewards, group_ids, tau=tau)
    denom = grpo_denominator(stats, eps=eps, scale_by_std=scale_by_std, unbiased=unbiased)
    return result_of(
        stats, apply_advantages(rewards.to(stats.mean.dtype), stats, stats.mean, denom)
    )


def rloo_advantages(rewards: Tensor, group_ids: Tensor, *, tau: float = 1e-6) -> AdvantageResult:
    """RLOO: each sample's reward minus the mean of the *other* samples of its group.

    >>> res = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    >>> [round(a, 4) for a in res.advantages.tolist()]  # 1 - 0; 0 - 1/3
    [1.0, -0.3333, -0.3333, -0.3333]
    """
    stats = collapse_stats(rewards, group_ids, tau=tau)
    size = stats.groups.size.to(stats.mean.dtype)
    denom = zero_where((size - 1) / size, stats.collapsed)  # G = 1 groups are collapsed
    return result_of(
        stats, apply_advantages(rewards.to(stats.mean.dtype), stats, stats.mean, denom)
    )


def _check_avspo(strategy: str, augment: str, k: int | None, reward_range) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown AVSPO strategy {strategy!r}; expected one of {STRATEGIES}")
    if augment not in AUGMENT:
        raise ValueError(f"unknown AVSPO augment {augment!r}; expected one of {AUGMENT}")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 or None, got {k}")
    if not reward_range[0] < reward_range[1]:
        raise ValueError(f"reward_range must satisfy r_lo < r_hi, got {reward_range}")


def avspo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    tau_adapt: float,
    alpha: float = 0.5,
    tau: float = 1e-6,
    eps: float = 1e-6,
    strategy: str = "stratified",
    r_anchor: float = 0.1,
    reward_range: tuple[float, float] = (0.0, 1.0),
    k: int | None = None,
    unbiased: bool = True,
    generator: torch.Generator | None = None,
    augment: str = "both",
    trigger_acr: float | None = None,
) -> AdvantageResult:
    """AVSPO advantages (module docstring); non-augmented groups are bit-identical to GRPO.
    ``augment``: the paper's mechanism isolation, which collapsed groups may get virtual samples
    when the trigger fires: ``both`` (AVSPO), ``incorrect`` (all-incorrect groups only) or
    ``correct`` (all-correct groups only); the trigger and K_j still use the whole step's ACR.
    ``trigger_acr``: the ACR the trigger and K_j use instead of this step's (a window over
    recent steps: ``algorithm.trigger.acr_window``); ``result.acr`` stays this step's."""
    _check_avspo(strategy, augment, k, reward_range)
    stats = collapse_stats(rewards, group_ids, tau=tau, r_lo=reward_range[0])
    rewards = rewards.to(stats.mean.dtype)
    center = stats.mean
    denom = grpo_denominator(stats, eps=eps, scale_by_std=True, unbiased=unbiased)
    acr = stats.acr if trigger_acr is None else float(trigger_acr)
    triggered = acr > tau_adapt
    stratum = stats.collapsed  # "both"
    if augment == "correct":
        stratum = stats.high
    elif augment == "incorrect":
        stratum = stats.collapsed & ~stats.high
    augmented = stratum & triggered  # [M]
    if not bool(augmented.any()):
        return result_of(
            stats, apply_advantages(rewards, stats, center, denom), triggered=triggered
        )

    groups, dtype = stats.groups, rewards.dtype
    k_all = virtual_counts(groups.size, acr, alpha=alpha, k=k, strategy=strategy)
    k_all = torch.where(augmented, k_all, torch.zeros_like(k_all))  # [M]
    aug = augmented.nonzero().squeeze(1)  # [A] augmented groups
    k_aug = k_all[aug]  # [A]
    spec = VirtualSpec(strategy, reward_range, r_anchor)
    mean_v, var_v = virtual_moments(spec, k_aug, stats.max[aug], generator)  # [A] each

    g_real = groups.size[aug].to(dtype)  # [A]
    mean_u, m2_u = union_moments(
        g_real, stats.mean[aug], stats.m2[aug], k_aug.to(dtype), mean_v, var_v
    )
    dof = g_real + k_aug.to(dtype) - (1 if unbiased else 0)
    denom_u = zero_where(torch.sqrt(m2_u / dof) + eps)
    center = center.index_copy(0, aug, mean_u)
    denom = denom.index_copy(0, aug, denom_u)
    return result_of(
        stats,
        apply_advantages(rewards, stats, center, denom),
        augmented=augmented,
        num_virtual=int(k_aug.sum()),
        k=k_all,
        triggered=True,
    )


def avspo_release_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    eps: float = 1e-4,
    tau: float = 1e-6,
    reward_range: tuple[float, float] = (0.0, 1.0),
    unbiased: bool = True,
    scope: str = "group",
) -> AdvantageResult:
    """The authors' released AVSPO rule (their TRL fork; docs/ARCHITECTURE.md section 4,
    ``avspo_release``).

    The fork checks its *batch*: only when every reward of it equals r_lo (or every one equals
    r_hi; exact float equality, the rewards being binary) does the rule fire, and each group j
    then gets ONE virtual sample v of the opposite label (v = r_hi for all-r_lo, r_lo for
    all-r_hi); its real samples get A_ji = (r_ji - mean(R_j u {v})) / (std(R_j u {v}) + eps) over
    the G_j + 1 values (unbiased std by default), eps = 1e-4. Otherwise it is plain GRPO with the
    same eps (collapsed groups get exactly 0). The virtual sample has no tokens.

    ``scope`` says what the batch is. In every published setting of the fork it is one group
    (one prompt x G per optimizer step), so ``group`` (default; the preset's) applies the test to
    each group on its own: every group whose rewards all equal r_lo or all equal r_hi gets its
    opposite-label sample, whatever the other groups hold. ``step`` applies it to the whole step
    (a literal reading that at 64 groups of 8 practically never fires). On a one-group step the
    two are the same.

    How it differs from the paper's ``avspo`` (:func:`avspo_advantages`): the paper triggers per
    step when ACR_t > tau_adapt, and then augments every collapsed group, even when other groups
    of the step are informative; it adds K_t virtual samples valued by a strategy (``stratified``
    by default) and uses eps = 1e-6. The release fires on a group (or step) collapsed at a single
    label only (not at a partial credit), adds one opposite-label sample, has no threshold
    (``tau_adapt`` plays no part) and uses eps = 1e-4.

    Two groups of G = 2, all incorrect: v = 1 joins each, {0, 0, 1} has mean 1/3 and unbiased
    std sqrt((2/9 + 4/9) / 2) = sqrt(1/3), so A = -(1/3) / sqrt(1/3) = -0.5774 (eps = 0); all
    correct mirrors it. A step with one all-0 and one all-1 group: per group both fire (+-0.5774);
    per step it is plain GRPO (both groups collapsed: 0).

    >>> g = torch.tensor([0, 0, 1, 1])
    >>> res = avspo_release_advantages(torch.zeros(4), g, eps=0.0)
    >>> [round(a, 4) for a in res.advantages.tolist()], res.triggered, res.num_virtual
    ([-0.5774, -0.5774, -0.5774, -0.5774], True, 2)
    >>> res = avspo_release_advantages(torch.tensor([0.0, 0.0, 1.0, 1.0]), g, eps=0.0)
    >>> [round(a, 4) for a in res.advantages.tolist()], res.num_virtual
    ([-0.5774, -0.5774, 0.5774, 0.5774], 2)
    >>> res = avspo_release_advantages(torch.tensor([0.0, 0.0, 1.0, 1.0]), g, scope="step")
    >>> res.advantages.tolist(), res.triggered, res.num_virtual
    ([0.0, 0.0, 0.0, 0.0], False, 0)
    """
    r_lo, r_hi = reward_range
    if not r_lo < r_hi:
        raise ValueError(f"reward_range must satisfy r_lo < r_hi, got {reward_range}")
    if scope not in RELEASE_SCOPES:
        raise ValueError(f"unknown release scope {scope!r}; expected one of {RELEASE_SCOPES}")
    stats = collapse_stats(rewards, group_ids, tau=tau, r_lo=r_lo)
    groups = stats.groups
    # Exact equality on the rewards as given (before any dtype change), as the release does.
    lo = segment_sum((rewards != r_lo).to(torch.int64), groups) == 0  # [M] every reward r_lo
    hi = segment_sum((rewards != r_hi).to(torch.int64), groups) == 0  # [M] every reward r_hi
    if scope == "step":
        lo, hi = lo & bool(lo.all()), hi & bool(hi.all())
    augmented = lo | hi  # [M]
    rewards = rewards.to(stats.mean.dtype)
    dtype = rewards.dtype
    denom = grpo_denominator(stats, eps=eps, scale_by_std=True, unbiased=unbiased)
    if not bool(augmented.any()):
        return result_of(
            stats, apply_advantages(rewards, stats, stats.mean, denom), triggered=False
        )

    # An augmented group holds G_j copies of one value r (M2_R = 0) plus one virtual v: by
    # Chan's formula with K = 1, mean_u = (G r + v) / (G + 1), M2_u = G / (G + 1) * (r - v)^2.
    v = torch.where(lo, r_hi, r_lo).to(dtype)  # [M]
    g_real = groups.size.to(dtype)  # [M]
    gap = stats.mean - v
    mean_u = (g_real * stats.mean + v) / (g_real + 1)
    m2_u = g_real / (g_real + 1) * gap * gap
    dof = g_real + (0 if unbiased else 1)
    center = torch.where(augmented, mean_u, stats.mean)
    denom = torch.where(augmented, zero_where(torch.sqrt(m2_u / dof) + eps), denom)
    return result_of(
        stats,
        apply_advantages(rewards, stats, center, denom),
        augmented=augmented,
        num_virtual=int(augmented.sum()),
        k=augmented.to(torch.long),
        triggered=True,
    )
