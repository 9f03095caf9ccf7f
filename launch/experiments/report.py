"""An experiment's section of docs/RESULTS.md: the aggregate's tables (launch/experiments/
aggregate.py), the attempts replaced by later rows, fitted lines and plots."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from diagnostics.stats import PAPER_INTERCEPT, PAPER_LINE, PAPER_SLOPE, Estimate, added_r2, fit
from launch.experiments.aggregate import CellStats, aggregate, primary_key
from launch.experiments.experiment import ENDPOINTS, FIGURES, ROOT, Experiment, cell_id
from launch.experiments.grid import command, latest, models_of, read_rows, rows_of


def _fmt(e: Estimate | None, scale: float) -> str:
    if e is None or e.mean is None:
        return "n/a"
    digits = 1 if scale != 1.0 or abs(e.mean) >= 10 else 3  # seconds, tokens: 1; fractions: 3
    out = f"{e.mean * scale:.{digits}f}"
    return out + (f" +- {e.ci * scale:.{digits}f}" if e.ci is not None else "")


def _points(e: Estimate | None) -> str:
    """A fraction's paired difference in points: ``"+0.5 +- 0.9"``."""
    if e is None or e.mean is None:
        return "n/a"
    out = f"{100 * e.mean:+.1f}"
    return out + (f" +- {100 * e.ci:.1f}" if e.ci is not None else "")


def _share(e: Estimate | None, base_gain: float | None) -> str:
    """The difference as a share of the baseline's own gain: ``"+6% (-28..+40%)"``."""
    if e is None or e.mean is None or base_gain is None:
        return "n/a"
    if base_gain <= 0:
        return "n/a (baseline gained <= 0)"
    out = f"{100 * e.mean / base_gain:+.0f}%"
    if e.ci is not None:
        lo, hi = (e.mean - e.ci) / base_gain, (e.mean + e.ci) / base_gain
        out += f" ({100 * lo:+.0f}..{100 * hi:+.0f}%)"
    return out


def _holm(c: CellStats) -> str:
    if c.holm_p is None:
        return "(counted once)" if c.same_as and c.versus else "n/a"
    return f"{c.holm_p:.3f}" + (" (differs)" if c.holm_p < 0.05 else "")


def shown_path(p: Path) -> str:
    """``p`` relative to the repository when inside it."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def other_results(exp: Experiment) -> dict[str, list[dict]]:
    """The rows of the other experiments whose results files sit beside this one's."""
    folder = exp.results.parent
    if not folder.is_dir():
        return {}
    return {p.stem: read_rows(p) for p in sorted(folder.glob("*.jsonl")) if p != exp.results}


def report_markdown(
    exp: Experiment,
    rows: list[dict],
    plots: dict[str | None, list[Path]] | None = None,
    others: dict[str, list[dict]] | None = None,
) -> str:
    """The experiment's section of RESULTS.md: what was run, then per model weights the rows
    were made from (:func:`models_of`; one block unless the grid ran on CPUs that build different
    tiny models) its tables, fit, failed runs and ``plots[model]``, then every cell's command."""
    plots = plots or {}
    mean = exp.endpoint == "final_mean_at_k"
    primary = "final mean@k at T = 1" if mean else "final greedy accuracy"
    lines = [
        f"### {exp.name}",
        "",
        exp.description,
        "",
        "Figures: mean +- 95% CI half-width (Student t over seeds; none for one seed). 'Collapsed "
        "groups treated' is each arm's dose: the share of its collapsed groups whose samples got "
        "a non-zero advantage, 1 - ACR effective / ACR raw (negative under DAPO's filter, whose "
        "dropped groups count as lost). Differences "
        "are paired per seed against the baseline cell (or the partner the experiment registered "
        f"for the arm, named beside it), in points; the primary one ({primary}, "
        "the experiment's endpoint) also as a share of the baseline's own gain, with its paired "
        "t-test p-value Holm-adjusted over every comparison of the experiment (identical arms "
        "counted once). 'At equal tokens': both runs' curves interpolated at the smaller of "
        "their two rollout-token totals. Rerun or "
        f"continue: `python -m launch.reproduce {shown_path(exp.path)}`; rows: "
        f"`{shown_path(exp.results)}`. Rows are kept apart by the model weights they started "
        "from (`model` in a row): the tiny model's warm start depends on the CPU.",
        "",
    ]
    for model in models_of(exp, rows):
        lines += model_block(exp, rows_of(rows, model), model, plots.get(model, []), others)
    lines += ["<details><summary>The command of every cell (add trainer.seed=S)</summary>", ""]
    for cell in exp.cells:
        cmd = command(exp, cell, 0).removesuffix(" trainer.seed=0")
        lines.append(f"- {cell_id(cell)}: `{cmd}`")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(r) + " |" for r in body),
        "",
    ]


def model_block(
    exp: Experiment,
    rows: list[dict],
    model: str | None,
    plots: list[Path],
    others: dict[str, list[dict]] | None = None,
) -> list:
    """The tables, fit, failures and plots of the rows of one model's weights: per table group
    an outcome table (the primary endpoint first) and a collapse-and-cost table."""
    stats = aggregate(exp, rows, others=others)
    done = latest(rows, exp)
    n_ok = sum(r.get("status") == "ok" for r in done.values())
    total = len(exp.cells) * len(exp.seeds)
    hosts = "; ".join(sorted({r["host"] for r in done.values() if r.get("host")})) or "host unknown"
    lines = [
        f"#### Rows of model weights {model or '(unrecorded)'} ({hosts}): {len(done)} of "
        f"{total} runs ({n_ok} ok)",
        "",
    ]
    primary = primary_key(exp, list(done.values()))
    heads = {k: (h, sc) for k, h, sc in FIGURES}
    group_values = list(exp.axes[exp.tables_by]) if exp.tables_by else [None]
    axes = [a for a in exp.axes if a != exp.tables_by]
    vs = " / ".join(f"{exp.baseline[a]}" for a in exp.baseline if a != exp.tables_by) or "baseline"
    for value in group_values:
        part = [c for c in stats if value is None or c.cell[exp.tables_by] == value]
        if value is not None:
            lines += [f"**{exp.tables_by} = {value}**", ""]
        lines += _table(*outcome_table(exp, part, axes, primary, vs, heads))
        cost = ["acr_raw", "acr_effective", "acr_low", "acr_high", "early_acr",
                "generated_tokens", "grad_tokens", "wall_s"]  # fmt: skip
        body = [
            [*(c.cell[a] for a in axes), *(_fmt(c.figures[k], heads[k][1]) for k in cost)]
            for c in part
        ]
        lines += _table([*axes, *(heads[k][0] for k in cost)], body)
    for i, one in enumerate(exp.fits):
        lines += fit_markdown(exp, rows, one, paper=i == 0)
    failed = [(c, s, e) for c in stats for s, e in c.failed]
    if failed:
        lines += ["Failed runs (recorded, not retried without `--retry-failed`):", ""]
        lines += [f"- {cell_id(c.cell)} seed {s}: {log_excerpt(e, 200)}" for c, s, e in failed]
        lines.append("")
    lines += superseded_attempts(exp, rows, done)
    for p in plots:
        rel = os.path.relpath(p, exp.report.parent)
        lines += [f"![{p.stem}]({rel})", ""]
    return lines


def log_excerpt(text: str, n: int) -> str:
    r"""The first ``n`` characters of a run's output on one line: no terminal colours, and a
    command line in it shortened to ``launch.<name>`` (it is a log, not a documented command).

    >>> log_excerpt("\x1b[36m(Rank)\x1b[0m .venv/bin/python -m launch.train x=1\nboom", 60)
    '(Rank) .venv/bin/launch.train x=1 boom'
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\n", " ")
    return text.replace("python -m launch.", "launch.")[:n]


def superseded_attempts(exp: Experiment, rows: list[dict], done: dict) -> list[str]:
    """Every row that a later row of its cell and seed replaced (a failed attempt, then a retry),
    listed under the grid: the retry runs with ``trainer.resume=auto``, so where the attempt had
    saved a checkpoint, the row shown continues it (its wall time covers the continuation)."""
    kept = {(k, r.get("finished")) for k, r in done.items()}
    out = []
    for r in rows:
        key = (r.get("cell_id"), r.get("seed"))
        if key in done and (key, r.get("finished")) not in kept:
            why = log_excerpt(r.get("error") or "", 160)
            out.append(f"- {key[0]} seed {key[1]}: {r.get('status')} after "
                       f"{r.get('wall_s', float('nan')):.0f} s, {r.get('finished', '?')}"
                       + (f": {why}" if why else ""))  # fmt: skip
    if not out:
        return []
    head = ("Attempts replaced by a later row of the same cell and seed (the later row ran with "
            "`trainer.resume=auto`: it continues the attempt's last checkpoint where one was "
            "saved, and its wall time covers only the continuation):")  # fmt: skip
    return [head, "", *out, ""]


def outcome_table(exp, part, axes, primary, vs, heads) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the outcome table: the primary endpoint and its gain, its paired
    difference (in points, as a share of the baseline's gain, Holm), the same at equal tokens,
    then greedy accuracy (or mean@k when greedy is primary), pass@k, and which arm an arm is
    identical to (when one is)."""
    curve, gain, other = ENDPOINTS[primary]
    header = [*axes, "seeds", heads["dose"][0], heads[primary][0], heads[gain][0]]
    if exp.baseline:
        header += [f"minus {vs} (points, paired)", f"share of {vs}'s gain", "Holm p",
                   "minus it at equal tokens (points)"]  # fmt: skip
    header += [heads[other][0]] + ([f"minus {vs} (points)"] if exp.baseline else [])
    header.append(heads["final_pass_at_k"][0])
    same = any(c.same_as for c in part)
    header += ["identical to"] if same else []
    body = []
    for c in part:
        r = [*(c.cell[a] for a in axes), str(len(c.seeds)), _fmt(c.figures["dose"], 1.0)]
        r += [_fmt(c.figures[primary], 1.0), _fmt(c.figures[gain], 1.0)]
        base = not c.versus
        if exp.baseline and base:
            r += ["(baseline)"] * 4
        elif exp.baseline:
            mark = f" (vs {c.partner})" if c.partner else ""
            r += [
                _points(c.versus[primary]) + mark,
                _share(c.versus[primary], c.base_gain),
                _holm(c),
                _points(c.versus[f"{curve}_at_equal_tokens"]),
            ]
        r.append(_fmt(c.figures[other], 1.0))
        if exp.baseline:
            r.append("(baseline)" if base else _points(c.versus[other]))
        r.append(_fmt(c.figures["final_pass_at_k"], 1.0))
        r += [c.same_as or ""] if same else []
        body.append(r)
    return header, body


def fit_points(exp: Experiment, rows: list[dict], spec: dict) -> list[tuple[float, ...]]:
    """``(x, y)`` of every ok row that has both (``(x, y, base)`` when ``spec`` names a
    ``base`` key too)."""
    keys = [spec["x"], spec["y"], *([spec["base"]] if "base" in spec else [])]
    pts = []
    for r in latest(rows, exp).values():
        if r.get("status") == "ok" and all(r.get(k) is not None for k in keys):
            pts.append(tuple(float(r[k]) for k in keys))
    return pts


def fit_markdown(exp: Experiment, rows: list[dict], spec: dict, paper: bool = True) -> list[str]:
    """The fitted line (accuracy in %, as the paper) over every ok row, beside the paper's
    (``paper``: the first fit, the paper's predictor), and what the predictor adds given the
    starting accuracy (:func:`added_r2`): a final accuracy is mostly where the run started, so a
    predictor's own R^2 says little about what it adds."""
    pts = fit_points(exp, rows, spec)
    x, y = spec["x"], spec["y"]
    if len(pts) < 3 or len({p[0] for p in pts}) < 2:
        return [f"Fit of {y} on {x}: too few distinct points ({len(pts)}).", ""]
    f = fit([p[0] for p in pts], [100 * p[1] for p in pts])
    text = (
        f"Fit over {f.n} runs: {y} (%) = {f.intercept:.1f} {'-' if f.slope < 0 else '+'} "
        f"{abs(f.slope):.1f} x {x}, R^2 = {f.r2:.3f}; 95% band half-width at the mean "
        f"{x} ({f.mean_x:.2f}): {f.band(f.mean_x):.1f} points."
    )
    trio = fit_points(exp, rows, {"x": x, "y": y, "base": "start_accuracy"})
    if y != "start_accuracy" and len(trio) >= 4 and len({t[2] for t in trio}) >= 2:
        a = added_r2([t[2] for t in trio], [t[0] for t in trio], [t[1] for t in trio])
        text += (
            f" Given the starting accuracy (R^2 {a.r2_base:.3f} alone), {x} adds R^2 "
            f"{a.added:.3f} (to {a.r2_full:.3f}; partial F-test p = {a.p:.3g}, coefficient "
            f"{100 * a.coef:+.1f} points per unit of {x})."
        )
    if paper:
        text += f" The paper: {PAPER_LINE}, over 245 runs of Qwen2.5 models on MATH."
    return [text, ""]


def write_plots(exp: Experiment, rows: list[dict], folder: Path, suffix: str = "") -> list[Path]:
    """The primary endpoint per cell with 95% CI bars (one panel per table group); the fit's
    scatter, line, band and the paper's line. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    stats = aggregate(exp, rows)
    primary = primary_key(exp, list(latest(rows, exp).values()))
    label = {"final_mean_at_k": "final mean@k, T = 1", "final_accuracy": "final greedy accuracy"}
    written = []
    values = list(exp.axes[exp.tables_by]) if exp.tables_by else [None]
    fig, axes = plt.subplots(1, len(values), figsize=(4 + 2.2 * len(values), 4), squeeze=False)
    for ax, value in zip(axes[0], values, strict=True):
        part = [c for c in stats if value is None or c.cell[exp.tables_by] == value]
        names = [",".join(v for a, v in c.cell.items() if a != exp.tables_by) for c in part]
        means = [c.figures[primary].mean for c in part]
        cis = [c.figures[primary].ci or 0.0 for c in part]
        xs = range(len(part))
        ax.errorbar(xs, [m if m is not None else math.nan for m in means], yerr=cis, fmt="o")
        ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{exp.tables_by} = {value}" if value is not None else exp.name, fontsize=9)
        ax.set_ylabel(f"{label[primary]} (95% CI)")
    fig.tight_layout()
    path = folder / f"{exp.name}_{primary}{suffix}.png"
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
    section = f"{begin}\n{report_markdown(exp, rows, plots, other_results(exp))}{end}"
    text = exp.report.read_text() if exp.report.exists() else "# Results\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    exp.report.parent.mkdir(parents=True, exist_ok=True)
    exp.report.write_text(text)
    return exp.report
