"""``python -m launch.reproduce EXPERIMENT``: a resumable grid of training runs, then statistics.

An experiment is a YAML file (``conf/reproduce/<name>.yaml``, or any path) naming a grid: the
``base`` overrides every run shares, ``axes`` (each a name -> {value: overrides}), ``seeds``, a
``baseline`` cell and the primary ``endpoint`` (final mean@n at T = 1 unless it names greedy
accuracy; the aggregate refuses ok rows without it). Every (cell, seed) is one ``python -m
launch.train`` subprocess, run one after another on this machine (seed-major: every cell's seed 0
first, so a partial grid already compares every cell; ``--only AXIS=VALUE``, repeatable, runs
only the cells with those values, still seed-major: phases in an order are a chain of commands).
As each run ends, its summary row is appended to the experiment's ``results`` file (JSON lines,
committed), so running the command again, on this machine or a fresh one, continues where the
last stopped: a (cell, seed) with a row is skipped; a failed run's row carries its error and is
not retried unless ``--retry-failed``; an interrupted run resumes from its own checkpoint
(``trainer.resume=auto``) where its run directory survived, else starts over (runs are seeded:
the same row either way, wall time aside). Each row names the machine (``host``: the CPU model
of /proc/cpuinfo and the cores).

Then the aggregate (``--report-only`` does only this): per cell the mean, standard deviation and
95% confidence interval (Student t) of each figure over seeds, the paired per-seed difference
against the baseline cell, accuracy at equal rollout tokens, an optional fitted line (E2: final
accuracy against early ACR, with R^2 and a 95% band beside the paper's line), and plots. Tables
and plots go into ``docs/RESULTS.md`` between this experiment's markers (``--report``), with the
exact command of every cell; the text outside the markers is left alone.

Rows are keyed by the model weights their run started from as well (``model``: the weights'
SHA-256 prefix, :func:`launch.models.bootstrap.weights_id`). The embedded tiny model is built on the
machine, and its warm start depends on the CPU's float kernels (docs/NOTES.md): on a CPU that
builds other weights, the grid's rows from the old weights are neither skipped nor mixed into
the aggregate; each model's rows get their own tables.

What each row reports (:func:`summarize_run`): held-out greedy accuracy, pass@k and mean@n at
step 0, at each evaluation and at the end; ACR (raw, effective, all-correct, all-incorrect);
early ACR (mean ``acr/raw`` over the first quarter of the steps) and ACR100 (runs of >= 100
steps), and the early means of its all-incorrect and all-correct strata; rollout tokens generated
and tokens that carried gradient; wall time. ``--refresh`` recomputes the rows' figures from the
run directories that survive on this machine (after a figure was added here).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from launch.experiments.experiment import ExperimentError, cell_id, load_experiment, parse_only
from launch.experiments.grid import cell_models, command, pending, read_rows, refresh_rows, run_grid
from launch.experiments.report import write_report


def parser() -> argparse.ArgumentParser:
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
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="AXIS=VALUE",
        help="run only the cells with this axis value (repeatable: method=grpo --only "
        "method=avspo_fast runs both, seed-major); the report still covers every cell",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        exp = load_experiment(args.experiment)
        only = parse_only(exp, args.only)
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from launch.validation import ConfigError

    try:
        if args.list:
            models = cell_models(exp)
            for cell, seed in pending(exp, read_rows(exp.results), args.retry_failed, models, only):
                print(f"{cell_id(cell)} seed {seed}: {command(exp, cell, seed)}")
            return 0
        if args.refresh:
            print(f"{exp.name}: {refresh_rows(exp)} rows recomputed from their run directories")
        elif not args.report_only:
            with contextlib.suppress(KeyboardInterrupt):
                run_grid(
                    exp,
                    retry_failed=args.retry_failed,
                    max_runs=args.max_runs,
                    commit=args.commit,
                    only=only,
                )
        report = write_report(exp)
    except ConfigError as e:  # a cell's model is missing on this machine: no run can start
        print(f"error: {exp.name}: {e}", file=sys.stderr)
        return 2
    except ExperimentError as e:  # rows without the experiment's endpoint: no aggregate
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {report}")
    return 0
