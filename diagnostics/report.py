"""Run report and cross-run analysis: markdown summaries and PNG plots from run directories.

A run directory holds ``metrics.jsonl`` (required: one JSON object per line with ``step`` and
metric values, null for non-finite ones; step 0 is the evaluation before any update; a resumed
run may repeat a step, and then the step's *last* row wins), ``config.yaml`` (optional, the
resolved config), ``prompt_history.json`` (optional, the ACR monitor's per-prompt history) and
``samples.jsonl`` (optional: a few rollouts of the first and last steps are shown).
:func:`load_run` also reads other trainers' logs, a TRL ``trainer_state.json`` (or a directory
holding one) and a verl file-logger ``.jsonl``, into the same structure (diagnostics/external.py
says which keys); such a run is named ``trl:<dir>`` / ``verl:<file stem>``.

:func:`summarize` (diagnostics/summary.py) gives the headline numbers.

Cross-run (:func:`write_cross_run`): least squares of final accuracy *in percent* (our accuracies
are fractions in [0, 1], times 100) on ACR100, with R^2, beside the paper's line
(arXiv 2605.21125): accuracy (%) = 51.4 - 29.6 * ACR100, R^2 = 0.617.

Plots use matplotlib's object API (``Figure``, saved through the Agg canvas), imported inside the
plotting code: no display needed, and unlike ``matplotlib.use("Agg")`` it never switches the
backend (closing the figures) of a process that already uses pyplot.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from diagnostics.external import ExternalRun, RunDataError, find_format, load_external, read_bytes
from diagnostics.plots import PLOTS, plot_cross, plot_run
from diagnostics.runs import Run
from diagnostics.samples import report_lines as sample_lines
from diagnostics.stats import PAPER_INTERCEPT, PAPER_LINE, PAPER_SLOPE, fit_line
from diagnostics.summary import acr100_coverage, summarize

# --- loading ---------------------------------------------------------------------------------


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory, or a TRL / verl log (:func:`~diagnostics.external.find_format`);
    raise :class:`RunDataError` naming the file (and line or entry) on bad data."""
    path = Path(run_dir)
    if not path.exists():
        raise RunDataError(f"{path}: {'no such file' if path.suffix else 'no such directory'}")
    if find_format(path) is not None:
        return load_external(path)
    if not path.is_dir():
        raise RunDataError(f"{path}: not a directory (nor a TRL .json or verl .jsonl log)")
    return Run(
        path=path,
        rows=_load_metrics(path / "metrics.jsonl"),
        config=_load_config(path / "config.yaml"),
        prompt_history=_load_prompts(path / "prompt_history.json"),
    )


def _load_metrics(path: Path) -> dict[int, dict[str, float]]:
    if not path.is_file():
        raise RunDataError(
            f"{path}: missing (a run directory must hold metrics.jsonl; or give a TRL "
            "trainer_state.json, a directory holding one, or a verl file-logger .jsonl)"
        )
    rows: dict[int, dict[str, float]] = {}
    for lineno, raw in enumerate(read_bytes(path).splitlines(), start=1):
        if raw.strip():
            step, metrics = _parse_row(raw, f"{path}:{lineno}")
            rows[step] = metrics  # a resumed run repeats steps: the last row wins
    if not rows:
        raise RunDataError(f"{path}: no metric rows")
    return dict(sorted(rows.items()))


def _parse_row(raw: bytes, where: str) -> tuple[int, dict[str, float]]:
    try:
        row = json.loads(raw)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        raise RunDataError(f"{where}: not a valid JSON line ({getattr(err, 'msg', err)})") from None
    if not isinstance(row, dict):
        raise RunDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    step = row.pop("step", None)
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RunDataError(f"{where}: 'step' must be an integer >= 0, got {step!r}")
    for key, value in row.items():  # bool is an int: true/false read as 1/0
        if value is not None and not isinstance(value, (int, float)):
            raise RunDataError(f"{where}: {key!r} must be a number or null, got {value!r}")
    metrics = {key: _finite(value) for key, value in row.items()}
    return step, {key: value for key, value in metrics.items() if value is not None}


def _finite(value: float | None) -> float | None:
    """``value`` as a float, or None for null, NaN, +-Infinity and ints beyond float range."""
    try:
        value = None if value is None else float(value)
    except OverflowError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _load_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(read_bytes(path).decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RunDataError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if data is not None and not isinstance(data, dict):
        raise RunDataError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data or {}


def _load_prompts(path: Path) -> dict | None:
    """``{"summary": counts, "prompts": {key: [seen, all correct, all wrong]}}``, or None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(read_bytes(path))
    except ValueError as err:
        raise RunDataError(f"{path}: not valid JSON ({getattr(err, 'msg', err)})") from None
    prompts = data.get("prompts", {}) if isinstance(data, dict) else None
    if not isinstance(prompts, dict):
        raise RunDataError(f"{path}: expected {{'summary': {{...}}, 'prompts': {{...}}}}")
    for key, rec in prompts.items():
        if not (isinstance(rec, list) and len(rec) == 3 and all(isinstance(v, int) for v in rec)):
            raise RunDataError(f"{path}: prompt {key!r}: expected [seen, high, low], got {rec!r}")
    summary = data.get("summary")
    if not isinstance(summary, dict):  # derive it as ACRMonitor.prompt_summary does
        recs = prompts.values()
        summary = {
            "prompts_seen": len(prompts),
            "always_solved": sum(1 for n, h, _ in recs if h == n),
            "never_solved": sum(1 for n, _, lo in recs if lo == n),
        }
    return {"summary": summary, "prompts": prompts}


# --- run report ------------------------------------------------------------------------------


def _num(v, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _acc(v) -> str:
    return "n/a" if v is None else f"{v:.3f} ({100 * v:.1f}%)"


def _count(n: int | None) -> str:
    return "n/a" if n is None else str(n)


def _summary_table(s: dict) -> list[str]:
    warn, src = s["early_warning_step"], s["acr100_source"] or "no acr/raw logged"
    coverage = acr100_coverage(s)
    strata = f"{_num(s['mean_acr_high'])} / {_num(s['mean_acr_low'])}"
    verifier = f"{_num(s['mean_verifier_error_frac'])} / {_num(s['mean_verifier_timeout_frac'])}"
    shares = [f"{k} {100 * v:.0f}%" for k, v in s["timing_share"].items()]
    rows = [
        ("held-out accuracy at step 0", _acc(s["start_accuracy"])),
        (f"final held-out accuracy (step {s['final_accuracy_step']})", _acc(s["final_accuracy"])),
        (f"best held-out accuracy (step {s['best_accuracy_step']})", _acc(s["best_accuracy"])),
        ("mean training reward", _num(s["mean_reward"])),
        ("ACR100", f"{_num(s['acr100'])} ({f'{coverage}; ' if coverage else ''}{src})"),
        ("mean acr/raw (high / low)", f"{_num(s['mean_acr_raw'])} ({strata})"),
        ("mean acr/effective", _num(s["mean_acr_effective"])),
        (
            "AVSPO trigger rate: steps with an augmented group",
            f"{_num(s['trigger_rate'])} ({s['triggers']} steps)",
        ),
        (
            "AVSPO trigger decisions (ACR_t > tau_adapt)",
            f"{_num(s['decision_rate'])} ({s['decisions']} steps)",
        ),
        ("final tau_adapt", _num(s["final_tau_adapt"])),
        ("mean wasted-token share", _num(s["mean_acr_wasted_token_frac"])),
        ("early warning", "none" if warn is None else f"step {warn}"),
        ("verifier error / timeout share", verifier),
        ("training prompts dropped as over the context", _count(s["over_long_prompts"])),
        ("mean seconds per step", _num(s["time_per_step_s"], 2)),
        ("share of step time", ", ".join(shares) or "n/a"),
    ]
    return ["| quantity | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)]


def _paper_text(s: dict) -> str:
    text = f"The paper fits {PAPER_LINE} over its runs; runs with ACR100 > 0.5 rarely exceed 35%."
    if s["acr100"] is not None:
        final = "n/a" if s["final_accuracy"] is None else f"{100 * s['final_accuracy']:.1f}%"
        short = acr100_coverage(s, always=False)
        at = f"{s['acr100']:.3f}" + (f" ({short})" if short else "")
        text += (
            f" At this run's ACR100 = {at} its line gives "
            f"{PAPER_INTERCEPT + PAPER_SLOPE * s['acr100']:.1f}%; this run's final held-out "
            f"accuracy is {final}."
        )
    return text + " Its models and tasks differ from this run's: a reference, not a target."


def _prompt_lines(run: Run) -> list[str]:
    history = run.prompt_history
    if isinstance(run, ExternalRun):
        return [f"_No per-prompt history: {run.source} does not log one._"]
    if history is None:
        return ["_No prompt_history.json in the run directory._"]
    counts, prompts = history["summary"], history["prompts"]
    cells = [str(counts.get(k, "n/a")) for k in ("prompts_seen", "always_solved", "never_solved")]
    lines = [
        "| prompts seen | always solved (all correct every visit) | never solved (all wrong) |",
        "| --- | --- | --- |",
        f"| {' | '.join(cells)} |",
    ]
    stuck = [k for k, (n, _, lo) in prompts.items() if lo == n]
    stuck.sort(key=lambda k: -prompts[k][0])
    if stuck:
        shown = ", ".join(f"`{k}` ({prompts[k][0]} visits)" for k in stuck[:5])
        lines += ["", f"Most-visited never-solved prompts: {shown}."]
    return lines


def _verifier_lines(run: Run) -> list[str]:
    """The verifier's health (``verifier_health.json``, reward/health.py), when the run has it."""
    path = run.path / "verifier_health.json"
    if isinstance(run, ExternalRun) or not path.is_file():
        return []
    h = json.loads(read_bytes(path))
    errors = ", ".join(f"{c} {n}" for c, n in h["errors"].items()) or "none"
    lines = ["## Verifier", "", f"Restarts {h['restarts']}; errors by class: {errors}."]
    if h["alert_steps"]:
        steps = ", ".join(map(str, h["alert_steps"][:20]))
        alert = (
            f"the verifier failed on more than verifier.alert_frac of the samples at steps {steps}"
        )
        lines += ["", f"**Alert**: {alert}: those groups look collapsed (all incorrect)."]
    lines += ["", *(f"- step {t['step']}: `{t['text']}`" for t in h["first_texts"][:5])]
    return [*lines, ""]


def write_report(run_dir: str | Path | Run) -> Path:
    """Write ``report.md`` and its PNG plots into the run's directory (``run.path``; for a verl
    log ``<stem>_report/`` beside it); return the report's path. Takes a path or a loaded run."""
    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    s, notes = summarize(run), plot_run(run)
    what = [f"{k} {s[k]}" for k in ("algorithm", "task", "model", "seed") if s[k] is not None]
    if isinstance(run, ExternalRun):
        what = [
            f"read from the {run.source} log {run.source_file}; {'; '.join(run.notes.values())}"
        ]
    lines = [
        f"# Run report: {run.name}", "",
        f"{', '.join(what) or 'no config.yaml'}; last step {s['last_step']} of "
        f"{s['total_steps'] or '?'}.", "",
        "## Summary", "", *_summary_table(s), "",
        "## Compared with the paper", "", _paper_text(s), "", "## Plots", "",
    ]  # fmt: skip
    for name, title, _ in PLOTS:
        shown = f"![{title}]({name})" if notes[name] is None else f"_Skipped: {notes[name]}._"
        lines += [f"### {title}", "", shown, ""]
    lines += ["## Prompts", "", *_prompt_lines(run), "", *_verifier_lines(run)]
    lines += [] if isinstance(run, ExternalRun) else sample_lines(run.path)  # logger.samples
    path = run.path / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --- cross-run -------------------------------------------------------------------------------


def _labels(runs: list[Run]) -> list[str]:
    """Run names; paths below the runs' common parent where names alone would repeat (after
    ``trl:`` / ``verl:`` for other trainers' runs)."""
    names = [r.name for r in runs]
    if len(set(names)) == len(names):
        return names
    named = [r.origin if isinstance(r, ExternalRun) and r.origin else r.path for r in runs]
    try:
        base = os.path.commonpath([str(p.resolve().parent) for p in named])
        paths = [os.path.relpath(p.resolve(), base) for p in named]
    except ValueError:  # different drives
        paths = [str(p) for p in named]
    return [
        f"{r.source}:{p}" if isinstance(r, ExternalRun) else p
        for r, p in zip(runs, paths, strict=True)
    ]


def _cross_fit(points: list[tuple[str, float, float]]) -> tuple[tuple | None, str]:
    """Fit accuracy (%) on ACR100 over ``(label, acr100, accuracy %)``: (fit or None, sentence)."""
    if len(points) < 2:
        n = len(points)
        return None, f"No fit: a line needs 2+ runs with ACR100 and a final accuracy, got {n}."
    try:
        a, b, r2 = fit_line([p[1] for p in points], [p[2] for p in points])
    except ValueError as err:
        return None, f"No fit: {err}."
    r2_text = "undefined (all final accuracies are equal)" if math.isnan(r2) else f"{r2:.3f}"
    return (a, b, r2_text), (
        f"Least squares over {len(points)} runs: accuracy (%) = {a:.3f} {'-' if b < 0 else '+'} "
        f"{abs(b):.3f} x ACR100; intercept = {a:.3f}, slope = {b:.3f}, R^2 = {r2_text}."
    )


def _cross_row(label: str, run: Run, s: dict, out: Path) -> str:
    report = run.path / "report.md"
    name = f"[{label}]({os.path.relpath(report, out)})" if report.is_file() else label
    pct = [None if v is None else 100 * v for v in (s["start_accuracy"], s["final_accuracy"])]
    steps = "n/a" if s["acr100"] is None or s["acr100_steps"] is None else s["acr100_steps"]
    return (
        f"| {name} | {s['algorithm'] or 'n/a'} | {_num(s['acr100'])} | {steps} | "
        f"{_num(pct[0], 1)} | {_num(pct[1], 1)} | {_num(s['trigger_rate'])} |"
    )


def _short_note(short: list[tuple[str, dict]]) -> list[str]:
    """A sentence naming the runs whose ACR100 covers fewer steps than its window."""
    if not short:
        return []
    windows = {s["acr100_window"] for _, s in short}
    only = windows.pop() if len(windows) == 1 else None
    names = ", ".join(
        f"{label} ({s['acr100_steps']} steps)"
        if only is not None
        else f"{label} ({s['acr100_steps']} of {s['acr100_window']} steps)"
        for label, s in short
    )
    head = f"fewer than {only} steps" if only is not None else "fewer steps than its window"
    return [
        f"ACR100 covers {head}: {names}. Their ACR100 is the running mean over the steps they ran.",
        "",
    ]


def write_cross_run(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Write ``cross_run.md`` and ``acr100_vs_accuracy.png`` into ``out_dir``; return the .md path.

    Each run gives a point (ACR100, 100 x final accuracy); runs missing either are listed, not fit.
    """
    if not run_dirs:
        raise ValueError("write_cross_run needs at least one run directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    table = [
        "| run | algorithm | ACR100 | ACR100 steps | start acc. (%) | final acc. (%) | "
        "trigger rate |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    points, left_out, short = [], [], []
    for label, run in zip(_labels(runs), runs, strict=True):
        s = summarize(run)
        table.append(_cross_row(label, run, s, out))
        if acr100_coverage(s, always=False):
            short.append((label, s))
        if s["acr100"] is None or s["final_accuracy"] is None:
            why = f"no {'ACR100' if s['acr100'] is None else 'final accuracy'}"
            if isinstance(run, ExternalRun) and s["acr100"] is not None:
                why = run.notes.get("no_accuracy", why)  # the reader says why
            left_out.append(f"{label} ({why})")
        else:
            points.append((label, s["acr100"], 100 * s["final_accuracy"]))
    fit, sentence = _cross_fit(points)
    lines = [
        "# Final accuracy vs ACR100", "",
        "Units: ACR100 is a fraction of groups in [0, 1]; accuracy is held-out pass@1 in percent "
        "(our accuracies are fractions in [0, 1], times 100), the paper's unit.", "",
        *table, "", *_short_note(short), "## Fit", "", sentence, "", f"Paper: {PAPER_LINE}.", "",
    ]  # fmt: skip
    if left_out:
        lines += [f"Not in the fit: {', '.join(left_out)}.", ""]
    plot = out / "acr100_vs_accuracy.png"
    if points:
        plot_cross(points, fit, plot)
        lines += [f"![final accuracy vs ACR100]({plot.name})", ""]
    else:
        plot.unlink(missing_ok=True)
        lines += ["_No plot: no run has both ACR100 and a final accuracy._", ""]
    path = out / "cross_run.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
