"""The run report's PNG plots (diagnostics/report.py writes the markdown around them).

matplotlib's object API (``Figure``, saved through the Agg canvas), imported inside the plotting
code: no display needed, and unlike ``matplotlib.use("Agg")`` it never switches the backend
(closing the figures) of a process that already uses pyplot.
"""

from __future__ import annotations

from pathlib import Path

from diagnostics.runs import Run, early_warning_step
from diagnostics.stats import PAPER_INTERCEPT, PAPER_R2, PAPER_SLOPE
from diagnostics.summary import augmented_groups


def _figure(nrows: int = 1):
    from matplotlib.figure import Figure  # headless: saved through the Agg canvas, no pyplot

    fig = Figure(figsize=(8, 1.0 + 2.8 * nrows), layout="constrained")
    return fig, list(fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0])


def _save(fig, path: Path, title: str, xlabel: str = "step", fraction: bool = True) -> None:
    fig.suptitle(title)
    fig.axes[-1].set_xlabel(xlabel)
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if fraction:
            ax.set_ylim(-0.02, 1.02)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    fig.savefig(path, dpi=100)


def _plot_reward_accuracy(run: Run, path: Path) -> str | None:
    if not run.series("reward/mean")[1] and not run.series("eval/accuracy")[1]:
        return "neither reward/mean nor eval/accuracy was logged"
    fig, (top, bottom) = _figure(2)
    top.plot(*run.series("reward/mean"), label="reward/mean (training samples)")
    top.set_ylabel("mean reward")
    bottom.plot(*run.series("eval/accuracy"), "o-", label="eval/accuracy (held-out pass@1)")
    for key in sorted(k for k in run.metric_names() if k.startswith("eval/pass@")):
        bottom.plot(*run.series(key), "s--", label=key)
    bottom.set_ylabel("held-out accuracy (fraction)")
    _save(fig, path, f"{run.name}: reward and held-out accuracy", fraction=False)
    return None


def _plot_acr(run: Run, path: Path) -> str | None:
    if not run.series("acr/raw")[1]:
        return "acr/raw was not logged"
    fig, (ax,) = _figure()
    both = [s for s, r in run.rows.items() if "acr/high" in r and "acr/low" in r]
    if both:  # the strata stack up to acr/raw
        strata = [[run.rows[s][k] for s in both] for k in ("acr/high", "acr/low")]
        labels = ["acr/high (all correct)", "acr/low (all wrong)"]
        ax.stackplot(both, *strata, alpha=0.3, labels=labels)
    ax.plot(*run.series("acr/raw"), color="C0", label="acr/raw (collapsed groups / groups)")
    ax.plot(*run.series("acr/effective"), color="C3", label="acr/effective (what the update lost)")
    ax.plot(*run.series("acr/ema"), "--", color="C0", alpha=0.6, label="acr/ema")
    warn = early_warning_step(run)
    if warn is not None:
        ax.axvline(warn, color="k", ls=":", label=f"early warning (step {warn})")
    ax.set_ylabel("fraction of groups")
    _save(fig, path, f"{run.name}: advantage collapse rate")
    return None


def _plot_avspo(run: Run, path: Path) -> str | None:
    steps, trig = run.series("avspo/triggered")
    if not any(run.series("avspo/tau_adapt")[1]) and not any(trig):
        return "no AVSPO activity (avspo/tau_adapt and avspo/triggered absent or 0, e.g. GRPO)"
    fig, (ax,) = _figure()
    ax.plot(*run.series("acr/raw"), color="0.5", label="acr/raw")
    ax.plot(*run.series("avspo/tau_adapt"), color="C1", label="avspo/tau_adapt (threshold)")
    # markers on the ACR curve: steps that augmented a group; decisions that found none apart
    did = {s for s, n in zip(*augmented_groups(run), strict=True) if n > 0}
    idle = [s for s, v in zip(steps, trig, strict=True) if v > 0.5 and s not in did]
    for marks, style, label in (
        (sorted(did), "^", f"augmented a group ({len(did)} of {len(steps)} steps)"),
        (idle, "x", f"triggered, nothing to augment ({len(idle)} steps)"),
    ):
        y = [run.rows[s].get("acr/raw", 1.0) for s in marks]
        ax.scatter(marks, y, marker=style, color="C3", zorder=3, label=label)
    ax.set_ylabel("fraction of groups")
    _save(fig, path, f"{run.name}: AVSPO trigger")
    return None


def _plot_wasted(run: Run, path: Path) -> str | None:
    steps, wasted = run.series("acr/wasted_token_frac")
    if not wasted:
        return "acr/wasted_token_frac was not logged"
    fig, (ax,) = _figure()
    ax.plot(steps, wasted, label="tokens of samples with A = 0 / response tokens")
    mean = sum(wasted) / len(wasted)
    ax.axhline(mean, color="k", ls=":", label=f"mean {mean:.3f}")
    ax.set_ylabel("wasted-token share")
    _save(fig, path, f"{run.name}: wasted response tokens")
    return None


PLOTS = (  # file name, section title, plotting function (returns a skip note or None)
    ("reward_accuracy.png", "Reward and held-out accuracy", _plot_reward_accuracy),
    ("acr.png", "ACR: raw vs effective, with the high/low strata", _plot_acr),
    ("avspo.png", "AVSPO triggers and tau_adapt", _plot_avspo),
    ("wasted_tokens.png", "Wasted-token share", _plot_wasted),
)


def plot_run(run: Run) -> dict[str, str | None]:
    """Write the run's PNGs into its directory: file name -> None, or why it was skipped.

    A skipped plot's PNG left by an earlier report is removed, so the directory matches.
    """
    notes = {name: plot(run, run.path / name) for name, _, plot in PLOTS}
    for name, note in notes.items():
        if note is not None:
            (run.path / name).unlink(missing_ok=True)
    return notes


def plot_cross(points: list[tuple[str, float, float]], fit: tuple | None, path: Path) -> None:
    fig, (ax,) = _figure()
    xs, ys = [p[1] for p in points], [p[2] for p in points]
    ax.scatter(xs, ys, color="C0", zorder=3, label="runs")
    for label, x, y in points:
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    paper = f"paper: {PAPER_INTERCEPT} - {-PAPER_SLOPE} x (R^2 = {PAPER_R2})"
    ax.plot([0, 1], [PAPER_INTERCEPT, PAPER_INTERCEPT + PAPER_SLOPE], "--", c="0.5", label=paper)
    if fit is not None:
        (a, b, r2), lo, hi = fit, min(xs), max(xs)
        label = f"fit: {a:.1f} {'-' if b < 0 else '+'} {abs(b):.1f} x (R^2 = {r2})"
        ax.plot([lo, hi], [a + b * lo, a + b * hi], color="C3", label=label)
    ax.set_xlim(0, 1)
    ax.set_ylabel("final held-out accuracy (%)")
    _save(fig, path, "Final accuracy vs ACR100", "ACR100 (mean acr/raw, first 100 steps)", False)
