"""The aggregate of an experiment's rows: estimates over seeds, paired differences, fitted
lines, plots, and the markdown written into docs/RESULTS.md."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from diagnostics.stats import (
    PAPER_INTERCEPT,
    PAPER_LINE,
    PAPER_SLOPE,
    Estimate,
    estimate,
    fit,
    paired,
)
from launch.experiments import FIGURES, ROOT, Experiment, cell_id
from launch.grid import command, latest, models_of, read_rows, rows_of

# --- the aggregate --------------------------------------------------------------------------


def equal_token_accuracy(rows: list[dict]) -> dict[int, float | None]:
    """Per row (by index): greedy accuracy at the last evaluation whose cumulative rollout
    tokens fit the smallest total of the group, so that arms that generate more (DAPO's
    resampling, more steps) are compared at the same generation budget."""
    totals = [r["generated_tokens"] for r in rows if r.get("generated_tokens")]
    if not totals:
        return {}
    budget = min(totals)
    out = {}
    for i, r in enumerate(rows):
        fits = [e for e in r.get("evals", []) if e["generated_tokens"] <= budget + 1e-9]
        out[i] = fits[-1]["accuracy"] if fits else None
    return out


@dataclass
class CellStats:
    cell: dict[str, str]
    figures: dict[str, Estimate]
    versus: dict[str, Estimate]  # paired difference against the baseline cell, per figure
    seeds: list[int]
    failed: list[tuple[int, str]]


def aggregate(exp: Experiment, rows: list[dict], model: str | None = None) -> list[CellStats]:
    """Per cell: each figure's estimate over the seeds with an ok row, and paired differences
    against the baseline cell (the same cell with the baseline's axis values); with ``model``,
    over the rows made from those weights only (:func:`rows_of`)."""
    done = latest(rows_of(rows, model), exp)
    ok = {key: r for key, r in done.items() if r.get("status") == "ok"}
    # accuracy at equal rollout tokens, within each table group (and seed-independent budget)
    groups: dict[str, list[tuple[str, int]]] = {}
    for key in ok:
        cell = ok[key]["cell"]
        groups.setdefault(cell.get(exp.tables_by, "") if exp.tables_by else "", []).append(key)
    for keys in groups.values():
        for i, acc in equal_token_accuracy([ok[k] for k in keys]).items():
            ok[keys[i]]["acc_at_equal_tokens"] = acc
    out = []
    for cell in exp.cells:
        cid = cell_id(cell)
        mine = {seed: ok.get((cid, seed)) for seed in exp.seeds}
        mine = {s: r for s, r in mine.items() if r is not None}
        base_cell = {**cell, **exp.baseline}
        base = {s: ok.get((cell_id(base_cell), s)) for s in exp.seeds}
        base = {s: r for s, r in base.items() if r is not None}
        figures, versus = {}, {}
        for key, _, _ in FIGURES:
            figures[key] = estimate([r.get(key) for r in mine.values()])
            if exp.baseline and base_cell != cell:
                versus[key] = paired(
                    {s: r.get(key) for s, r in mine.items()},
                    {s: r.get(key) for s, r in base.items()},
                )
        failed = [
            (s, done[(cid, s)].get("error", "")[:200])
            for s in exp.seeds
            if (cid, s) in done and done[(cid, s)].get("status") != "ok"
        ]
        out.append(CellStats(cell, figures, versus, sorted(mine), failed))
    return out


def _fmt(e: Estimate | None, scale: float) -> str:
    if e is None or e.mean is None:
        return "n/a"
    digits = 1 if scale != 1.0 or abs(e.mean) >= 10 else 3  # seconds, tokens: 1; fractions: 3
    out = f"{e.mean * scale:.{digits}f}"
    return out + (f" +- {e.ci * scale:.{digits}f}" if e.ci is not None else "")


def shown_path(p: Path) -> str:
    """``p`` relative to the repository when inside it."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def report_markdown(
    exp: Experiment, rows: list[dict], plots: dict[str | None, list[Path]] | None = None
) -> str:
    """The experiment's section of RESULTS.md: what was run, then per model weights the rows
    were made from (:func:`models_of`; one block unless the grid ran on CPUs that build different
    tiny models) its tables, fit, failed runs and ``plots[model]``, then every cell's command."""
    plots = plots or {}
    lines = [
        f"### {exp.name}",
        "",
        exp.description,
        "",
        "Figures: mean +- 95% CI half-width (Student t over seeds; none for one seed). Rerun or "
        f"continue: `python -m launch.reproduce {shown_path(exp.path)}`; rows: "
        f"`{shown_path(exp.results)}`. Rows are kept apart by the model weights they started "
        "from (`model` in a row): the tiny model's warm start depends on the CPU.",
        "",
    ]
    for model in models_of(exp, rows):
        lines += model_block(exp, rows_of(rows, model), model, plots.get(model, []))
    lines += ["<details><summary>The command of every cell (add trainer.seed=S)</summary>", ""]
    for cell in exp.cells:
        cmd = command(exp, cell, 0).removesuffix(" trainer.seed=0")
        lines.append(f"- {cell_id(cell)}: `{cmd}`")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def model_block(exp: Experiment, rows: list[dict], model: str | None, plots: list[Path]) -> list:
    """The tables, fit, failures and plots of the rows of one model's weights."""
    stats = aggregate(exp, rows)
    done = latest(rows, exp)
    n_ok = sum(r.get("status") == "ok" for r in done.values())
    total = len(exp.cells) * len(exp.seeds)
    hosts = "; ".join(sorted({r["host"] for r in done.values() if r.get("host")})) or "host unknown"
    lines = [
        f"#### Rows of model weights {model or '(unrecorded)'} ({hosts}): {len(done)} of "
        f"{total} runs ({n_ok} ok)",
        "",
    ]
    shown = [k for k, _, _ in FIGURES if k != "final_mean_at_k"]  # pass@k speaks for it
    heads = {k: (h, sc) for k, h, sc in FIGURES}
    group_values = list(exp.axes[exp.tables_by]) if exp.tables_by else [None]
    for value in group_values:
        part = [c for c in stats if value is None or c.cell[exp.tables_by] == value]
        if value is not None:
            lines += [f"**{exp.tables_by} = {value}**", ""]
        axes = [a for a in exp.axes if a != exp.tables_by]
        vs = " / ".join(f"{exp.baseline[a]}" for a in exp.baseline if a != exp.tables_by)
        header = [*axes, "seeds", *(heads[k][0] for k in shown)]
        if exp.baseline:
            header.insert(len(axes) + 2, f"final acc - {vs} (paired)")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + " --- |" * len(header))
        for c in part:
            cells = [c.cell[a] for a in axes] + [str(len(c.seeds))]
            cells += [_fmt(c.figures[k], heads[k][1]) for k in shown[:1]]
            if exp.baseline:
                cells.append(
                    _fmt(c.versus.get("final_accuracy"), 1.0) if c.versus else "(baseline)"
                )
            cells += [_fmt(c.figures[k], heads[k][1]) for k in shown[1:]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for i, one in enumerate(exp.fits):
        lines += fit_markdown(exp, rows, one, paper=i == 0)
    failed = [(c, s, e) for c in stats for s, e in c.failed]
    if failed:
        lines += ["Failed runs (recorded, not retried without `--retry-failed`):", ""]
        lines += [f"- {cell_id(c.cell)} seed {s}: {e}" for c, s, e in failed]
        lines.append("")
    for p in plots:
        rel = os.path.relpath(p, exp.report.parent)
        lines += [f"![{p.stem}]({rel})", ""]
    return lines


def fit_points(exp: Experiment, rows: list[dict], spec: dict) -> list[tuple[float, float]]:
    x, y = spec["x"], spec["y"]
    pts = []
    for r in latest(rows, exp).values():
        if r.get("status") == "ok" and r.get(x) is not None and r.get(y) is not None:
            pts.append((float(r[x]), float(r[y])))
    return pts


def fit_markdown(exp: Experiment, rows: list[dict], spec: dict, paper: bool = True) -> list[str]:
    """The fitted line (accuracy in %, as the paper) over every ok row, beside the paper's
    (``paper``: the first fit, the paper's predictor)."""
    pts = fit_points(exp, rows, spec)
    x, y = spec["x"], spec["y"]
    if len(pts) < 3 or len({p[0] for p in pts}) < 2:
        return [f"Fit of {y} on {x}: too few distinct points ({len(pts)}).", ""]
    f = fit([p[0] for p in pts], [100 * p[1] for p in pts])
    return [
        f"Fit over {f.n} runs: {y} (%) = {f.intercept:.1f} {'-' if f.slope < 0 else '+'} "
        f"{abs(f.slope):.1f} x {x}, R^2 = {f.r2:.3f}; 95% band half-width at the mean "
        f"{x} ({f.mean_x:.2f}): {f.band(f.mean_x):.1f} points."
        + (f" The paper: {PAPER_LINE}, over 245 runs of Qwen2.5 models on MATH." if paper else ""),
        "",
    ]


def write_plots(exp: Experiment, rows: list[dict], folder: Path, suffix: str = "") -> list[Path]:
    """Final accuracy per cell with 95% CI bars (one panel per table group); the fit's scatter,
    line, band and the paper's line. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    stats = aggregate(exp, rows)
    written = []
    values = list(exp.axes[exp.tables_by]) if exp.tables_by else [None]
    fig, axes = plt.subplots(1, len(values), figsize=(4 + 2.2 * len(values), 4), squeeze=False)
    for ax, value in zip(axes[0], values, strict=True):
        part = [c for c in stats if value is None or c.cell[exp.tables_by] == value]
        names = [",".join(v for a, v in c.cell.items() if a != exp.tables_by) for c in part]
        means = [c.figures["final_accuracy"].mean for c in part]
        cis = [c.figures["final_accuracy"].ci or 0.0 for c in part]
        xs = range(len(part))
        ax.errorbar(xs, [m if m is not None else math.nan for m in means], yerr=cis, fmt="o")
        ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{exp.tables_by} = {value}" if value is not None else exp.name, fontsize=9)
        ax.set_ylabel("final greedy accuracy (95% CI)")
    fig.tight_layout()
    path = folder / f"{exp.name}_final_accuracy{suffix}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    for i, spec in enumerate(exp.fits):
        pts = fit_points(exp, rows, spec)
        if len(pts) >= 3 and len({p[0] for p in pts}) >= 2:
            f = fit([p[0] for p in pts], [100 * p[1] for p in pts])
            fig, ax = plt.subplots(figsize=(5.5, 4))
            ax.scatter([p[0] for p in pts], [100 * p[1] for p in pts], s=12, label="runs")
            lo, hi = min(p[0] for p in pts), max(p[0] for p in pts)
            grid = [lo + (hi - lo) * i / 50 for i in range(51)]
            line = [f.intercept + f.slope * g for g in grid]
            band = [f.band(g) for g in grid]
            ax.plot(grid, line, label=f"fit, R^2 = {f.r2:.2f}")
            lower = [a - b for a, b in zip(line, band, strict=True)]
            upper = [a + b for a, b in zip(line, band, strict=True)]
            ax.fill_between(grid, lower, upper, alpha=0.2, label="95% band")
            if i == 0:  # the paper's predictor
                paper = [PAPER_INTERCEPT, PAPER_INTERCEPT + PAPER_SLOPE]
                ax.plot([0, 1], paper, "--", label="paper's line")
            ax.set_xlabel(spec["x"])
            ax.set_ylabel(f"{spec['y']} (%)")
            ax.legend(fontsize=7)
            fig.tight_layout()
            # the first fit (the paper's predictor) keeps the plain name
            name = f"{exp.name}_fit" + (f"_{spec['y']}_vs_{spec['x']}" if i else "")
            path = folder / f"{name}{suffix}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def write_report(exp: Experiment) -> Path:
    """Replace the experiment's section of ``exp.report`` (between its markers; appended when
    absent) with fresh tables and plots."""
    rows = read_rows(exp.results)
    plots = {}
    if rows:  # the main model's plots keep the plain names; another model's carry its id
        for i, model in enumerate(models_of(exp, rows)):
            suffix = f"_{model}" if i else ""
            plots[model] = write_plots(exp, rows_of(rows, model), exp.results.parent, suffix)
    begin, end = f"<!-- reproduce:{exp.name} begin -->", f"<!-- reproduce:{exp.name} end -->"
    section = f"{begin}\n{report_markdown(exp, rows, plots)}{end}"
    text = exp.report.read_text() if exp.report.exists() else "# Results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    exp.report.parent.mkdir(parents=True, exist_ok=True)
    exp.report.write_text(text)
    return exp.report
