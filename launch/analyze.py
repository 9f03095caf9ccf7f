"""``python -m launch.analyze RUN_DIR... [--out DIR]``: ACR reports of runs (docs/ARCHITECTURE.md
section 9).

Writes each run's ``report.md`` and PNG plots into its run directory (diagnostics/report.py);
with two or more runs also ``cross_run.md`` and ``acr100_vs_accuracy.png``: final accuracy
against ACR100 with the fitted line and R^2, beside the paper's line, into ``--out`` (default:
the common parent of the run directories, else the current directory). Prints where the files
went and one line per run. Every run is read before anything is written; a missing directory or
unreadable data exits with status 2 and one line naming the file (and line).

A RUN_DIR may also be another trainer's log (diagnostics/external.py): a TRL
``trainer_state.json`` or a directory holding one (or its ``checkpoint-N/`` folders), shown as
``trl:<dir>``, with its report written into that directory; or a verl file-logger ``.jsonl``,
shown as ``verl:<file stem>``, with its report in ``<stem>_report/`` beside the file. OpenRLHF's
wandb / TensorBoard logs carry no per-step collapse figure and are refused with that reason.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from diagnostics.report import (
    RunDataError,
    acr100_coverage,
    load_run,
    summarize,
    write_cross_run,
    write_report,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m launch.analyze",
        description="Write report.md and plots for each run directory; with 2+ runs, also the "
        "cross-run fit of final accuracy against ACR100.",
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a run directory of this project, a TRL trainer_state.json (or its directory) or a "
        "verl file-logger .jsonl",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for cross_run.md and acr100_vs_accuracy.png (default: the common parent "
        "of the run directories, else the current directory)",
    )
    return parser.parse_args(argv)


def common_parent(run_dirs: list[Path]) -> Path:
    """The deepest directory above every run directory; the current directory if there is none."""
    try:
        return Path(os.path.commonpath([str(d.resolve().parent) for d in run_dirs]))
    except ValueError:  # no common path (e.g. different drives)
        return Path.cwd()


def one_line(s: dict) -> str:
    """``name (algorithm): accuracy start -> final, ACR100, trigger rate, wasted tokens, alert``;
    an ACR100 over fewer steps than its window says so: ``ACR100 0.412 (over 40 steps, run shorter
    than 100)``."""

    def f(v, digits=3):
        return "n/a" if v is None else f"{v:.{digits}f}"

    warn, short = s["early_warning_step"], acr100_coverage(s, always=False)
    return (
        f"{s['run']} ({s['algorithm'] or 'unknown algorithm'}): accuracy {f(s['start_accuracy'])}"
        f" -> {f(s['final_accuracy'])} (best {f(s['best_accuracy'])}), ACR100 {f(s['acr100'])}"
        f"{f' ({short})' if short else ''}, "
        f"acr/effective {f(s['mean_acr_effective'])}, trigger rate {f(s['trigger_rate'])}, "
        f"wasted tokens {f(s['mean_acr_wasted_token_frac'])}, early warning "
        f"{'none' if warn is None else f'at step {warn}'}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = [load_run(d) for d in args.run_dirs]  # every run is readable before any writing
        for run in runs:
            print(f"{write_report(run)}\n  {one_line(summarize(run))}")
        if len(runs) >= 2:
            out = args.out or common_parent(args.run_dirs)
            print(f"cross-run analysis of {len(runs)} runs: {write_cross_run(args.run_dirs, out)}")
        elif args.out is not None:
            print("one run: no cross-run analysis (the fit needs 2 or more runs)")
    except RunDataError as err:
        print(f"analyze: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"analyze: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
