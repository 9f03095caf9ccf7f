"""Hand-made experiment files and result rows for the harness's tests (launch.reproduce)."""

from __future__ import annotations

import json
from pathlib import Path

from launch.experiments.experiment import cell_id
from launch.experiments.grid import command


def experiment_file(tmp_path: Path, **extra) -> Path:
    """An experiment file of two methods over seeds 0-2; ``extra`` replaces or adds keys (None
    leaves a key out). Its endpoint is greedy accuracy, the figure :func:`row` makes."""
    spec = {
        "description": "two methods",
        "results": str(tmp_path / "res" / "demo.jsonl"),
        "runs_dir": str(tmp_path / "runs"),
        "report": str(tmp_path / "RESULTS.md"),
        "seeds": [0, 1, 2],
        "base": ["rollout=hf"],
        "axes": {"method": {"grpo": ["algorithm=grpo"], "avspo": ["algorithm=avspo"]}},
        "baseline": {"method": "grpo"},
        "endpoint": "final_accuracy",
        **extra,
    }
    spec = {k: v for k, v in spec.items() if v is not None}
    path = tmp_path / "demo.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def row(exp, method: str, seed: int, acc: float, tokens: float = 100.0, **kw) -> dict:
    cell = {"method": method}
    return {
        "cell_id": cell_id(cell),
        "cell": cell,
        "seed": seed,
        "command": command(exp, cell, seed),
        "status": "ok",
        "final_accuracy": acc,
        "generated_tokens": tokens,
        **kw,
    }


def evals_row(exp, method, seed, mean_at_k, start=0.2, tokens=100.0, **kw):
    """A row with a two-point mean@k curve (step 0 at ``start``, the end at ``mean_at_k``)."""
    evals = [
        {"step": 0, "accuracy": 0.3, "mean_at_k": start, "generated_tokens": 0.0},
        {"step": 4, "accuracy": 0.3, "mean_at_k": mean_at_k, "generated_tokens": tokens},
    ]
    return row(exp, method, seed, 0.3, tokens, evals=evals, final_mean_at_k=mean_at_k,
               start_mean_at_k=start, **kw)  # fmt: skip
