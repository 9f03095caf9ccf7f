"""Tasks: prompts with reference answers, the verifier that scores them, and the reward range.

``make_task(cfg)`` builds one by name: ``arithmetic`` (generated, the embedded default),
``gsm8k`` / ``math`` / ``math500`` (local jsonl or parquet files; nothing is downloaded) and
``reasoning_gym`` (procedural tasks with their own scorers). A bad data row is an error naming
the file, row and reason, or is skipped and counted (``on_bad_row: skip``).

>>> task = make_task(TaskConfig(difficulty=1, num_train=5, num_test=3))  # default level: 3
>>> task.name, task.verifier, task.reward_range, len(task.train), len(task.test)
('arithmetic', 'numeric', (0.0, 1.0), 5, 3)
>>> task.train[0].prompt, task.train[0].answer
('2+7=', '9')
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reward.arithmetic import LEVELS, sample_problems
from reward.extract import extract_boxed

TASK_NAMES = ("arithmetic", "gsm8k", "math", "math500", "reasoning_gym")
ANSWER_FORMATS = ("plain", "gsm8k", "boxed")


@dataclass(frozen=True)
class Problem:
    uid: str  # stable id: the ACR monitor's per-prompt key
    question: str  # the problem as the data has it
    prompt: str  # what the policy sees (the task's template applied)
    answer: str  # the bare reference answer the verifier compares against


@dataclass
class Task:
    name: str
    verifier: str
    reward_range: tuple[float, float]
    train: list[Problem]
    test: list[Problem]
    skipped_rows: int = 0  # bad rows skipped under on_bad_row=skip


class DataError(ValueError):
    """A data row is unusable; the message names the file, row and reason."""


@dataclass
class TaskConfig:
    """The task group (``conf/task/*.yaml``)."""

    name: str = field(default="arithmetic", metadata={"choices": TASK_NAMES})
    verifier: str = field(
        default="numeric", metadata={"choices": ("numeric", "math", "reasoning_gym")}
    )
    reward_lo: float = 0.0
    reward_hi: float = 1.0
    prompt_template: str = "{question}="
    """``{question}`` is replaced by the problem text (no other formatting is applied)."""
    seed: int = 0
    num_train: int = field(default=4096, metadata={"ge": 1})
    """Problems to generate (arithmetic, reasoning_gym), or a cap on rows read (files)."""
    num_test: int = field(default=256, metadata={"ge": 1})
    difficulty: int = field(default=3, metadata={"ge": 0, "le": LEVELS - 1})
    """Arithmetic level L0..L6."""
    train_file: str | None = None
    test_file: str | None = None
    question_key: str = "question"
    answer_key: str = "answer"
    answer_format: str = field(default="plain", metadata={"choices": ANSWER_FORMATS})
    """plain: the answer column is the answer; gsm8k: after '####'; boxed: in the last \\boxed{}."""
    on_bad_row: str = field(default="error", metadata={"choices": ("error", "skip")})
    gym_dataset: str = "basic_arithmetic"
    gym_config: dict[str, Any] = field(default_factory=dict)

    def check(self) -> str | None:
        if not self.reward_lo < self.reward_hi:
            return f"reward_lo={self.reward_lo} must be < reward_hi={self.reward_hi}"
        if self.name in ("gsm8k", "math") and not (self.train_file and self.test_file):
            return f"task {self.name!r} reads local files: set task.train_file and task.test_file"
        if self.name == "math500" and not self.test_file:
            return "task 'math500' reads a local file: set task.test_file"
        if "{question}" not in self.prompt_template:
            return "prompt_template must contain {question}"
        return None


def _prompt(cfg: TaskConfig, question: str) -> str:
    return cfg.prompt_template.replace("{question}", question)


def _arithmetic(cfg: TaskConfig) -> Task:
    def problems(split: str, n: int) -> list[Problem]:
        return [
            Problem(
                uid=f"L{cfg.difficulty}:{expr}",
                question=expr,
                prompt=_prompt(cfg, expr),
                answer=str(value),
            )
            for expr, value in sample_problems(cfg.difficulty, n, split=split, seed=cfg.seed)
        ]

    return Task(
        "arithmetic",
        cfg.verifier,
        (cfg.reward_lo, cfg.reward_hi),
        problems("train", cfg.num_train),
        problems("test", cfg.num_test),
    )


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row) of a jsonl or parquet file; a jsonl line that is not JSON
    yields a DataError in place of its row."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row
        return
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as err:
                yield i, DataError(f"{path}: row {i}: not valid JSON ({err.msg})")


def _answer_of(raw: Any, fmt: str) -> str:
    text = str(raw).strip()
    if fmt == "gsm8k":
        _, sep, after = text.rpartition("####")
        if not sep:
            raise ValueError("answer has no '#### <answer>' line")
        text = after.strip().replace(",", "")
    elif fmt == "boxed":
        boxed = extract_boxed(text)
        if boxed is None:
            raise ValueError("solution has no complete \\boxed{...}")
        text = boxed
    if not text:
        raise ValueError("empty answer")
    return text


def load_problems(path: str | Path, cfg: TaskConfig, limit: int) -> tuple[list[Problem], int]:
    """Problems from a local file, and the number of bad rows skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    problems, skipped = [], 0
    for i, row in _rows(path):
        if len(problems) >= limit:
            break
        try:
            if isinstance(row, DataError):
                raise row
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {i}: expected an object, got {type(row).__name__}")
            for key in (cfg.question_key, cfg.answer_key):
                if key not in row or row[key] is None:
                    raise DataError(f"{path}: row {i}: missing column {key!r}")
            question = str(row[cfg.question_key]).strip()
            if not question:
                raise DataError(f"{path}: row {i}: empty {cfg.question_key!r}")
            try:
                answer = _answer_of(row[cfg.answer_key], cfg.answer_format)
            except ValueError as err:
                raise DataError(f"{path}: row {i}: {err}") from None
        except DataError:
            if cfg.on_bad_row == "error":
                raise
            skipped += 1
            continue
        problems.append(
            Problem(
                uid=f"{path.name}:{i}",
                question=question,
                prompt=_prompt(cfg, question),
                answer=answer,
            )
        )
    return problems, skipped


def _from_files(cfg: TaskConfig) -> Task:
    train, skipped_train = ([], 0)
    if cfg.train_file:
        train, skipped_train = load_problems(cfg.train_file, cfg, cfg.num_train)
    test, skipped_test = load_problems(cfg.test_file, cfg, cfg.num_test)
    return Task(
        cfg.name,
        cfg.verifier,
        (cfg.reward_lo, cfg.reward_hi),
        train,
        test,
        skipped_rows=skipped_train + skipped_test,
    )


def _reasoning_gym(cfg: TaskConfig) -> Task:
    import reasoning_gym

    data = reasoning_gym.create_dataset(
        cfg.gym_dataset, size=cfg.num_train + cfg.num_test, seed=cfg.seed, **cfg.gym_config
    )
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {"train": [], "test": []}
    for i, entry in enumerate(data):
        question = entry["question"]
        if question in seen:  # a question never lands in both splits
            continue
        seen.add(question)
        split = "train" if len(splits["train"]) < cfg.num_train else "test"
        ref = json.dumps({"dataset": cfg.gym_dataset, "entry": entry}, default=list)
        splits[split].append(
            Problem(
                uid=f"{cfg.gym_dataset}:{i}",
                question=question,
                prompt=_prompt(cfg, question),
                answer=ref,
            )
        )
    return Task(
        cfg.name, "reasoning_gym", (cfg.reward_lo, cfg.reward_hi), splits["train"], splits["test"]
    )


TASKS: dict[str, Callable[[TaskConfig], Task]] = {
    "arithmetic": _arithmetic,
    "gsm8k": _from_files,
    "math": _from_files,
    "math500": _from_files,
    "reasoning_gym": _reasoning_gym,
}


def make_task(cfg: TaskConfig) -> Task:
    problem = cfg.check()
    if problem:
        raise ValueError(f"task: {problem}")
    return TASKS[cfg.name](cfg)
