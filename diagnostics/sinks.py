"""Metric sinks: jsonl in the run directory (always) and one readable console line per step.

Values are plain floats; non-finite ones are written as null (JSON has no NaN). Nothing here
reads or writes secrets.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _clean(float(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


CONSOLE_KEYS = (
    ("reward/mean", "reward {:.3f}"),
    ("eval/accuracy", "eval {:.3f}"),
    ("acr/raw", "acr {:.2f}"),
    ("acr/effective", "eff {:.2f}"),
    ("avspo/triggered", "trig {:.0f}"),
    ("avspo/tau_adapt", "tau {:.3f}"),
    ("actor/grad_norm", "gnorm {:.3f}"),
    ("timing_s/step", "{:.1f}s"),
)


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}/{total}"]
    for key, fmt in CONSOLE_KEYS:
        if key in metrics and metrics[key] is not None:
            parts.append(fmt.format(metrics[key]))
    return " | ".join(parts)
