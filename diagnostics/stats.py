"""Small-sample statistics for comparing runs over seeds (launch/experiments/aggregate.py): mean,
standard deviation and a Student-t 95% confidence interval per cell, paired differences per seed
against a baseline with their t-test p-values, the Holm adjustment over a family of comparisons, a
fitted line's 95% confidence band, and the R^2 one predictor adds to another.

The quantiles, tests and regressions come from scipy.stats and statsmodels, not from formulas
written here; what is written here is only which of them a figure uses. Both are imported where
they are used (a run's report imports this module for the paper's line). No Ray, vLLM, DeepSpeed
or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def t975(df: int) -> float:
    """The two-sided 95% Student-t critical value for ``df`` degrees of freedom
    (``scipy.stats.t.ppf(0.975, df)``).

    Tables give 2.776 at 4 dof, 2.042 at 30 and 1.962 at 1000:

    >>> round(t975(4), 3), round(t975(30), 3), round(t975(1000), 3)
    (2.776, 2.042, 1.962)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    from scipy import stats as sps

    return float(sps.t.ppf(0.975, df))


# The paper's early-ACR line over its 245 runs (arXiv 2605.21125): accuracy in percent.
PAPER_INTERCEPT, PAPER_SLOPE, PAPER_R2 = 51.4, -29.6, 0.617
PAPER_LINE = (
    f"accuracy (%) = {PAPER_INTERCEPT} - {-PAPER_SLOPE} x ACR100, R^2 = {PAPER_R2} "
    "(arXiv 2605.21125)"
)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line ``y = intercept + slope * x`` and its R^2: ``(intercept, slope, r2)``
    (``scipy.stats.linregress``). R^2 is nan when all y are equal (nothing to explain). Raises
    ValueError for fewer than two points, lists of different lengths, non-finite values, or all
    x equal (no line determined).

    Three points on y = 1 + 2x:

    >>> tuple(round(v, 9) for v in fit_line([0, 1, 2], [1, 3, 5]))
    (1.0, 2.0, 1.0)

    x = 0..3, y = 1, 2, 2, 4: means 1.5 and 2.25; S_xx = 2.25 + 0.25 + 0.25 + 2.25 = 5,
    S_xy = 1.875 + 0.125 - 0.125 + 2.625 = 4.5, S_yy = 1.5625 + 0.0625 + 0.0625 + 3.0625 = 4.75;
    slope = 4.5 / 5 = 0.9, intercept = 2.25 - 0.9 * 1.5 = 0.9, R^2 = 20.25 / 23.75 = 81 / 95.

    >>> a, b, r2 = fit_line([0, 1, 2, 3], [1, 2, 2, 4])
    >>> round(a, 9), round(b, 9), round(r2, 9) == round(81 / 95, 9)
    (0.9, 0.9, True)
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"a line needs >= 2 (x, y) pairs, got {len(xs)} x and {len(ys)} y")
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if not all(math.isfinite(v) for v in xs + ys):
        raise ValueError("fit_line needs finite values")
    if max(xs) == min(xs):
        raise ValueError(f"all x values equal {xs[0]}: no line (and no R^2) is determined")
    if max(ys) == min(ys):
        return ys[0], 0.0, math.nan
    from scipy import stats as sps

    res = sps.linregress(xs, ys)
    return float(res.intercept), float(res.slope), float(res.rvalue) ** 2


@dataclass(frozen=True)
class Estimate:
    """``n`` values: their mean, sample standard deviation (n - 1), the half-width of the 95%
    confidence interval of the mean (``t975(n - 1) * sd / sqrt(n)``) and the two-sided p-value
    of the one-sample t-test of mean 0 (``scipy.stats.ttest_1samp``; meaningful for a paired
    difference); sd, ci and p are None for n < 2 (one seed says nothing about the spread), p is
    also None when every value is equal (sd 0: no test)."""

    n: int
    mean: float | None
    sd: float | None
    ci: float | None
    p: float | None = None

    def text(self, scale: float = 1.0, digits: int = 3) -> str:
        """``"0.512 +- 0.031 (n=5)"``; ``"n/a"`` without values."""
        if self.mean is None:
            return "n/a"
        out = f"{self.mean * scale:.{digits}f}"
        if self.ci is not None:
            out += f" +- {self.ci * scale:.{digits}f}"
        return f"{out} (n={self.n})"


def estimate(values: list[float | None]) -> Estimate:
    """Mean, sd, 95% CI and t-test p-value of the finite values (None and nan are dropped).

    Hand check: [0.4, 0.5, 0.6] -> mean 0.5, sd = sqrt((0.01 + 0 + 0.01) / 2) = 0.1,
    ci = t975(2) 4.302653 * 0.1 / sqrt(3) = 0.248414; t = 0.5 / (0.1 / sqrt(3)) = 8.660 on 2 dof.

    >>> e = estimate([0.4, 0.5, 0.6, None])
    >>> e.n, round(e.mean, 6), round(e.sd, 6), round(e.ci, 5), round(e.p, 4)
    (3, 0.5, 0.1, 0.24841, 0.0131)
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Estimate(0, None, None, None)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(1, mean, None, None)
    sd = float(np.std(xs, ddof=1))
    from scipy import stats as sps

    p = float(sps.ttest_1samp(xs, 0.0).pvalue) if sd > 0 else None
    return Estimate(n, mean, sd, t975(n - 1) * sd / math.sqrt(n), p)


def paired(values: dict[int, float | None], baseline: dict[int, float | None]) -> Estimate:
    """The per-seed difference ``values[s] - baseline[s]`` over the seeds both have (finite):
    the paired comparison, which removes what a seed does to both arms (the same prompts drawn,
    the same initial evaluation). Its ``p`` is the paired t-test's.

    >>> e = paired({0: 0.5, 1: 0.7, 2: 0.6}, {0: 0.4, 1: 0.5, 2: 0.6, 3: 0.9})
    >>> e.n, round(e.mean, 6)  # diffs 0.1, 0.2, 0.0 (seed 3 has no pair)
    (3, 0.1)
    """
    diffs = []
    for seed, v in values.items():
        b = baseline.get(seed)
        if v is None or b is None or not (math.isfinite(v) and math.isfinite(b)):
            continue
        diffs.append(v - b)
    return estimate(diffs)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (statsmodels' ``multipletests``):
    the adjusted value is below 0.05 exactly where Holm rejects at a 5% family-wise error rate.

    Sorted p = 0.01, 0.02, 0.04 of 3 tests: 3 x 0.01 = 0.03, max(0.03, 2 x 0.02) = 0.04,
    max(0.04, 1 x 0.04) = 0.04 (each in the input's order):

    >>> [round(p, 6) for p in holm([0.04, 0.01, 0.02])]
    [0.04, 0.03, 0.04]
    """
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(pvalues, alpha=0.05, method="holm")[1]]


@dataclass(frozen=True)
class Fit:
    """A least-squares line ``y = intercept + slope * x`` over ``n`` points, its R^2, and what
    its 95% confidence band needs: residual sd ``s`` (n - 2 dof), mean x and S_xx."""

    intercept: float
    slope: float
    r2: float
    n: int
    s: float
    mean_x: float
    sxx: float

    def band(self, x: float) -> float:
        """Half-width of the 95% confidence band of the fitted mean at ``x``:
        ``t975(n - 2) * s * sqrt(1/n + (x - mean_x)^2 / S_xx)`` (nan for n < 3)."""
        if self.n < 3:
            return math.nan
        return t975(self.n - 2) * self.s * math.sqrt(1 / self.n + (x - self.mean_x) ** 2 / self.sxx)


def fit(xs: list[float], ys: list[float]) -> Fit:
    """Least squares with the band's ingredients (:func:`fit_line` for the line).

    Hand check on (0, 1), (1, 2), (2, 2), (3, 4): intercept 0.9, slope 0.9, residuals 0.1, 0.2,
    -0.7, 0.4, SS_res = 0.01 + 0.04 + 0.49 + 0.16 = 0.7, s = sqrt(0.7 / 2), S_xx = 5.

    >>> f = fit([0, 1, 2, 3], [1, 2, 2, 4])
    >>> round(f.s, 6) == round(math.sqrt(0.35), 6), f.sxx
    (True, 5.0)
    >>> round(f.band(1.5), 6) == round(t975(2) * math.sqrt(0.35) * math.sqrt(0.25), 6)
    True
    """
    intercept, slope, r2 = fit_line(xs, ys)
    n = len(xs)
    mean_x = math.fsum(xs) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    ss_res = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    s = math.sqrt(ss_res / (n - 2)) if n > 2 else math.nan
    return Fit(intercept, slope, r2, n, s, mean_x, sxx)


@dataclass(frozen=True)
class AddedR2:
    """What predictor ``x`` adds to ``y ~ base``: R^2 of ``y ~ base`` and of ``y ~ base + x``
    over ``n`` points, their difference, the partial F-test's p-value, and ``x``'s coefficient
    in the full fit."""

    n: int
    r2_base: float
    r2_full: float
    added: float
    p: float
    coef: float


def added_r2(base: list[float], x: list[float], y: list[float]) -> AddedR2:
    """Ordinary least squares (statsmodels) of ``y`` on ``base`` alone and on ``base`` and
    ``x``: the R^2 that ``x`` adds given ``base``, and the F-test of the nested models.

    y = base + x exactly, with x not a function of base: the base alone leaves x's share, the
    full fit explains everything (added = 1 - r2_base) with coefficient 1:

    >>> a = added_r2([0, 1, 2, 3, 4], [1, 0, 1, 0, 2], [1, 1, 3, 3, 6])
    >>> round(a.r2_full, 9), round(a.added, 9) == round(1 - a.r2_base, 9), round(a.coef, 9)
    (1.0, True, 1.0)
    """
    import statsmodels.api as sm

    n = len(y)
    if not (len(base) == len(x) == n) or n < 4:
        raise ValueError(
            f"added_r2 needs >= 4 points of equal length, got {len(base)}/{len(x)}/{n}"
        )
    b = sm.add_constant(np.asarray(base, dtype=float))
    full = np.column_stack([b, np.asarray(x, dtype=float)])
    ys = np.asarray(y, dtype=float)
    small, big = sm.OLS(ys, b).fit(), sm.OLS(ys, full).fit()
    if big.ssr <= 1e-12 * max(1.0, float(np.sum((ys - ys.mean()) ** 2))):
        p = 0.0  # x explains the rest exactly: no residual variance to test against
    else:
        p = float(big.compare_f_test(small)[1])
    return AddedR2(n, float(small.rsquared), float(big.rsquared),
                   float(big.rsquared - small.rsquared), p, float(big.params[-1]))  # fmt: skip
