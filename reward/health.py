"""The verifier's health, step by step: a broken verifier (a missing package, a crashing
parser, a timeout too short) scores every sample the task's lowest reward, which looks exactly
like all-incorrect collapse. This turns what the pool reports (its error texts and the worker
processes it replaced) into metrics, console lines and a summary for the report. Pure: no Ray.

>>> h = VerifierHealth(alert_frac=0.2)
>>> shares = {"reward/verifier_error_frac": 0.5, "reward/verifier_timeout_frac": 0.0}
>>> errors = ["RuntimeError: boom", "RuntimeError: boom", "worker process died (exit 3)"]
>>> m, lines = h.observe(1, shares, errors, restarts=1)
>>> sorted(m.items())  # doctest: +NORMALIZE_WHITESPACE
[('reward/verifier_errors/RuntimeError', 2.0), ('reward/verifier_errors/WorkerDied', 1.0),
 ('reward/verifier_restarts', 1.0)]
>>> lines[0]
'verifier error (first seen at step 1): RuntimeError: boom'
>>> lines[-1].startswith("ALERT step 1: the verifier failed on 50% of the samples")
True
>>> h.observe(2, {}, ["RuntimeError: boom"], 0)[1]  # a text already shown is not repeated
[]
"""

from __future__ import annotations

import re
from collections import Counter

MAX_TEXT = 200
"""Characters of an error text shown (the pool already cuts exception messages to 200)."""
PREFIXES = (  # the pool's own texts (reward/pool.py) -> a class name
    ("worker process died", "WorkerDied"),
    ("non-finite score", "NonFiniteScore"),
    ("warm-up of", "WarmUp"),
)


def error_class(text: str) -> str:
    """The class of an error text: the exception's type name (``"ValueError: ..."``), else
    the pool's own kind of failure, else ``Other``.

    >>> error_class("RecursionError: maximum recursion depth exceeded"), error_class("?!")
    ('RecursionError', 'Other')
    """
    for prefix, name in PREFIXES:
        if text.startswith(prefix):
            return name
    m = re.match(r"([A-Za-z_][A-Za-z0-9_.]*):", text)
    return m.group(1).rsplit(".", 1)[-1] if m else "Other"


class VerifierHealth:
    """``alert_frac``: an alert line when the share of a step's samples the verifier failed on
    (errors + timeouts) is above it; ``max_texts``: new distinct error texts shown per step."""

    def __init__(self, alert_frac: float, max_texts: int = 3):
        self.alert_frac, self.max_texts = alert_frac, max_texts
        self.first_seen: dict[str, int] = {}  # distinct error text -> the step it first came
        self.totals: Counter = Counter()  # error class -> count over the run
        self.restarts = 0
        self.alerts: list[int] = []  # steps with an alert

    def observe(
        self, step: int, metrics: dict[str, float], errors: list[str], restarts: int
    ) -> tuple[dict[str, float], list[str]]:
        """A step's health metrics (``reward/verifier_restarts``: worker processes or verifier
        actors replaced; ``reward/verifier_errors/<class>``: error counts) from its error texts
        and restarts, and the console lines: each new distinct text (up to ``max_texts``) and
        an alert when the failed share is above ``alert_frac``."""
        counts = Counter(error_class(e) for e in errors)
        self.totals.update(counts)
        self.restarts += restarts
        out = {"reward/verifier_restarts": float(restarts)}
        out |= {f"reward/verifier_errors/{c}": float(n) for c, n in sorted(counts.items())}
        lines = []
        for text in dict.fromkeys(errors):
            if text not in self.first_seen:
                self.first_seen[text] = step
                if len(lines) < self.max_texts:
                    lines.append(f"verifier error (first seen at step {step}): {text[:MAX_TEXT]}")
        err = metrics.get("reward/verifier_error_frac", 0.0)
        timeout = metrics.get("reward/verifier_timeout_frac", 0.0)
        if err + timeout > self.alert_frac:
            self.alerts.append(step)
            lines.append(
                f"ALERT step {step}: the verifier failed on {err + timeout:.0%} of the samples "
                f"(errors {err:.0%}, timeouts {timeout:.0%}; verifier.alert_frac "
                f"{self.alert_frac:g}): they score the lowest reward, which looks exactly like "
                "all-incorrect collapse"
            )
        return out, lines

    def summary(self) -> dict:
        """For the report (``verifier_health.json``): totals, alerts, the first texts seen."""
        return {
            "restarts": self.restarts,
            "errors": dict(self.totals.most_common()),
            "alert_steps": self.alerts,
            "first_texts": [
                {"step": s, "text": t[:MAX_TEXT]} for t, s in list(self.first_seen.items())[:20]
            ],
        }
