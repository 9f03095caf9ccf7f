"""Continuing a run: which checkpoint, whether this config may continue it, the metrics rows it
covers, and what is written when a run fails beyond its restarts (the emergency note)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

from launch.config import TrainConfig
from launch.schema_keys import convert_renamed
from launch.validation import ConfigError
from learner import checkpoint
from learner.estimators import unread_sections
from reward.tasks import Task


def resolve_resume(cfg: TrainConfig, ckpt_root: Path) -> Path | None:
    """The checkpoint folder ``trainer.resume`` names (``auto``: the newest under
    ``ckpt_root``), or None; a ConfigError naming the key when it cannot be used."""
    if cfg.trainer.resume is None:
        return None
    try:
        return checkpoint.resolve(cfg.trainer.resume, ckpt_root)
    except checkpoint.CheckpointError as err:
        raise ConfigError(f"trainer.resume: {err}") from None


def checkpoint_step(folder: Path | None) -> int:
    """The step of the checkpoint being resumed or evaluated (0 without one)."""
    return 0 if folder is None else int(checkpoint.read_state(folder)["step"])


def fingerprint(cfg: TrainConfig, task: Task) -> dict:
    """What a resume must match: the config (as JSON) and the training data."""
    data = hashlib.sha256()
    for p in task.train:
        data.update(json.dumps([p.uid, p.prompt, p.answer]).encode())
    config = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    return {"config": config, "train_data_sha256": data.hexdigest()}


def check_resumable(cfg: TrainConfig, task: Task, folder: Path) -> None:
    """Raise a ConfigError (before any actor starts) when this run may not continue the
    checkpoint in ``folder`` (:func:`resume_problem`)."""
    saved = checkpoint.read_state(folder).get("run")
    defaults = json.loads(json.dumps(dataclasses.asdict(TrainConfig()), default=str))
    problem = resume_problem(
        saved,
        fingerprint(cfg, task),
        cfg.trainer.resume_allow_changes,
        defaults,
        estimator=cfg.algorithm.estimator,
    )
    if problem:
        raise ConfigError(f"trainer.resume: {problem}")


class Stopped(Exception):
    """The run stopped early on request (a signal) at a step boundary, checkpoint written."""

    def __init__(self, reason: str, step: int, folder: str | None):
        super().__init__(f"stopped by {reason} after step {step}")
        self.reason, self.step, self.folder = reason, step, folder


class CheckpointFailed(RuntimeError):
    """Writing a checkpoint failed; the message names the newest intact one."""


EMERGENCY = "emergency.json"


def emergency_note(run_dir: Path, err: BaseException, resume: str) -> str:
    """After a failure the run cannot survive (a learner rank died: its ZeRO shards and
    optimizer state are gone; a stage failed beyond its restarts; ...): write
    ``<run_dir>/emergency.json`` (the error, the last step logged, the newest checkpoint that
    passes its manifest check, the command that continues the run) and return the message for
    the console. Nothing is written into the checkpoints; ``metrics.jsonl`` keeps every row up
    to the failed step (a resume truncates it to the checkpoint's step)."""
    root = run_dir / "checkpoints"
    intact, refused = None, []
    for folder in reversed(checkpoint.checkpoints(root) if root.is_dir() else []):
        try:
            checkpoint.verify(folder)
        except checkpoint.CheckpointError as bad:
            refused.append(str(bad))
            continue
        intact = folder
        break
    metrics = run_dir / "metrics.jsonl"
    steps = (
        [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
        if (metrics.exists())
        else []
    )
    note = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "error": f"{type(err).__name__}: {err}",
        "last_step_logged": max(steps, default=None),
        "checkpoint": str(intact) if intact else None,
        "checkpoints_refused": refused,
        "resume": resume if intact else None,
    }
    (run_dir / EMERGENCY).write_text(json.dumps(note, indent=1) + "\n")
    where = (
        f"the newest intact checkpoint is {intact}; continue with: {resume}"
        if intact
        else "no intact checkpoint exists: a rerun starts from step 0"
    )
    return f"error: the run failed ({note['error']}); {where} (details: {run_dir / EMERGENCY})"


RESUME_FREE = (
    "trainer.total_steps", "trainer.resume", "trainer.run_dir", "trainer.eval_every",
    "trainer.save_every", "trainer.keep_checkpoints", "trainer.resume_allow_changes",
    "trainer.eval_tasks", "trainer.eval_pass_k", "trainer.eval_temperature",
    "trainer.eval_max_new_tokens", "logger", "cluster", "rollout.timeout_s",
    "rollout.start_timeout_s", "learner.timeout_s", "verifier", "model.cache_dir",
)  # fmt: skip
"""Config keys (prefixes) that do not change a run's training results: free on resume."""


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        out |= _flat(v, key) if isinstance(v, dict) and v else {key: v}
    return out


def resume_problem(
    saved: dict | None,
    now: dict,
    allowed: list[str],
    defaults: dict | None = None,
    estimator: str | None = None,
) -> str | None:
    """Why a run may not continue a checkpoint: the keys whose values differ (beyond
    :data:`RESUME_FREE` and ``allowed``), or different training data. None when it may.

    - A key the checkpoint's run did not have yet (added to the trainer since) counts as its
      value in ``defaults`` (the config dataclasses' defaults, which keep the old behaviour).
    - A key saved under an old name is read under its new one (``schema_keys.CONVERTED``).
    - With ``estimator`` (both runs' ``algorithm.estimator``), the sections only other
      estimators read are free (``estimators.unread_sections``); a changed estimator is refused
      by its own key, and then nothing is free.

    >>> a = {"config": {"learner": {"lr": 1e-6}, "trainer": {"total_steps": 5}},
    ...      "train_data_sha256": "x"}
    >>> b = {"config": {"learner": {"lr": 2e-6}, "trainer": {"total_steps": 9}},
    ...      "train_data_sha256": "x"}
    >>> print(resume_problem(a, b, []))  # doctest: +NORMALIZE_WHITESPACE
    the config differs from the checkpoint's run in learner.lr (1e-06 -> 2e-06); allow with
    trainer.resume_allow_changes=[learner.lr]
    >>> resume_problem(a, b, ["learner.lr"]) is None
    True
    >>> c = {"config": {"learner": {"lr": 1e-6, "new_key": 0}, "trainer": {"total_steps": 5}},
    ...      "train_data_sha256": "x"}
    >>> resume_problem(a, c, [], defaults={"learner": {"new_key": 0}}) is None  # at its default
    True
    """
    if saved is None:  # written before checkpoints recorded their run
        return None
    old, new = convert_renamed(_flat(saved["config"])), _flat(now["config"])
    unread = []
    if estimator is not None and old.get("algorithm.estimator") == estimator:
        unread = unread_sections(estimator)
    free = (*RESUME_FREE, *allowed, *unread)
    is_free = lambda key: any(key == f or key.startswith(f + ".") for f in free)  # noqa: E731
    for key, value in _flat(defaults or {}).items():
        if key not in old and key in new:
            old[key] = value
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    changed = [k for k in changed if not is_free(k)]
    if changed:
        shown = ", ".join(f"{k} ({old.get(k)} -> {new.get(k)})" for k in changed[:5])
        return (
            f"the config differs from the checkpoint's run in {shown}; allow with "
            f"trainer.resume_allow_changes=[{','.join(changed)}]"
        )
    if saved["train_data_sha256"] != now["train_data_sha256"] and not is_free("task"):
        return (
            "the training data differs from the checkpoint's run (task files or generation "
            "changed); allow with trainer.resume_allow_changes=[task]"
        )
    return None


LOGS = ("metrics.jsonl", "samples.jsonl")
"""The run directory's per-step logs (rows with ``step``), cut back together on resume."""


def truncate_logs(run_dir: Path, step: int) -> dict:
    """:func:`truncate_metrics` on each of :data:`LOGS` (``samples.jsonl``: several rows a step,
    ``logger.samples``); returns metrics.jsonl's kept row of ``step``."""
    kept = [truncate_metrics(Path(run_dir) / name, step) for name in LOGS]
    return kept[0]


def truncate_metrics(path: Path, step: int) -> dict:
    """Keep the rows of steps <= ``step`` (those the checkpoint covers); rows of later steps
    (written before the run stopped, about to be recomputed) move to ``<name>.pre_resume.jsonl``
    (``metrics.pre_resume.jsonl``) so nothing is lost and the file has each step once; the run
    then appends. Returns the kept row of ``step`` (the last, if several; empty if none): a
    finished run's final metrics when no step is left to run."""
    if not path.exists():
        return {}
    keep, moved, last = [], [], {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            (keep if row["step"] <= step else moved).append(line + "\n")
            if row["step"] == step:
                last = row
    if moved:
        with path.with_name(f"{path.stem}.pre_resume.jsonl").open("a") as f:
            f.writelines(moved)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    tmp.replace(path)
    return last
