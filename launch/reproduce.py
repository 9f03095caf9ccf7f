"""``python -m launch.reproduce EXPERIMENT``: a resumable grid of training runs, then statistics.

An experiment is a YAML file (``conf/reproduce/<name>.yaml``, or any path) naming a grid: the
``base`` overrides every run shares, ``axes`` (each a name -> {value: overrides}), ``seeds`` and a
``baseline`` cell. Every (cell, seed) is one ``python -m launch.train`` subprocess, run one after
another on this machine (seed-major: every cell's seed 0 first, so a partial grid already compares
every cell). As each run ends, its summary row is appended to the experiment's ``results`` file
(JSON lines, committed), so running the command again, on this machine or a fresh one, continues
where the last stopped: a (cell, seed) with a row is skipped; a failed run's row carries its error
and is not retried unless ``--retry-failed``; an interrupted run resumes from its own checkpoint
(``trainer.resume=auto``) where its run directory survived, else starts over (runs are seeded:
the same row either way, wall time aside).

Then the aggregate (``--report-only`` does only this): per cell the mean, standard deviation and
95% confidence interval (Student t) of each figure over seeds, the paired per-seed difference
against the baseline cell, accuracy at equal rollout tokens, an optional fitted line (E2: final
accuracy against early ACR, with R^2 and a 95% band beside the paper's line), and plots. Tables
and plots go into ``docs/RESULTS.md`` between this experiment's markers (``--report``), with the
exact command of every cell; the text outside the markers is left alone.

Rows are keyed by the model weights their run started from as well (``model``: the weights'
SHA-256 prefix, :func:`launch.bootstrap.weights_id`). The embedded tiny model is built on the
machine, and its warm start depends on the CPU's float kernels (docs/NOTES.md): on a CPU that
builds other weights, the grid's rows from the old weights are neither skipped nor mixed into
the aggregate; each model's rows get their own tables.

What each row reports (:func:`summarize_run`): held-out greedy accuracy, pass@k and mean@k at
step 0, at each evaluation and at the end; ACR (raw, effective, all-correct, all-incorrect);
early ACR (mean ``acr/raw`` over the first quarter of the steps) and ACR100 (runs of >= 100
steps), and the early means of its all-incorrect and all-correct strata; rollout tokens generated
and tokens that carried gradient; wall time. ``--refresh`` recomputes the rows' figures from the
run directories that survive on this machine (after a figure was added here).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from diagnostics.stats import Estimate, estimate, fit, paired

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "reproduce"
KEYS = {
    "description",
    "results",
    "runs_dir",
    "seeds",
    "base",
    "axes",
    "baseline",
    "tables_by",
    "fit",
    "timeout_s",
    "report",
}
# The figures aggregated per cell, in table order: (row key, heading, scale for display)
FIGURES = (
    ("final_accuracy", "final greedy acc", 1.0),
    ("gain", "gain (final - step 0)", 1.0),
    ("acc_at_equal_tokens", "acc at equal tokens", 1.0),
    ("final_pass_at_k", "final pass@k", 1.0),
    ("final_mean_at_k", "final mean@k", 1.0),
    ("acr_raw", "ACR raw", 1.0),
    ("acr_effective", "ACR effective", 1.0),
    ("acr_low", "all-incorrect", 1.0),
    ("acr_high", "all-correct", 1.0),
    ("early_acr", "early ACR", 1.0),
    ("generated_tokens", "rollout tokens (k)", 1e-3),
    ("grad_tokens", "grad tokens (k)", 1e-3),
    ("wall_s", "wall s", 1.0),
)


class ExperimentError(ValueError):
    """A bad experiment file: the message names the file and key."""


@dataclass
class Experiment:
    name: str
    path: Path
    seeds: list[int]
    base: list[str]
    axes: dict[str, dict[str, list[str]]]
    baseline: dict[str, str]
    results: Path
    runs_dir: Path
    report: Path
    description: str = ""
    tables_by: str | None = None  # an axis: one table per value of it
    # fitted lines over every ok row, each {"x": row key, "y": row key} (YAML: one or a list)
    fits: list[dict] = field(default_factory=list)
    timeout_s: float = 3600.0
    cells: list[dict[str, str]] = field(init=False)

    def __post_init__(self):
        self.cells = [
            dict(zip(self.axes, values, strict=True))
            for values in itertools.product(*(list(v) for v in self.axes.values()))
        ]

    def overrides(self, cell: dict[str, str], seed: int) -> list[str]:
        """The ``launch.train`` overrides of one run (its command, without where it writes)."""
        own = [o for axis, value in cell.items() for o in self.axes[axis][value]]
        return [*self.base, *own, f"trainer.seed={seed}"]

    def run_dir(self, cell: dict[str, str], seed: int) -> Path:
        return self.runs_dir / "__".join(cell.values()) / f"seed{seed}"


def cell_id(cell: dict[str, str]) -> str:
    """``"method=grpo,setting=hard"``: a cell's key in the results file."""
    return ",".join(f"{k}={v}" for k, v in cell.items())


def load_experiment(name_or_path: str) -> Experiment:
    """``conf/reproduce/<name>.yaml`` or a path; relative paths inside resolve against the
    repository root. Unknown keys and malformed values raise :class:`ExperimentError`."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONF / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONF.glob("*.yaml"))
        raise ExperimentError(f"{path}: no such experiment file (known: {', '.join(known)})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: not valid YAML: {e}") from None

    def bad(key: str, why: str) -> ExperimentError:
        return ExperimentError(f"{path}: {key}: {why}")

    if not isinstance(raw, dict):
        raise bad("(top level)", "must be a mapping")
    for key in raw:
        if key not in KEYS:
            raise bad(key, f"unknown key (known: {', '.join(sorted(KEYS))})")
    seeds = raw.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        raise bad("seeds", "must be a non-empty list of integers")

    def overrides(value, key: str) -> list[str]:
        value = value if value is not None else []
        if not (isinstance(value, list) and all(isinstance(o, str) for o in value)):
            raise bad(key, "must be a list of override strings")
        return value

    axes_raw = raw.get("axes")
    if not (isinstance(axes_raw, dict) and axes_raw):
        raise bad("axes", "must map each axis name to {value: [overrides]}")
    axes = {}
    for axis, values in axes_raw.items():
        if not (isinstance(values, dict) and values):
            raise bad(f"axes.{axis}", "must map each value name to a list of overrides")
        axes[str(axis)] = {str(v): overrides(o, f"axes.{axis}.{v}") for v, o in values.items()}
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise bad("baseline", "must map axes to the baseline's values")
    for axis, value in baseline.items():
        if axis not in axes or str(value) not in axes[axis]:
            raise bad(f"baseline.{axis}", f"{value!r} is not a value of an axis")
    tables_by = raw.get("tables_by")
    if tables_by is not None and tables_by not in axes:
        raise bad("tables_by", f"{tables_by!r} is not an axis")
    fit_cfg = raw.get("fit")
    fits = [] if fit_cfg is None else [fit_cfg] if isinstance(fit_cfg, dict) else fit_cfg
    if not isinstance(fits, list):
        raise bad("fit", "must be {x: <row key>, y: <row key>} or a list of them")
    for i, one in enumerate(fits):
        if not (isinstance(one, dict) and {"x", "y"} <= set(one)):
            where_ = "fit" if isinstance(fit_cfg, dict) else f"fit[{i}]"
            raise bad(where_, "must be {x: <row key>, y: <row key>}")
    name = path.stem

    def where(key: str, default: str) -> Path:
        p = Path(raw.get(key, default))
        return p if p.is_absolute() else ROOT / p

    return Experiment(
        name=name,
        path=path,
        seeds=seeds,
        base=overrides(raw.get("base"), "base"),
        axes=axes,
        baseline={str(k): str(v) for k, v in baseline.items()},
        results=where("results", f"docs/results/{name}.jsonl"),
        runs_dir=where("runs_dir", f"runs/reproduce/{name}"),
        report=where("report", "docs/RESULTS.md"),
        description=str(raw.get("description", "")).strip(),
        tables_by=tables_by,
        fits=fits,
        timeout_s=float(raw.get("timeout_s", 3600.0)),
    )


# --- one run's row --------------------------------------------------------------------------


def summarize_run(run_dir: Path) -> dict:
    """The figures of one finished run (module docstring), from its metrics.jsonl and config."""
    from diagnostics.report import load_run, summarize

    run = load_run(run_dir)
    s = summarize(run)
    steps = s["last_step"]
    gen_steps, gen = run.series("rollout/generated_tokens")
    cumulative, total = {}, 0.0
    for step, v in zip(gen_steps, gen, strict=True):
        total += v
        cumulative[step] = total
    k = next(
        (int(key.split("@")[1]) for key in run.metric_names() if key.startswith("eval/pass@")),
        None,
    )
    evals = []
    for step, row in run.rows.items():
        if "eval/accuracy" not in row:
            continue
        tokens = max((t for st, t in cumulative.items() if st <= step), default=0.0)
        evals.append(
            {
                "step": step,
                "accuracy": row["eval/accuracy"],
                "pass_at_k": row.get(f"eval/pass@{k}"),
                "mean_at_k": row.get(f"eval/mean@{k}"),
                "generated_tokens": tokens,
            }
        )
    start = next((e for e in evals if e["step"] == 0), None)
    end = evals[-1] if evals and evals[-1]["step"] >= 1 else None

    def mean_over(key: str, last: int) -> float | None:
        vals = [v for st, v in zip(*run.series(key), strict=True) if 1 <= st <= last]
        return math.fsum(vals) / len(vals) if vals else None

    early = max(1, math.ceil(steps / 4))
    grad = 0.0
    for row in run.rows.values():
        if "perf/learner_tokens" in row:
            grad += row["perf/learner_tokens"] * (1.0 - row.get("acr/wasted_token_frac", 0.0))
    return {
        "steps": steps,
        "k": k,
        "start_accuracy": start and start["accuracy"],
        "final_accuracy": end and end["accuracy"],
        "gain": (end["accuracy"] - start["accuracy"]) if start and end else None,
        "start_pass_at_k": start and start["pass_at_k"],
        "final_pass_at_k": end and end["pass_at_k"],
        "start_mean_at_k": start and start["mean_at_k"],
        "final_mean_at_k": end and end["mean_at_k"],
        "evals": evals,
        "acr_raw": s["mean_acr_raw"],
        "acr_effective": s["mean_acr_effective"],
        "acr_high": s["mean_acr_high"],
        "acr_low": s["mean_acr_low"],
        # the first quarter of the run (at least one step); ACR100 only where 100 steps ran
        "early_acr": mean_over("acr/raw", early),
        # its strata: all-incorrect groups (no signal to learn from) and all-correct (solved)
        "early_acr_low": mean_over("acr/low", early),
        "early_acr_high": mean_over("acr/high", early),
        "acr100": mean_over("acr/raw", 100) if steps >= 100 else None,
        "trigger_rate": s["trigger_rate"],
        "generated_tokens": total,
        # response tokens trained on whose advantage was not zero (per PPO epoch)
        "grad_tokens": grad,
        "time_per_step_s": s["time_per_step_s"],
    }


# --- the grid -------------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict]:
    """The results file's rows (a torn last line, from a killed writer, is skipped)."""
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"{path}:{n}: unreadable row skipped", file=sys.stderr)
    return rows


def latest(
    rows: list[dict], exp: Experiment, models: dict[str, str | None] | None = None
) -> dict[tuple[str, int], dict]:
    """The last row of each (cell, seed) of ``exp``, counting only rows whose command is the
    cell's command now (a row of an edited cell is another experiment's: it is run again) and,
    with ``models`` (cell id -> weights id), only rows made from that cell's model weights."""
    return {key: {**rows[i], "cell": cell} for key, (i, cell) in _latest(rows, exp, models).items()}


def _latest(rows, exp, models) -> dict[tuple[str, int], tuple[int, dict]]:
    """:func:`latest` as (index in ``rows``, the cell with its keys in axis order)."""
    out = {}
    for i, r in enumerate(rows):
        cell = r.get("cell")
        if not isinstance(cell, dict) or set(cell) != set(exp.axes):
            continue
        cell = {axis: cell[axis] for axis in exp.axes}  # rows are written with sorted keys
        if cell not in exp.cells or r.get("command") != command(exp, cell, r["seed"]):
            continue
        if models is not None and r.get("model") != models.get(cell_id(cell)):
            continue
        out[(r["cell_id"], r["seed"])] = (i, cell)
    return out


def git_rev(ignore: Path | None = None, repo: Path = ROOT) -> str | None:
    """The short revision, ``+dirty`` when tracked files differ from it (``ignore`` aside: the
    results file a grid appends to is always modified while it runs)."""
    skip = [f":(exclude){ignore}"] if ignore is not None else []
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *skip],
            cwd=repo,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def host() -> str:
    """The CPU model and core count: the tiny model's warm start depends on the CPU's float
    kernels (docs/NOTES.md), so rows from different CPUs are not comparable."""
    name = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def cell_models(exp: Experiment, log=print) -> dict[str, str | None]:
    """Each cell's model weights on this machine (cell id -> :func:`launch.bootstrap.weights_id`),
    building the model where the cache lacks it, as its run would. ``None`` for a cell whose
    config does not compose or validate: its run fails before any model, wherever it runs. Any
    other failure (a model build that fails: a full disk, a broken cache) is this machine's and
    stops the grid rather than becoming a model-less row that every model's block would show."""
    from hydra import compose, initialize_config_dir

    import launch.bootstrap as bootstrap
    from launch.config import COMPOSE_ERRORS, to_train_config

    out, by_spec = {}, {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for cell in exp.cells:
            try:
                cfg = to_train_config(compose("config", overrides=exp.overrides(cell, 0)))
            except COMPOSE_ERRORS:
                out[cell_id(cell)] = None  # the run itself records why
                continue
            spec = json.dumps(dataclasses.asdict(cfg.model), sort_keys=True, default=str)
            if spec not in by_spec:
                by_spec[spec] = bootstrap.weights_id(bootstrap.ensure_model(cfg.model, log))
            out[cell_id(cell)] = by_spec[spec]
    return out


def rows_of(rows: list[dict], model: str | None) -> list[dict]:
    """The rows made from ``model``'s weights, and those that never got to a model (a config
    that failed to compose: the same failure on any machine); every row for ``None`` (no row
    names a model)."""
    return rows if model is None else [r for r in rows if r.get("model") in (model, None)]


def models_of(exp: Experiment, rows: list[dict]) -> list[str | None]:
    """The weights ids the experiment's rows were made from, most counted rows first ([None] if
    none). Each model is counted on its own rows: another model's row for the same (cell, seed)
    does not hide it."""
    counts = {}
    for model in {r.get("model") for r in rows} - {None}:
        counts[model] = len(latest([r for r in rows if r.get("model") == model], exp))
    return [m for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n] or [None]


def command(exp: Experiment, cell: dict[str, str], seed: int) -> str:
    return shlex.join(["python", "-m", "launch.train", *exp.overrides(cell, seed)])


def run_one(exp: Experiment, cell: dict[str, str], seed: int, model: str | None = None) -> dict:
    """Train one (cell, seed) in a subprocess and return its row (status ok or failed);
    ``model`` is the weights id the run starts from (:func:`cell_models`)."""
    run_dir = exp.run_dir(cell, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "launch.train",
        *exp.overrides(cell, seed),
        f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={run_dir}/hydra",
        "trainer.resume=auto",
    ]
    row = {
        "experiment": exp.name,
        "cell_id": cell_id(cell),
        "cell": cell,
        "seed": seed,
        "command": command(exp, cell, seed),
        "git": git_rev(ignore=exp.results),
        "host": host(),
        "model": model,
    }
    start = time.monotonic()
    log = run_dir / "train.log"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(
                argv,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=exp.timeout_s,
            )
            error = None if proc.returncode == 0 else f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {exp.timeout_s:.0f} s"
    row["wall_s"] = round(time.monotonic() - start, 1)
    row["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if error is None:
        try:
            row |= summarize_run(run_dir)
        except Exception as e:  # noqa: BLE001 - a run that cannot be read is a failed run
            error = f"unreadable metrics: {e}"
    if error is not None:
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        row |= {"status": "failed", "error": f"{error}: " + " | ".join(tail)[-1500:]}
    else:
        row["status"] = "ok"
    return row


def append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pending(
    exp: Experiment,
    rows: list[dict],
    retry_failed: bool,
    models: dict[str, str | None] | None = None,
) -> list[tuple[dict, int]]:
    """The (cell, seed) pairs still to run, seed-major; with ``models`` (:func:`cell_models`),
    a row counts only where it was made from the weights this machine's run would start from."""
    done = latest(rows, exp, models)
    todo = []
    for seed in exp.seeds:
        for cell in exp.cells:
            row = done.get((cell_id(cell), seed))
            if row is None or (retry_failed and row.get("status") != "ok"):
                todo.append((cell, seed))
    return todo


def commit_rows(exp: Experiment, message: str) -> None:
    """``git commit`` of the results file alone (other staged changes stay staged), so that a
    session that ends abruptly loses at most the run in progress; a failure only warns."""
    for argv in (["add"], ["commit", "-q", "-m", message]):
        out = subprocess.run(
            ["git", *argv, "--", exp.results.name],
            cwd=exp.results.parent,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            print(f"    (git {argv[0]} of {exp.results} failed: {out.stderr.strip()[:200]})")
            return


def grid_lock(exp: Experiment):
    """The experiment's lock file, held (closing it releases): one writer of its rows at a time."""
    exp.results.parent.mkdir(parents=True, exist_ok=True)
    lock = open(exp.results.with_suffix(".lock"), "w")  # noqa: SIM115 - the caller closes it
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(
            f"{exp.results}: another launch.reproduce is running this experiment"
        ) from None
    return lock


def refresh_rows(exp: Experiment) -> int:
    """Recompute the figures of each counted ok row (:func:`latest`, this machine's weights)
    from its run directory where that survives, after :func:`summarize_run` learned a figure;
    other rows stay as they are. Rewrites the results file atomically; returns how many."""
    with grid_lock(exp):
        rows = read_rows(exp.results)
        fresh = 0
        for (_, seed), (i, cell) in _latest(rows, exp, cell_models(exp)).items():
            run_dir = exp.run_dir(cell, seed)
            if rows[i].get("status") == "ok" and (run_dir / "metrics.jsonl").is_file():
                rows[i] = {**rows[i], **summarize_run(run_dir)}
                fresh += 1
        tmp = exp.results.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        os.replace(tmp, exp.results)
    return fresh


def run_grid(
    exp: Experiment,
    *,
    retry_failed: bool = False,
    max_runs: int | None = None,
    commit: bool = False,
) -> int:
    """Run what is pending (at most ``max_runs``), one row per run (committed to git after each
    run with ``commit``); returns how many ran."""
    lock = grid_lock(exp)
    models = cell_models(exp)
    named = sorted({m for m in models.values() if m})
    todo = pending(exp, read_rows(exp.results), retry_failed, models)
    total = len(exp.cells) * len(exp.seeds)
    print(
        f"{exp.name}: {total - len(todo)} of {total} runs have rows from model weights "
        f"{', '.join(named) or '(none)'} ({host()}); {len(todo)} to run"
    )
    ran = 0
    for cell, seed in todo[:max_runs]:
        print(f"[{ran + 1}/{len(todo)}] {cell_id(cell)} seed {seed} ...", flush=True)
        row = run_one(exp, cell, seed, models[cell_id(cell)])
        append_row(exp.results, row)
        ran += 1
        what = (
            f"final accuracy {row['final_accuracy']}"
            if row["status"] == "ok"
            else row["error"][:300]
        )
        print(f"    {row['status']} in {row['wall_s']:.0f} s: {what}", flush=True)
        if commit:
            commit_rows(exp, f"results: {exp.name} {row['cell_id']} seed {seed} ({row['status']})")
    lock.close()
    return ran


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
        + (
            " The paper: accuracy (%) = 51.4 - 29.6 x ACR100, R^2 = 0.617 (245 runs of Qwen2.5 "
            "models on MATH)."
            if paper
            else ""
        ),
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
                ax.plot([0, 1], [51.4, 51.4 - 29.6], "--", label="paper: 51.4 - 29.6 x ACR100")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m launch.reproduce", description="A resumable grid of runs, then statistics."
    )
    ap.add_argument("experiment", help="a name in conf/reproduce/ or a YAML path")
    ap.add_argument("--report-only", action="store_true", help="only aggregate and write")
    ap.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    ap.add_argument("--max-runs", type=int, default=None, help="stop after this many runs")
    ap.add_argument("--list", action="store_true", help="print the pending runs and exit")
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="recompute the rows' figures from their surviving run directories, then report",
    )
    ap.add_argument(
        "--commit", action="store_true", help="git-commit the results file after each run"
    )
    args = ap.parse_args(argv)
    try:
        exp = load_experiment(args.experiment)
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from launch.config import ConfigError

    try:
        if args.list:
            models = cell_models(exp)
            for cell, seed in pending(exp, read_rows(exp.results), args.retry_failed, models):
                print(f"{cell_id(cell)} seed {seed}: {command(exp, cell, seed)}")
            return 0
        if args.refresh:
            print(f"{exp.name}: {refresh_rows(exp)} rows recomputed from their run directories")
        elif not args.report_only:
            with contextlib.suppress(KeyboardInterrupt):
                run_grid(
                    exp, retry_failed=args.retry_failed, max_runs=args.max_runs, commit=args.commit
                )
    except ConfigError as e:  # a cell's model is missing on this machine: no run can start
        print(f"error: {exp.name}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {write_report(exp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
