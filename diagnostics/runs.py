"""A run directory's data as the run report (report.py) and its plots (plots.py) both read it.

:class:`Run` holds ``metrics.jsonl`` as step -> finite metric values (report.py loads it);
:func:`early_warning_step` is the first step of the ACR monitor's alert.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    """One run directory's data."""

    path: Path
    rows: dict[int, dict[str, float]]  # step -> finite metric values (nulls dropped), ascending
    config: dict = field(default_factory=dict)
    prompt_history: dict | None = None  # {"summary": {...}, "prompts": {key: [n, high, low]}}

    @property
    def name(self) -> str:
        return self.path.name

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps that log ``key`` with a finite value, and those values.

        >>> Run(Path("r"), {0: {"a": 1.0}, 1: {"b": 2.0}, 2: {"a": 3.0}}).series("a")
        ([0, 2], [1.0, 3.0])
        """
        steps = [s for s, row in self.rows.items() if key in row]
        return steps, [self.rows[s][key] for s in steps]

    def metric_names(self) -> set[str]:
        return {k for row in self.rows.values() for k in row}


def early_warning_step(run: Run) -> int | None:
    """First step whose ``acr/early_warning`` is 1 (the monitor's alert), if any."""
    return next((s for s, v in zip(*run.series("acr/early_warning"), strict=True) if v), None)
