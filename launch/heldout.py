"""Held-out evaluation: pass@1 (greedy) and pass@k (from n >= k samples at a temperature) on a
task's test split; a problem counts as solved when its score reaches the task's r_hi. The driver
loop calls :func:`evaluate` at step 0, every ``trainer.eval_every`` steps and at the end;
``python -m launch.evaluate`` runs it on a model or a checkpoint.

pass@k uses the unbiased estimator of Chen et al. (2021) per problem, averaged:
pass@k = 1 - C(n - c, k) / C(n, k) for n samples of which c are correct; with n = k it is the
share of problems with at least one correct sample.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from reward.tasks import Problem
from rollout.seeding import derive_seed
from rollout.types import Group, SamplingConfig, SamplingSettings

if TYPE_CHECKING:
    from launch.config import TrainConfig
    from launch.stages import Stages
    from reward.tasks import Task, TaskConfig


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct)
    is correct.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4), pass_at_k(4, 1, 4)
    (0.25, 0.5, 0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


Generate = Callable[[list[str], SamplingConfig], list[Group]]
Verify = Callable[[list[Group], list[Problem]], list]


def evaluate(
    generate: Generate,
    verify: Verify,
    problems: list[Problem],
    sampling: SamplingSettings,
    *,
    k: int = 0,
    n: int | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    solved_at: float = 1.0,
    phase: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """``eval/accuracy`` (greedy pass@1) and, when k > 0, ``eval/pass@{k}`` and
    ``eval/mean@{n}`` from ``n`` samples per problem at ``temperature`` (n = k unless given;
    n >= k): the unbiased pass@k estimate and the samples' mean solve rate. One definition of
    *solved* for all three: a score >= ``solved_at`` (the task's highest reward, r_hi), so a
    partial credit counts as unsolved everywhere. ``phase`` is told each pass before it runs
    (a long evaluation's progress on the console)."""
    prompts = [p.prompt for p in problems]
    show = phase or (lambda _: None)
    show(f"greedy, {len(problems)} problems")
    greedy = sampling.params(n=1, seed=seed, temperature=0.0)
    solved = [v.score >= solved_at for v in verify(generate(prompts, greedy), problems)]
    out = {"eval/accuracy": sum(solved) / len(solved)}
    sources = [p.data_source for p in problems]
    by_source = len(set(sources)) > 1  # verl's data_source column names several sets
    if by_source:
        out |= _per_source("accuracy", sources, solved)
    if k > 0:
        n = n or k
        if n < k:
            raise ValueError(f"pass@{k} needs at least k samples per problem, got n={n}")
        show(f"{n} samples each, {len(problems)} problems")
        params = sampling.params(n=n, seed=seed, temperature=temperature)
        verdicts = verify(generate(prompts, params), problems)
        solved = [v.score >= solved_at for v in verdicts]  # [P * n], problem-major
        correct = [sum(solved[i * n : (i + 1) * n]) for i in range(len(problems))]
        out[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
        out[f"eval/mean@{n}"] = sum(solved) / len(solved)
        if by_source:
            out |= _per_source(f"pass@{k}", sources, [pass_at_k(n, c, k) for c in correct])
            out |= _per_source(f"mean@{n}", sources, [c / n for c in correct])
    return out


def _per_source(name: str, sources: list, values: list) -> dict[str, float]:
    """``eval/<data_source>/<name>``: the mean of each problem's value per data_source (a
    problem without one counts as ``none``).

    >>> _per_source("accuracy", ["a", "b", "a", None], [1.0, 0.0, 0.0, 1.0])
    {'eval/a/accuracy': 0.5, 'eval/b/accuracy': 0.0, 'eval/none/accuracy': 1.0}
    """
    sums: dict[str, list[float]] = {}
    for source, value in zip(sources, values, strict=True):
        sums.setdefault(source or "none", []).append(float(value))
    return {f"eval/{s}/{name}": sum(v) / len(v) for s, v in sums.items()}


def evaluate_held_out(
    cfg: TrainConfig, stages: Stages, step: int, phase: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Held-out evaluation of every eval set (launch/heldout.py); with ``trainer.eval_tasks``,
    per-task metrics ``eval/<task>/...`` and their averages as ``eval/...``. ``phase`` is told
    which pass of which set runs (the console's progress)."""
    t = cfg.trainer
    sampling = cfg.rollout.sampling
    if t.eval_max_new_tokens:
        sampling = dataclasses.replace(sampling, max_new_tokens=t.eval_max_new_tokens)

    def verifier(task: Task, task_cfg: TaskConfig):
        return lambda groups, problems: stages.verifier.verify(
            groups, problems, task, task_cfg.truncated
        )

    def progress(i: int, name: str | None):
        if phase is None:
            return None
        m = len(stages.eval_sets)
        where = f"evaluation {i}/{m} ({name})" if m > 1 else "evaluation"
        return lambda text: phase(f"{where}: {text}")

    per_set = {
        name: evaluate(
            stages.rollout.generate,
            verifier(task, task_cfg),
            task.test,
            sampling,
            k=t.eval_pass_k,
            n=t.eval_samples,
            temperature=t.eval_temperature,
            seed=derive_seed(t.seed, "eval", step),
            solved_at=task.reward_range[1],
            phase=progress(i, name),
        )
        for i, (name, (task, task_cfg)) in enumerate(stages.eval_sets.items(), 1)
    }
    if list(per_set) == [None]:
        return per_set[None]
    out = {k.replace("eval/", f"eval/{n}/"): v for n, m in per_set.items() for k, v in m.items()}
    for key in per_set[next(iter(per_set))]:  # the same keys for every set
        out[key] = sum(m[key] for m in per_set.values()) / len(per_set)
    return out
