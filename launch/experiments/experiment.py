"""Experiment grids for ``launch.reproduce`` (``conf/reproduce/*.yaml``): the definition, its
cells and commands, and one run's summary row."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "reproduce"
KEYS = {
    "description",
    "results",
    "runs_dir",
    "seeds",
    "base",
    "axes",
    "baseline",
    "pairs",
    "tables_by",
    "fit",
    "timeout_s",
    "report",
    "endpoint",
    "keep_checkpoints",
}
# The primary endpoints an experiment may name (``endpoint``; its ok rows must carry it) ->
# (its curve in a row's evals, its gain, the endpoint shown beside it)
ENDPOINTS = {
    "final_mean_at_k": ("mean_at_k", "gain_mean_at_k", "final_accuracy"),
    "final_accuracy": ("accuracy", "gain", "final_mean_at_k"),
}
# The figures aggregated per cell, in table order: (row key, heading, scale for display)
FIGURES = (
    ("final_mean_at_k", "final mean@k", 1.0),
    ("final_accuracy", "final greedy acc", 1.0),
    ("gain_mean_at_k", "mean@k gain", 1.0),
    ("gain", "greedy gain", 1.0),
    ("final_pass_at_k", "final pass@k", 1.0),
    ("acr_raw", "ACR raw", 1.0),
    ("acr_effective", "ACR effective", 1.0),
    ("dose", "collapsed groups treated", 1.0),
    ("acr_low", "all-incorrect", 1.0),
    ("acr_high", "all-correct", 1.0),
    ("early_acr", "early ACR", 1.0),
    ("generated_tokens", "rollout tokens (k)", 1e-3),
    ("grad_tokens", "grad tokens (k)", 1e-3),
    ("wall_s", "wall s", 1.0),
)  # (row key, column head, scale); gain_mean_at_k and dose are derived (aggregate.py)


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
    # the primary endpoint, named before the runs: held-out mean@n at T = 1 (the default), or
    # greedy accuracy for a grid that samples none (eval_pass_k=0); never a silent fallback
    endpoint: str = "final_mean_at_k"
    # registered pairings other than the baseline: {axis: {value: the value it is paired with}}
    # (e.g. DCPO on recurring prompts against GRPO on the same recurring prompts)
    pairs: dict[str, dict[str, str]] = field(default_factory=dict)
    # a finished run's checkpoints are deleted once its row is written (SmolLM2: ~8 GB a run)
    keep_checkpoints: bool = False
    cells: list[dict[str, str]] = field(init=False)

    def partner(self, cell: dict[str, str]) -> dict[str, str]:
        """The cell ``cell`` is compared with: the baseline's values, except where ``pairs``
        registered another partner for one of ``cell``'s values."""
        out = {**cell, **self.baseline}
        for axis, mapping in self.pairs.items():
            if cell[axis] in mapping:
                out[axis] = mapping[cell[axis]]
        return out

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


def _experiment_file(name_or_path: str) -> tuple[Path, dict]:
    """The file (``conf/reproduce/<name>.yaml`` or a path) and its YAML mapping."""
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
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: (top level): must be a mapping")
    for key in raw:
        if key not in KEYS:
            raise ExperimentError(f"{path}: {key}: unknown key (known: {', '.join(sorted(KEYS))})")
    return path, raw


def _overrides(value, bad, key: str) -> list[str]:
    value = value if value is not None else []
    if not (isinstance(value, list) and all(isinstance(o, str) for o in value)):
        raise bad(key, "must be a list of override strings")
    return value


def _axes(raw: dict, bad) -> tuple[dict, dict]:
    """The axes ``{axis: {value: overrides}}`` and the baseline cell, checked."""
    axes_raw = raw.get("axes")
    if not (isinstance(axes_raw, dict) and axes_raw):
        raise bad("axes", "must map each axis name to {value: [overrides]}")
    axes = {}
    for axis, values in axes_raw.items():
        if not (isinstance(values, dict) and values):
            raise bad(f"axes.{axis}", "must map each value name to a list of overrides")
        axes[str(axis)] = {
            str(v): _overrides(o, bad, f"axes.{axis}.{v}") for v, o in values.items()
        }
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise bad("baseline", "must map axes to the baseline's values")
    for axis, value in baseline.items():
        if axis not in axes or str(value) not in axes[axis]:
            raise bad(f"baseline.{axis}", f"{value!r} is not a value of an axis")
    return axes, {str(k): str(v) for k, v in baseline.items()}


def _pairs(raw: dict, axes: dict, baseline: dict, bad) -> dict[str, dict[str, str]]:
    """``pairs: {axis: {value: partner}}``: cells with ``value`` are compared with the same cell
    at ``partner`` instead of the baseline's value (both values of an axis with a baseline)."""
    pairs = raw.get("pairs") or {}
    if not isinstance(pairs, dict):
        raise bad("pairs", "must map axes to {value: the value it is paired with}")
    out = {}
    for axis, mapping in pairs.items():
        if axis not in baseline or not isinstance(mapping, dict):
            raise bad(f"pairs.{axis}", "must be an axis of the baseline, mapping value -> value")
        for value, partner in mapping.items():
            if str(value) not in axes[axis] or str(partner) not in axes[axis]:
                raise bad(f"pairs.{axis}.{value}", f"{value!r} or {partner!r} is not a value")
            if str(value) == str(partner):
                raise bad(f"pairs.{axis}.{value}", "a value cannot be paired with itself")
        out[str(axis)] = {str(v): str(p) for v, p in mapping.items()}
    return out


def _fits(raw: dict, bad) -> list[dict]:
    fit_cfg = raw.get("fit")
    fits = [] if fit_cfg is None else [fit_cfg] if isinstance(fit_cfg, dict) else fit_cfg
    if not isinstance(fits, list):
        raise bad("fit", "must be {x: <row key>, y: <row key>} or a list of them")
    for i, one in enumerate(fits):
        if not (isinstance(one, dict) and {"x", "y"} <= set(one)):
            where_ = "fit" if isinstance(fit_cfg, dict) else f"fit[{i}]"
            raise bad(where_, "must be {x: <row key>, y: <row key>}")
    return fits


def load_experiment(name_or_path: str) -> Experiment:
    """``conf/reproduce/<name>.yaml`` or a path; relative paths inside resolve against the
    repository root. Unknown keys and malformed values raise :class:`ExperimentError`."""
    path, raw = _experiment_file(name_or_path)

    def bad(key: str, why: str) -> ExperimentError:
        return ExperimentError(f"{path}: {key}: {why}")

    seeds = raw.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        raise bad("seeds", "must be a non-empty list of integers")
    axes, baseline = _axes(raw, bad)
    tables_by = raw.get("tables_by")
    if tables_by is not None and tables_by not in axes:
        raise bad("tables_by", f"{tables_by!r} is not an axis")
    name = path.stem
    endpoint = raw.get("endpoint", "final_mean_at_k")
    if endpoint not in ENDPOINTS:
        raise bad("endpoint", f"{endpoint!r} is not one of {', '.join(ENDPOINTS)}")

    def where(key: str, default: str) -> Path:
        p = Path(raw.get(key, default))
        return p if p.is_absolute() else ROOT / p

    return Experiment(
        name=name,
        path=path,
        seeds=seeds,
        base=_overrides(raw.get("base"), bad, "base"),
        axes=axes,
        baseline=baseline,
        results=where("results", f"docs/results/{name}.jsonl"),
        runs_dir=where("runs_dir", f"runs/reproduce/{name}"),
        report=where("report", "docs/RESULTS.md"),
        description=str(raw.get("description", "")).strip(),
        tables_by=tables_by,
        fits=_fits(raw, bad),
        timeout_s=float(raw.get("timeout_s", 3600.0)),
        endpoint=endpoint,
        pairs=_pairs(raw, axes, baseline, bad),
        keep_checkpoints=bool(raw.get("keep_checkpoints", False)),
    )


def parse_only(exp: Experiment, specs: list[str]) -> dict[str, set[str]]:
    """``--only AXIS=VALUE`` (repeatable) as {axis: the values kept}: a cell runs when each
    named axis has one of its values there; an unknown axis or value raises
    :class:`ExperimentError` naming it."""
    only: dict[str, set[str]] = {}
    for spec in specs:
        axis, _, value = spec.partition("=")
        if axis not in exp.axes:
            raise ExperimentError(f"--only {spec}: no axis {axis} (axes: {', '.join(exp.axes)})")
        if value not in exp.axes[axis]:
            raise ExperimentError(f"--only {spec}: {value!r} is not a value of axis {axis}")
        only.setdefault(axis, set()).add(value)
    return only


# --- one run's row --------------------------------------------------------------------------


def eval_keys(run) -> tuple[int | None, int | None]:
    """(k, n) of the run's sampled evaluation, ``eval/pass@{k}`` from n samples per problem and
    their ``eval/mean@{n}`` (launch/heldout.py): the config's ``trainer.eval_pass_k`` and
    ``trainer.eval_samples`` (null: n = k); (None, None) when it sampled none. A run directory
    without its config: the keys it logged."""
    trainer = run.config.get("trainer") or {}
    if "eval_pass_k" in trainer:
        k = int(trainer["eval_pass_k"])
        return (k, int(trainer.get("eval_samples") or k)) if k else (None, None)

    def logged(prefix: str) -> set[int]:
        return {int(x.split("@")[1]) for x in run.metric_names() if x.startswith(prefix)}

    ks, ns = logged("eval/pass@"), logged("eval/mean@")
    if len(ks) > 1 or len(ns) > 1:
        raise ValueError(f"{run.path}: several pass@k / mean@n keys and no config.yaml")
    return (ks.pop() if ks else None), (ns.pop() if ns else None)


def run_evals(run) -> tuple[list[dict], int | None, int | None, float]:
    """Each evaluation step's accuracy, pass@k and mean@n with the rollout tokens generated up
    to it (``mean_at_k`` in a row is mean@n: the mean solve rate of n samples); k; n; the run's
    generated tokens. An evaluation without the ``eval/mean@{n}`` the config asked for raises:
    the row's primary endpoint would be missing."""
    gen_steps, gen = run.series("rollout/generated_tokens")
    cumulative, total = {}, 0.0
    for step, v in zip(gen_steps, gen, strict=True):
        total += v
        cumulative[step] = total
    k, n = eval_keys(run)
    evals = []
    for step, row in run.rows.items():
        if "eval/accuracy" not in row:
            continue
        if n is not None and f"eval/mean@{n}" not in row:
            raise ValueError(
                f"{run.path}: step {step} evaluated but logged no eval/mean@{n} "
                f"(trainer.eval_samples n = {n}, eval_pass_k = {k}): the endpoint is missing"
            )
        tokens = max((t for st, t in cumulative.items() if st <= step), default=0.0)
        evals.append(
            {
                "step": step,
                "accuracy": row["eval/accuracy"],
                "pass_at_k": row.get(f"eval/pass@{k}"),
                "mean_at_k": row.get(f"eval/mean@{n}"),
                "generated_tokens": tokens,
            }
        )
    return evals, k, n, total


def summarize_run(run_dir: Path) -> dict:
    """The figures of one finished run (module docstring), from its metrics.jsonl and config."""
    from diagnostics.report import load_run, summarize

    run = load_run(run_dir)
    s = summarize(run)
    steps = s["last_step"]
    evals, k, n, total = run_evals(run)
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
        "n": n,
        "start_accuracy": start and start["accuracy"],
        "final_accuracy": end and end["accuracy"],
        "gain": (end["accuracy"] - start["accuracy"]) if start and end else None,
        **{
            f"{when}_{key}": e and e[key]
            for when, e in (("start", start), ("final", end))
            for key in ("pass_at_k", "mean_at_k")
        },
        "evals": evals,
        **{f"acr_{key}": s[f"mean_acr_{key}"] for key in ("raw", "effective", "high", "low")},
        # the first quarter of the run (at least one step); ACR100 only where 100 steps ran
        "early_acr": mean_over("acr/raw", early),
        # its strata: all-incorrect groups (no signal to learn from) and all-correct (solved)
        "early_acr_low": mean_over("acr/low", early),
        "early_acr_high": mean_over("acr/high", early),
        "acr100": mean_over("acr/raw", 100) if steps >= 100 else None,
        "trigger_rate": s["trigger_rate"],  # steps with an augmented group (issue 48)
        "decision_rate": s["decision_rate"],  # steps the trigger fired (mean avspo/triggered)
        "generated_tokens": total,
        # response tokens trained on whose advantage was not zero (per PPO epoch)
        "grad_tokens": grad,
        "time_per_step_s": s["time_per_step_s"],
        "timing_share": s["timing_share"],  # each phase's share of the summed step time
        # mean |engine - learner| log-prob of the sampled tokens, same policy version (issue 46)
        "logprob_gap": mean_over("rollout/logprob_abs_diff_mean", steps),
    }
