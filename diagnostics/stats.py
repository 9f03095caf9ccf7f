"""Small-sample statistics for comparing runs over seeds (launch/reproduce.py): mean, standard
deviation and a Student-t 95% confidence interval per cell, paired differences per seed against
a baseline, and a fitted line's 95% confidence band. Pure Python (no numpy, scipy or torch).

The t quantiles are the two-sided 95% critical values t_{0.975, df} (standard tables, e.g.
NIST/SEMATECH e-Handbook 1.3.6.7.2), exact to 3 decimals for df <= 30; beyond, the Cornish-Fisher
expansion z + (z^3 + z) / (4 df) (off by < 0.002 there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """The two-sided 95% Student-t critical value for ``df`` degrees of freedom.

    >>> t975(4), t975(30)
    (2.776, 2.042)
    >>> round(t975(1000), 3)  # 1.960 + (1.960^3 + 1.960) / 4000 = 1.962
    1.962
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


# The paper's early-ACR line over its 245 runs (arXiv 2605.21125): accuracy in percent.
PAPER_INTERCEPT, PAPER_SLOPE, PAPER_R2 = 51.4, -29.6, 0.617
PAPER_LINE = (
    f"accuracy (%) = {PAPER_INTERCEPT} - {-PAPER_SLOPE} x ACR100, R^2 = {PAPER_R2} "
    "(arXiv 2605.21125)"
)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line ``y = intercept + slope * x`` and its R^2: ``(intercept, slope, r2)``.

    With S_uv = sum_i (u_i - mean u)(v_i - mean v): slope = S_xy / S_xx,
    intercept = mean y - slope * mean x, R^2 = S_xy^2 / (S_xx * S_yy) (= 1 - SS_res / SS_tot).
    R^2 is nan when all y are equal (nothing to explain). Raises ValueError for fewer than two
    points, lists of different lengths, non-finite values, or all x equal (no line determined).

    Three points on y = 1 + 2x:

    >>> fit_line([0, 1, 2], [1, 3, 5])
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
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return my - slope * mx, slope, sxy * sxy / (sxx * syy)


@dataclass(frozen=True)
class Estimate:
    """``n`` values: their mean, sample standard deviation (n - 1) and the half-width of the 95%
    confidence interval of the mean (``t975(n - 1) * sd / sqrt(n)``); sd and ci are None for
    n < 2 (one seed says nothing about the spread)."""

    n: int
    mean: float | None
    sd: float | None
    ci: float | None

    def text(self, scale: float = 1.0, digits: int = 3) -> str:
        """``"0.512 +- 0.031 (n=5)"``; ``"n/a"`` without values."""
        if self.mean is None:
            return "n/a"
        out = f"{self.mean * scale:.{digits}f}"
        if self.ci is not None:
            out += f" +- {self.ci * scale:.{digits}f}"
        return f"{out} (n={self.n})"


def estimate(values: list[float | None]) -> Estimate:
    """Mean, sd and 95% CI of the finite values (None and nan are dropped).

    Hand check: [0.4, 0.5, 0.6] -> mean 0.5, sd = sqrt((0.01 + 0 + 0.01) / 2) = 0.1,
    ci = 4.303 * 0.1 / sqrt(3) = 0.248434.

    >>> e = estimate([0.4, 0.5, 0.6, None])
    >>> e.n, round(e.mean, 6), round(e.sd, 6), round(e.ci, 5)
    (3, 0.5, 0.1, 0.24843)
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Estimate(0, None, None, None)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(1, mean, None, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    return Estimate(n, mean, sd, t975(n - 1) * sd / math.sqrt(n))


def paired(values: dict[int, float | None], baseline: dict[int, float | None]) -> Estimate:
    """The per-seed difference ``values[s] - baseline[s]`` over the seeds both have (finite):
    the paired comparison, which removes what a seed does to both arms (the same prompts drawn,
    the same initial evaluation).

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
    >>> round(f.band(1.5), 6) == round(4.303 * math.sqrt(0.35) * math.sqrt(0.25), 6)
    True
    """
    intercept, slope, r2 = fit_line(xs, ys)
    n = len(xs)
    mean_x = math.fsum(xs) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    ss_res = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    s = math.sqrt(ss_res / (n - 2)) if n > 2 else math.nan
    return Fit(intercept, slope, r2, n, s, mean_x, sxx)
