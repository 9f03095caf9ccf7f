"""Running an experiment's grid: pending (cell, seed) runs one after another, each run's row
appended (and optionally committed) as it ends; resumable on this machine or a fresh one."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from launch.experiments.experiment import ROOT, Experiment, cell_id, summarize_run

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


BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The /proc/cpuinfo flags that decide how a CPU computes bf16: AVX2 alone emulates it,
AVX512_BF16 and AMX run it natively (E7/E7b's speed depends on which)."""


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name and which of :data:`BF16_FLAGS` it has."""
    name, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return name, [f for f in BF16_FLAGS if f in flags]


def host() -> str:
    """The CPU model, its bf16-relevant flags and core count: the tiny model's warm start depends
    on the CPU's float kernels (docs/NOTES.md), so rows from different CPUs are not comparable."""
    name, flags = cpu_info()
    return f"{name} ({' '.join(flags) or 'no AVX2'}), {len(os.sched_getaffinity(0))} cores"


def cell_models(exp: Experiment, log=print) -> dict[str, str | None]:
    """Each cell's model weights on this machine (cell id ->
    :func:`launch.models.bootstrap.weights_id`), building the model where the cache lacks it, as its
    run would. ``None`` for a cell whose config does not compose or validate: its run fails before
    any model, wherever it runs. Any other failure (a model build that fails: a full disk, a broken
    cache) is this machine's and stops the grid rather than becoming a model-less row that every
    model's block would show."""
    from hydra import compose, initialize_config_dir

    import launch.models.bootstrap as bootstrap
    from launch.validation import COMPOSE_ERRORS, to_train_config

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
        if not exp.keep_checkpoints:  # the row holds what the report reads; a failed run keeps
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # them, to resume
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
    only: dict[str, set[str]] | None = None,
) -> list[tuple[dict, int]]:
    """The (cell, seed) pairs still to run, seed-major; with ``models`` (:func:`cell_models`), a row
    counts only where it was made from the weights this machine's run would start from; with
    ``only`` (:func:`launch.experiments.experiment.parse_only`), the cells with those axis
    values."""
    done = latest(rows, exp, models)
    todo = []
    for seed in exp.seeds:
        for cell in exp.cells:
            if only and any(cell[axis] not in values for axis, values in only.items()):
                continue
            row = done.get((cell_id(cell), seed))
            if row is None or (retry_failed and row.get("status") != "ok"):
                todo.append((cell, seed))
    return todo


def commit_rows(exp: Experiment, message: str) -> None:
    """``git commit`` of the results file alone (other staged changes stay staged), so that a
    machine that goes away abruptly loses at most the run in progress; a failure only warns."""
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
    only: dict[str, set[str]] | None = None,
) -> int:
    """Run what is pending (at most ``max_runs``; of the ``only`` cells), one row per run
    (committed to git after each run with ``commit``); returns how many ran."""
    lock = grid_lock(exp)
    models = cell_models(exp)
    named = sorted({m for m in models.values() if m})
    rows = read_rows(exp.results)
    todo = pending(exp, rows, retry_failed, models, only)
    total = len(exp.cells) * len(exp.seeds)
    left = len(pending(exp, rows, retry_failed, models))
    print(
        f"{exp.name}: {total - left} of {total} runs have rows from model weights "
        f"{', '.join(named) or '(none)'} ({host()}); {len(todo)} to run"
        + (f" (--only; {left} in all)" if only else "")
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
