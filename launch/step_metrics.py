"""A training step's own metrics beside the stages' (as verl's metric utilities): phase times,
throughput, idle shares and how far behind the learner the samples were generated."""

from __future__ import annotations

import contextlib
import time


class PhaseTimer:
    """Seconds per named phase of a step (``with timer("learner"): ...``), as verl's
    ``marked_timer``; a phase timed twice adds up."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


PHASES = ("generate", "verify", "advantage", "learner", "weight_sync", "prefetch_wait")


def step_metrics(
    step: int,
    rollouts: dict[str, float],
    groups: list,
    seconds: dict[str, float],
    total: float,
    rolled: dict[str, float],
    serial: bool,
) -> dict[str, float]:
    """``rollouts``: the trained rollouts' metrics (their ``timing_s/generate`` and ``/verify``
    among them); ``groups``: their groups; ``seconds``: the driver's phase times this step;
    ``total``: the step's wall time; ``rolled``: the metrics of the rollouts generated during
    this step (the next step's in one-step mode); ``serial``: every phase ran inside this step
    (no prefetch either way), so ``timing_s/other`` is what the phases leave of ``total``.

    >>> from types import SimpleNamespace as S
    >>> groups = [S(samples=[S(response_ids=[1, 2], policy_version=2)] * 2)]
    >>> rolled = {"timing_s/generate": 1.0, "timing_s/verify": 0.5}
    >>> seconds = {"advantage": 0.1, "learner": 2.0, "prefetch_wait": 0.0, "weight_sync": 0.2}
    >>> m = step_metrics(3, rolled, groups, seconds, 4.0, rolled, serial=True)
    >>> m["perf/generated_tokens_per_s"], round(m["timing_s/other"], 9), m["perf/rollout_idle_frac"]
    (4.0, 0.2, 0.625)
    >>> m["perf/learner_idle_frac"], m["rollout/policy_lag"]  # 1 - 2/4; learner at version 2
    (0.5, 0.0)
    """
    tokens = sum(len(s.response_ids) for g in groups for s in g.samples)
    out = dict(rollouts) | {f"timing_s/{k}": v for k, v in seconds.items()}
    out |= {
        "perf/generated_tokens_per_s": tokens / max(rollouts["timing_s/generate"], 1e-9),
        "rollout/generated_tokens": float(tokens),  # every round (DAPO), trained or not
        "timing_s/step": total,
    }
    if serial:
        out["timing_s/other"] = total - sum(out[f"timing_s/{k}"] for k in PHASES)
    busy = rolled["timing_s/generate"] + rolled["timing_s/verify"]
    out["perf/rollout_idle_frac"] = max(0.0, 1.0 - busy / total)
    out["perf/learner_idle_frac"] = max(0.0, 1.0 - seconds["learner"] / total)
    # the learner holds version step - 1 when it trains step t: how far behind each sample is
    lag = [step - 1 - s.policy_version for g in groups for s in g.samples]
    out["rollout/policy_lag"] = sum(lag) / len(lag)
    out["rollout/policy_lag_max"] = float(max(lag))
    return out
