"""What the model wrote: a few of each training step's rollouts, logged whole (``logger.samples``
= n), as verl's ``log_val_generations`` and TRL's ``log_completions`` do for theirs.

Which: n of the step's N generated samples, evenly spread over them in generation order (group
by group): the k-th is sample ``floor(k * N / n)`` (k = 0..n-1), so with n >= the number of
groups every group is seen, and all N when n >= N. Deterministic: a rerun, or a resumed run,
logs the same ones. Every generated group counts (DAPO's untrained ones too: ``trained`` false).

Each is one record (:data:`FIELDS`): ``step``; ``group_id`` (the group's index in the step) and
``sample`` (its index in the group); ``prompt_uid``, ``prompt`` (as the engine saw it),
``response``, ``reference`` (the answer it is checked against); ``reward`` (what the estimator
saw: after ``algorithm.reward`` mixing and overlong shaping), ``score`` and ``verdict`` (the
verifier's score and reason: ``ok``, ``wrong``, ``no_answer``, ``timeout``, ...), ``correct``
(score >= the task's highest reward, as evaluation counts solved); ``advantage`` (0 for a group
not trained or whose verification failed); ``group_rewards`` (the rewards of its whole group, so
the advantage can be read off them); ``trained``; ``finish_reason``, ``response_tokens``.

They go to ``samples.jsonl`` in the run dir (:class:`SamplesSink`, one JSON object a line,
appended; a resume cuts it back to the checkpoint's step as it does metrics.jsonl:
launch/resume.py), a wandb table per step (diagnostics/sinks.py), and report.md shows a few of
the first and the last step (:func:`report_lines`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

FIELDS = (
    "step", "group_id", "sample", "prompt_uid", "prompt", "response", "reference", "reward",
    "score", "verdict", "correct", "advantage", "group_rewards", "trained", "finish_reason",
    "response_tokens",
)  # fmt: skip


def pick(sizes: list[int], n: int) -> list[tuple[int, int]]:
    """``(group, sample)`` of ``n`` samples spread evenly over the step's samples (groups of
    ``sizes``), in generation order.

    >>> pick([4, 4, 4, 4], 2)  # samples 0 and 8 of 16
    [(0, 0), (2, 0)]
    >>> pick([4, 4], 4)  # samples 0, 2, 4, 6
    [(0, 0), (0, 2), (1, 0), (1, 2)]
    >>> pick([2, 1], 5)  # n >= N: every sample
    [(0, 0), (0, 1), (1, 0)]
    """
    where = [(g, i) for g, size in enumerate(sizes) for i in range(size)]
    n = min(n, len(where))
    return [where[k * len(where) // n] for k in range(n)]


def sample_records(step: int, rollouts, rewards, advantages, n: int, solved_at: float) -> list:
    """The records of :func:`pick`'s ``n`` samples of one step. ``rollouts``: the step's
    ``problems``, ``groups``, ``verdicts`` (the verifier's, sample order) and ``trained`` (per
    group), as launch/rollouts.py holds them; ``rewards`` and ``advantages``: every sample's
    (``[N]``, sample order: the advantage stage's); ``solved_at``: the task's highest reward."""
    groups = rollouts.groups
    if not n or not groups:
        return []
    rewards, advantages = [float(x) for x in rewards], [float(x) for x in advantages]
    starts = [0]
    for g in groups:
        starts.append(starts[-1] + len(g.samples))
    out = []
    for gi, i in pick([len(g.samples) for g in groups], n):
        g, problem, row = groups[gi], rollouts.problems[gi], starts[gi] + i
        sample, verdict = g.samples[i], rollouts.verdicts[row]
        values = (
            step, gi, i, problem.uid, g.prompt, sample.text, problem.answer, rewards[row],
            float(verdict.score), verdict.reason, float(verdict.score) >= solved_at,
            advantages[row], rewards[starts[gi] : starts[gi + 1]], bool(rollouts.trained[gi]),
            sample.finish_reason, len(sample.response_ids),
        )  # fmt: skip
        out.append(dict(zip(FIELDS, values, strict=True)))
    return out


class SamplesSink:
    """``samples.jsonl``: :func:`sample_records`' records, one JSON object a line, appended
    (non-finite numbers as null); no metrics (``log`` is for the other sinks)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_samples(self, step: int, records: list[dict]) -> None:
        for record in records:
            self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _finite(value):
    """``value`` with non-finite floats as None (JSON has no NaN), in dicts and lists too."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _num(value, fmt: str = "g") -> str:
    return "null" if value is None else format(value, fmt)


def read_samples(path: str | Path) -> dict[int, list[dict]]:
    """``samples.jsonl`` as step -> its records (empty when there is none)."""
    path = Path(path)
    steps: dict[int, list[dict]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                steps.setdefault(record["step"], []).append(record)
    return dict(sorted(steps.items()))


def _block(text: str, limit: int) -> list[str]:
    """``text`` (cut at ``limit`` characters) in a fence longer than any backtick run in it."""
    text = text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more]"
    fence, run = "```", 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        fence = "`" * max(len(fence), run + 1)
    return [f"{fence}text", text, fence]


def report_lines(run_dir: str | Path, per_step: int = 3, limit: int = 600) -> list[str]:
    """report.md's "Samples" section: ``per_step`` records of the first and of the last step in
    ``samples.jsonl`` (none without the file)."""
    steps = read_samples(Path(run_dir) / "samples.jsonl")
    if not steps:
        return []
    logged = sum(map(len, steps.values()))
    lines = ["## Samples", "", f"What the model wrote (samples.jsonl: {logged} rollouts of "
             f"{len(steps)} steps, logger.samples); prompts and responses cut at {limit} "
             "characters.", ""]  # fmt: skip
    for step in dict.fromkeys((min(steps), max(steps))):
        lines += [f"### Step {step}", ""]
        for r in steps[step][:per_step]:
            rewards = ", ".join(_num(x) for x in r["group_rewards"])
            lines += [
                f"Group {r['group_id']}, sample {r['sample']} (`{r['prompt_uid']}`): reward "
                f"{_num(r['reward'])} ({r['verdict']}{', correct' if r['correct'] else ''}; its "
                f"group's: {rewards}), advantage {_num(r['advantage'], '+.3f')}, "
                f"{r['response_tokens']} tokens "
                f"({r['finish_reason']}); reference `{r['reference']}`.",
                "", *_block(r["prompt"], limit), "", *_block(r["response"], limit), "",
            ]  # fmt: skip
    return lines
