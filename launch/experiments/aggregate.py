"""The aggregate of an experiment's rows: estimates over seeds, paired differences with Holm's
adjustment and differences at equal rollout tokens (launch/experiments/report.py writes them
into docs/RESULTS.md).

The primary endpoint is the experiment's ``endpoint``: held-out mean@n at temperature 1 (the
mean solve rate of n samples per test problem: far less noisy than the greedy accuracy beside
it), or greedy accuracy where the experiment names it (a grid run with ``eval_pass_k=0``). An ok
row without it is refused (:func:`primary_key`), never replaced by the other figure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diagnostics.stats import (
    Estimate,
    estimate,
    holm,
    paired,
)
from launch.experiments.experiment import (
    ENDPOINTS,
    FIGURES,
    Experiment,
    ExperimentError,
    cell_id,
)
from launch.experiments.grid import latest, rows_of

# --- the aggregate --------------------------------------------------------------------------


def primary_key(exp: Experiment, rows: list[dict]) -> str:
    """The experiment's ``endpoint``, which every ok row of ``rows`` must carry: a row without
    it raises :class:`ExperimentError` (its run's evaluation did not write it), never a silent
    fallback to another figure."""
    key = exp.endpoint
    missing = [r for r in rows if r.get("status") == "ok" and r.get(key) is None]
    if missing:
        first = ", ".join(f"{r.get('cell_id')} seed {r.get('seed')}" for r in missing[:3])
        raise ExperimentError(
            f"{exp.path}: endpoint: {key} is missing from {len(missing)} ok "
            f"row{'s' if len(missing) > 1 else ''} of {exp.results} ({first}): their runs did "
            "not evaluate it (final_accuracy is for grids without sampled evaluation)"
        )
    return key


def at_tokens(row: dict, tokens: float, key: str) -> float | None:
    """The row's evaluation curve ``key`` (``mean_at_k`` or ``accuracy``) against cumulative
    rollout tokens, linearly interpolated at ``tokens`` (``numpy.interp``); None beyond the
    curve's ends or without the key.

    >>> r = {"evals": [{"generated_tokens": 0, "accuracy": 0.1},
    ...                {"generated_tokens": 100, "accuracy": 0.3}]}
    >>> round(at_tokens(r, 25, "accuracy"), 9)  # a quarter of the way from 0.1 to 0.3
    0.15
    """
    pts = [(e["generated_tokens"], e[key]) for e in row.get("evals", []) if e.get(key) is not None]
    if not pts or not pts[0][0] <= tokens <= pts[-1][0] + 1e-9:
        return None
    return float(np.interp(tokens, [p[0] for p in pts], [p[1] for p in pts]))


def equal_token_difference(row: dict, base: dict, key: str) -> float | None:
    """``row`` minus ``base`` (the same seed's baseline run) on curve ``key`` at the smaller of
    their two rollout-token totals, both curves interpolated there (:func:`at_tokens`): the arm
    that generated more is read at the point where it had generated what the other had in all,
    not at an earlier evaluation."""
    totals = [r.get("generated_tokens") for r in (row, base)]
    if not all(totals):
        return None
    budget = min(totals)
    a, b = at_tokens(row, budget, key), at_tokens(base, budget, key)
    return None if a is None or b is None else a - b


def _fingerprint(r: dict) -> tuple:
    """What two runs share only if they computed the same thing: the weights, the seed, every
    evaluation and the collapse and token totals."""
    evals = tuple((e.get("step"), e.get("accuracy"), e.get("mean_at_k")) for e in r["evals"])
    return (r.get("model"), r["seed"], evals, r.get("acr_raw"), r.get("generated_tokens"))


def identical_cells(
    exp: Experiment, done: dict, others: dict[str, list[dict]] | None = None
) -> dict[str, str]:
    """Cells whose every ok row equals (:func:`_fingerprint`) the same seed's row of an earlier
    cell of this experiment, or of a cell of another experiment (``others``: name -> rows):
    ``{cell id: the other cell}`` (``"<experiment> <cell id>"`` for another experiment's). Such
    an arm is the same computation (two presets that coincide in this setting, or a grid that
    repeats another's runs); it is counted once."""
    own: dict[str, dict[int, tuple]] = {}
    for (cid, seed), r in done.items():
        if r.get("status") == "ok" and r.get("evals"):
            own.setdefault(cid, {})[seed] = _fingerprint(r)
    elsewhere: dict[tuple, str] = {}
    for name, rows in (others or {}).items():
        for r in rows:
            if r.get("status") == "ok" and r.get("evals") and r.get("cell_id"):
                elsewhere.setdefault(_fingerprint(r), f"{name} {r['cell_id']}")
    out, here = {}, {}
    for cell in exp.cells:  # an earlier cell of this experiment first, then another experiment
        prints = own.get(cell_id(cell), {})
        for seen in (here, elsewhere):
            matches = {seen.get(fp) for fp in prints.values()}
            if prints and len(matches) == 1 and None not in matches:
                out[cell_id(cell)] = matches.pop()
                break
        for fp in prints.values():
            here.setdefault(fp, cell_id(cell))
    return out


@dataclass
class CellStats:
    cell: dict[str, str]
    figures: dict[str, Estimate]
    versus: dict[str, Estimate]  # paired difference against the baseline cell, per figure
    seeds: list[int]
    failed: list[tuple[int, str]]
    same_as: str | None = None  # identical_cells: counted once
    holm_p: float | None = None  # the primary difference's p-value, Holm-adjusted
    base_gain: float | None = None  # the baseline's mean primary gain over the paired seeds
    partner: str | None = None  # the cell it is paired with, where ``pairs`` registered one


def _with_derived(r: dict) -> dict:
    """A row with ``gain_mean_at_k`` (final minus step-0 mean@k) and ``dose`` added. The dose is
    the share of collapsed groups whose samples got a non-zero advantage, 1 - acr_effective /
    acr_raw (both are means over steps of shares of the step's groups, and every step has as
    many groups, so their ratio is one of counts): 0 for GRPO, 1 where every collapsed group is
    treated; negative under DAPO's filter, whose dropped groups count as lost."""
    out = dict(r)
    if r.get("final_mean_at_k") is not None and r.get("start_mean_at_k") is not None:
        out["gain_mean_at_k"] = r["final_mean_at_k"] - r["start_mean_at_k"]
    if r.get("acr_effective") is not None and r.get("acr_raw"):
        out["dose"] = 1.0 - r["acr_effective"] / r["acr_raw"]
    return out


def aggregate(
    exp: Experiment,
    rows: list[dict],
    model: str | None = None,
    others: dict[str, list[dict]] | None = None,
) -> list[CellStats]:
    """Per cell: each figure's estimate over the seeds with an ok row, paired differences against
    the baseline cell (the same cell with the baseline's axis values), the differences at equal
    rollout tokens, and the primary difference's Holm-adjusted p-value over the experiment's
    family of comparisons (every non-baseline cell, identical arms counted once); with
    ``model``, over the rows made from those weights only (:func:`rows_of`)."""
    done = latest(rows_of(rows, model), exp)
    ok = {key: _with_derived(r) for key, r in done.items() if r.get("status") == "ok"}
    same = identical_cells(exp, done, others)
    primary = primary_key(exp, list(ok.values()))
    _, gain_key, _ = ENDPOINTS[primary]
    out = []
    for cell in exp.cells:
        cid = cell_id(cell)
        mine = {s: ok[(cid, s)] for s in exp.seeds if (cid, s) in ok}
        base_cell = exp.partner(cell)
        base = {s: ok[(cell_id(base_cell), s)] for s in exp.seeds if (cell_id(base_cell), s) in ok}
        figures = {key: estimate([r.get(key) for r in mine.values()]) for key, _, _ in FIGURES}
        versus, base_gain = {}, None
        if exp.baseline and base_cell != cell:
            for key, _, _ in FIGURES:
                versus[key] = paired(
                    {s: r.get(key) for s, r in mine.items()},
                    {s: r.get(key) for s, r in base.items()},
                )
            for k in ("mean_at_k", "accuracy"):
                diffs = [
                    equal_token_difference(r, base[s], k) for s, r in mine.items() if s in base
                ]
                versus[f"{k}_at_equal_tokens"] = estimate(diffs)
            gains = [base[s].get(gain_key) for s in mine if s in base]
            base_gain = estimate(gains).mean
        failed = [
            (s, done[(cid, s)].get("error", "")[:200])
            for s in exp.seeds
            if (cid, s) in done and done[(cid, s)].get("status") != "ok"
        ]
        partner = cell_id(base_cell) if base_cell != {**cell, **exp.baseline} else None
        out.append(CellStats(cell, figures, versus, sorted(mine), failed, same.get(cid),
                             base_gain=base_gain, partner=partner))  # fmt: skip
    own_cells = {cell_id(c) for c in exp.cells}  # an arm identical to one of them is counted
    family = [
        c for c in out
        if c.versus.get(primary) and c.versus[primary].p is not None
        and c.same_as not in own_cells
    ]  # fmt: skip
    for c, p in zip(family, holm([c.versus[primary].p for c in family]), strict=True):
        c.holm_p = p
    return out
