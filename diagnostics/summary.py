"""A run's headline numbers (:func:`summarize`), from its loaded metrics and config.

:func:`summarize`, over the steps that log each metric: start accuracy = ``eval/accuracy`` at
step 0; final = at the last evaluated step t >= 1; best = max over all evaluations; ACR100 = the
last logged ``acr/acr100``, else the mean of ``acr/raw`` over steps 1..100 (``acr.early_steps``;
a running mean for a shorter run, as the monitor does), and the steps it covers = the last
logged ``acr/acr100_steps``, else the number of steps 1..100 that log ``acr/raw`` (a run shorter
than 100 steps is flagged wherever ACR100 is shown). A log whose rows average several steps
(TRL: ``log/steps_averaged`` = w, the row at step t stands for steps t-w+1..t) weights each row's
``acr/raw`` by its steps inside 1..100 and counts those steps (a row straddling step 100 counts
for its steps up to 100, its mean taken as theirs). Means of ``reward/mean``, ``acr/raw``,
``acr/high``, ``acr/low``, ``acr/effective``, ``acr/wasted_token_frac``, each row weighted by w
(our runs log every step, w = 1: plain means); trigger rate = share of steps that augmented at
least one group (``avspo/augmented_groups`` > 0; ``avspo/groups_augmented`` in runs logged
before the rename), decision rate = mean of ``avspo/triggered`` (the trigger's decision, which
may find no group of its stratum to augment); timing share of part p = sum_t ``timing_s/p`` /
sum_t ``timing_s/step``.
"""

from __future__ import annotations

import math

from diagnostics.runs import Run, early_warning_step

TIMING_PARTS = ("generate", "verify", "advantage", "learner", "weight_sync")


def _cfg(cfg: dict, dotted: str, default=None):
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return default
        cfg = cfg[part]
    return cfg


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _step_mean(run: Run, key: str) -> float | None:
    """Mean of ``key`` over steps: each row weighted by the steps it averages (1 for our runs)."""
    w = [run.rows[s].get("log/steps_averaged", 1.0) for s in run.series(key)[0]]
    values = run.series(key)[1]
    return math.fsum(x * v for x, v in zip(w, values, strict=True)) / math.fsum(w) if w else None


def augmented_groups(run: Run) -> tuple[list[int], list[float]]:
    """Steps and their count of groups given virtual samples (``avspo/augmented_groups``;
    ``avspo/groups_augmented`` in runs logged before the rename)."""
    old = "avspo/groups_augmented"
    return run.series(old if old in run.metric_names() else "avspo/augmented_groups")


def summarize(run: Run) -> dict:
    """The run's headline numbers (module docstring); a value is None where nothing was logged."""
    acc_steps, acc = run.series("eval/accuracy")
    trained = [(s, v) for s, v in zip(acc_steps, acc, strict=True) if s >= 1]
    best = max(zip(acc, acc_steps, strict=True), default=(None, None))
    decided = run.series("avspo/triggered")[1]
    augmented = augmented_groups(run)[1]
    out = {
        "run": run.name,
        **{k: _cfg(run.config, f"{k}.name") for k in ("algorithm", "task")},
        "model": _cfg(run.config, "model.source"),
        "seed": _cfg(run.config, "trainer.seed"),
        "total_steps": _cfg(run.config, "trainer.total_steps"),
        "last_step": max(run.rows),
        "start_accuracy": run.rows.get(0, {}).get("eval/accuracy"),
        "final_accuracy": trained[-1][1] if trained else None,
        "final_accuracy_step": trained[-1][0] if trained else None,
        "best_accuracy": best[0],
        "best_accuracy_step": best[1],
        "mean_reward": _step_mean(run, "reward/mean"),
        "trigger_rate": _mean([float(v > 0) for v in augmented]),
        "triggers": sum(v > 0 for v in augmented),
        "decision_rate": _mean(decided),
        "decisions": sum(v > 0.5 for v in decided),
        "final_tau_adapt": (run.series("avspo/tau_adapt")[1] or [None])[-1],
        "early_warning_step": early_warning_step(run),
    }
    out["acr100"], out["acr100_source"], out["acr100_steps"], out["acr100_window"] = _acr100(run)
    for name in ("raw", "high", "low", "effective", "wasted_token_frac"):
        out[f"mean_acr_{name}"] = _step_mean(run, f"acr/{name}")
    for name in ("error", "timeout"):
        out[f"mean_verifier_{name}_frac"] = _mean(run.series(f"reward/verifier_{name}_frac")[1])
    dropped = run.series("data/over_long_prompts")[1]  # the same count on every step
    out["over_long_prompts"] = int(dropped[-1]) if dropped else None
    out["time_per_step_s"], out["timing_share"] = _timing(run)
    return out


def _acr100(run: Run) -> tuple[float | None, str | None, int | None, int]:
    """(ACR100, where it came from, steps it covers, the window ``acr.early_steps``)."""
    early = int(_cfg(run.config, "acr.early_steps", 100))
    first = []  # (value, its steps inside 1..early)
    for s, v in zip(*run.series("acr/raw"), strict=True):
        w = int(run.rows[s].get("log/steps_averaged", 1))
        inside = min(s, early) - max(s - w, 0)
        if inside > 0:
            first.append((v, inside))
    counted = run.series("acr/acr100_steps")[1]
    steps = int(counted[-1]) if counted else (sum(n for _, n in first) or None)
    logged = run.series("acr/acr100")[1]
    if logged:
        return logged[-1], "logged acr/acr100", steps, early
    if not first:
        return None, None, None, early
    value = math.fsum(v * n for v, n in first) / sum(n for _, n in first)
    weighted = " (each logged mean weighted by its steps)" if any(n != 1 for _, n in first) else ""
    return value, f"mean acr/raw over steps 1..{early}{weighted}", steps, early


def acr100_coverage(s: dict, *, always: bool = True) -> str | None:
    """How many steps the summary's ACR100 averages, e.g. ``"over 40 steps, run shorter than
    100"``; None without an ACR100 (or a step count), and, unless ``always``, for a full window.

    >>> acr100_coverage({"acr100": 0.4, "acr100_steps": 40, "acr100_window": 100})
    'over 40 steps, run shorter than 100'
    >>> acr100_coverage({"acr100": 0.4, "acr100_steps": 100, "acr100_window": 100}, always=False)
    """
    steps, window = s.get("acr100_steps"), s.get("acr100_window", 100)
    if s.get("acr100") is None or steps is None:
        return None
    short = steps < window
    if not (short or always):
        return None
    return f"over {steps} steps" + (f", run shorter than {window}" if short else "")


def _timing(run: Run) -> tuple[float | None, dict[str, float]]:
    """Mean seconds per step, and each part's share of the summed step time (+ ``other``)."""
    parts = {p: run.series(f"timing_s/{p}")[1] for p in TIMING_PARTS}
    parts = {p: math.fsum(v) for p, v in parts.items() if v}
    step_times = run.series("timing_s/step")[1]
    total = math.fsum(step_times) or math.fsum(parts.values())
    if total <= 0:
        return None, {}
    shares = {p: v / total for p, v in parts.items()}
    shares["other"] = max(0.0, 1.0 - math.fsum(shares.values()))
    return (total / len(step_times) if step_times else None), shares
