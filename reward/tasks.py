"""Tasks: prompts with reference answers, the verifier that scores them, and the reward range.

``make_task(cfg)`` builds one by name: ``arithmetic`` (generated, the embedded default),
``gsm8k`` / ``math`` and the test-only evaluation sets ``math500`` / ``minerva_math`` /
``olympiadbench`` / ``amc23`` / ``aime24`` / ``mmlu_pro`` (a hub dataset, ``task.dataset``, or
local files, ``task.test_file`` / ``task.train_file``, in their published layouts, see
``conf/task/<name>.yaml``; read with the ``datasets`` library, reward/data.py) and
``reasoning_gym`` (procedural tasks with their own scorers). A bad data row is an error naming
the file (or dataset split), row and reason, or is skipped and counted (``on_bad_row: skip``). A
training run on an empty train split stops with an error.

>>> task = make_task(TaskConfig(difficulty=1, num_train=5, num_test=3))  # default level: 3
>>> task.name, task.verifier, task.reward_range, len(task.train), len(task.test)
('arithmetic', 'numeric', (0.0, 1.0), 5, 3)
>>> task.train[0].prompt, task.train[0].answer
('2+7=', '9')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reward.arithmetic import LEVELS, sample_problems
from reward.cells import answer_of, cell, chat_messages, options_of
from reward.data import DataError, file_rows, hub_rows
from reward.extract import ANSWER_EXTRACTIONS, CHOICE_LETTERS
from reward.verifiers import VERIFIERS, gym_reference, verifier_name

TEST_ONLY_TASKS = ("math500", "minerva_math", "olympiadbench", "amc23", "aime24", "mmlu_pro")
"""Evaluation sets: only ``task.test_file`` is needed; the train split is empty."""
FILE_TASKS = ("gsm8k", "math", "custom", *TEST_ONLY_TASKS)
TASK_NAMES = ("arithmetic", *FILE_TASKS, "reasoning_gym")
ANSWER_FORMATS = ("plain", "gsm8k", "boxed", "list_first", "letter")
VERIFIER_NAMES = ("numeric", "math", "reasoning_gym", "choice")


@dataclass(frozen=True)
class Problem:
    uid: str  # stable id: the ACR monitor's per-prompt key
    question: str  # the problem as the data has it (chat messages: the last user turn's text)
    prompt: str  # what the policy sees (the task's template applied)
    answer: str  # the bare reference answer the verifier compares against
    # chat messages as the data has them (verl's ``prompt`` column): launch/prompts.py renders
    # them with the model's own chat template instead of ``prompt``
    messages: tuple[tuple[tuple[str, str], ...], ...] | None = None
    data_source: str | None = None  # the row's ``data_source`` (verl's layout), kept as is


@dataclass
class Task:
    name: str
    verifier: str  # the registered name to score with (TaskConfig.answer_extraction applied)
    reward_range: tuple[float, float]
    train: list[Problem]
    test: list[Problem]
    skipped_rows: int = 0  # bad rows skipped under on_bad_row=skip
    verifiers: dict[str, str] = field(default_factory=dict)  # data_source -> registered name


@dataclass
class TaskConfig:
    """The task group (``conf/task/*.yaml``)."""

    name: str = field(default="arithmetic", metadata={"choices": TASK_NAMES})
    verifier: str = "numeric"
    """numeric (exact numbers), math (numbers, then math-verify on LaTeX), reasoning_gym (the
    dataset's own scorer), choice (an option letter A-J, multiple choice); reward/verifiers.py.
    Or your own function: ``pkg.module:function`` or ``path/to/file.py:function``, in verl's
    form ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` or
    ``fn(response, reference) -> Verdict`` (reward/custom.py)."""
    verifiers: dict[str, str] = field(default_factory=dict)
    """Per verl ``data_source``: the verifier of the rows from that source (a built-in name or a
    function, as ``verifier``); rows of other sources use ``verifier``. E.g.
    ``+task.verifiers.openai/gsm8k=gsm8k_reward.py:compute_score``."""
    answer_extraction: str = field(default="auto", metadata={"choices": ANSWER_EXTRACTIONS})
    """How the verifier finds the answer in a response. auto: the last complete ``\\boxed{}``,
    else the last ``#### ...``, else the last ``Answer: ...`` / ``answer is ...``, else the last
    number (choice: "The answer is (X)", "Answer: X" or ``\\boxed{X}``, the last one). boxed: only
    a complete final ``\\boxed{...}``, with no fallback, so a truncated, half-written derivation is
    never credited by its last number. The reference side is the same in both. ``make_task``
    resolves the pair to the registered verifier name in ``Task.verifier`` (``math`` + boxed ->
    ``math_boxed``), which is what the pool is given."""
    reward_lo: float = 0.0
    reward_hi: float = 1.0
    prompt_template: str = "{question}="
    """``{question}`` is replaced by the problem text (no other formatting is applied); with
    ``options_key`` the problem text ends with its lettered options."""
    chat_template: bool = False
    """Render prompts with the tokenizer's own ``apply_chat_template``: ``system_prompt`` as the
    system turn, the templated question (``prompt_template`` applied) as the user turn."""
    system_prompt: str | None = None
    """The system turn when ``chat_template`` is on (null: none)."""
    truncated: str = field(default="as_is", metadata={"choices": ("as_is", "lowest")})
    """A response that hit the length limit is scored as verified (as_is) or given the task's
    lowest reward (lowest)."""
    seed: int = 0
    num_train: int = field(default=4096, metadata={"ge": 1})
    """Problems to generate (arithmetic, reasoning_gym), or a cap on rows read (files)."""
    num_test: int = field(default=256, metadata={"ge": 1})
    difficulty: int = field(default=3, metadata={"ge": 0, "le": LEVELS - 1})
    """Arithmetic level L0..L6."""
    dataset: str | None = None
    """A hub dataset id (or a local folder in a hub layout), read with the ``datasets`` library
    (reward/data.py): the splits ``train_split`` / ``test_split`` of ``dataset_config``. Local
    files (``test_file``, and ``train_file`` to train on) replace it when ``test_file`` is set."""
    dataset_config: str | None = None
    """The hub dataset's configuration (subset), e.g. ``main`` for openai/gsm8k."""
    train_split: str | None = "train"
    """``dataset``'s split to train on (null: none; test-only tasks have none)."""
    test_split: str = "test"
    """``dataset``'s split to evaluate on."""
    train_file: str | None = None
    """A local file or glob (jsonl, json, parquet or arrow) to train on."""
    test_file: str | None = None
    """A local file or glob to evaluate on."""
    question_key: str = "question"
    """The question column (e.g. ``problem`` for MATH files; ``Problem`` in some AIME mirrors)."""
    answer_key: str = "answer"
    """The answer column (e.g. ``solution``, ``final_answer``; ``Answer`` in some mirrors)."""
    answer_format: str = field(default="plain", metadata={"choices": ANSWER_FORMATS})
    """How the answer column holds the reference. plain: it is the answer (a number column such
    as 27.0 becomes "27"); gsm8k: after '####'; boxed: in the last \\boxed{} of a solution;
    list_first: the first element of a list of strings, ``$`` delimiters stripped
    (OlympiadBench's ``final_answer``); letter: an option letter A-J (MMLU-Pro's ``answer``)."""
    options_key: str | None = None
    """Multiple choice: the column holding the list of options (at most 10; trailing "N/A"
    padding dropped). They are listed after the question as "A. ...", "B. ..." lines, and the
    letter answer must name one of them (``answer_format: letter``)."""
    on_bad_row: str = field(default="error", metadata={"choices": ("error", "skip")})
    over_long: str = field(default="filter", metadata={"choices": ("filter", "error")})
    """A prompt whose tokens plus its response budget exceed ``rollout.max_model_len``: dropped
    and counted (filter: ``data/over_long_prompts``, a line in the log) or the run refused
    (error). A split left with no prompt is refused either way."""
    gym_dataset: str = "basic_arithmetic"
    """A reasoning_gym dataset whose scorer was audited (reward/gym_audit.py: scorers that evaluate
    the answer get a pre-check; ``composite`` and ``game_of_life_halting`` are refused)."""
    gym_config: dict[str, Any] = field(default_factory=dict)
    gym_reward: str = field(default="binary", metadata={"choices": ("binary", "partial")})
    """binary: 1 when the dataset's scorer gives its top score (1.0), else 0; partial: the
    scorer's own score (many give partial credit to answers that are not answers:
    docs/configuration.md has each one's rule)."""

    def check_verifier(self) -> str | None:
        """Why ``verifier`` cannot score this task, or None (reward/custom.py)."""
        from reward.custom import verifier_problem

        return verifier_problem(self.verifier, self.name, self.answer_extraction, VERIFIER_NAMES)

    def check(self) -> str | None:
        if not self.reward_lo < self.reward_hi:
            return f"reward_lo={self.reward_lo} must be < reward_hi={self.reward_hi}"
        if self.train_file and not self.test_file:  # keys relative: the caller names the task
            return "train_file: needs test_file too (local files replace dataset, both splits)"
        if self.name in FILE_TASKS and not (self.test_file or self.dataset):
            return (
                f"dataset: task {self.name!r} reads a dataset: set it (a hub id) or "
                "test_file (and train_file to train on it)"
            )
        if "{question}" not in self.prompt_template:
            return "prompt_template must contain {question}"
        if self.options_key is not None and self.answer_format != "letter":
            return "options_key lists lettered options: set answer_format to letter"
        if self.name == "reasoning_gym":
            from reward.gym_audit import dataset_problem

            problem = dataset_problem(self.gym_dataset)
            if problem:
                return f"gym_dataset: {problem}"
        from reward import custom

        for source, name in self.verifiers.items():
            problem = TaskConfig(name=self.name, verifier=name).check_verifier()
            if problem:
                return f"verifiers.{source}: {problem}"
        if self.name == "custom" and not custom.is_spec(self.verifier):
            return (
                "task=custom scores with your function: set task.verifier=path/to/file.py:"
                "function (or pkg.module:function)"
            )
        problem = self.check_verifier()
        if problem:
            return problem
        verifier = "reasoning_gym" if self.name == "reasoning_gym" else self.verifier
        if self.answer_extraction != "auto" and verifier + "_boxed" not in VERIFIERS:
            return f"answer_extraction={self.answer_extraction}: verifier {verifier!r} has none"
        return None


def _verifier(cfg: TaskConfig) -> str:
    """The registered name ``Task.verifier`` holds: a function's spec (its path made absolute),
    or the built-in verifier with ``answer_extraction`` applied."""
    from reward import custom

    if custom.is_spec(cfg.verifier):
        return custom.resolve(cfg.verifier)
    return verifier_name(cfg.verifier, cfg.answer_extraction)


def _prompt(cfg: TaskConfig, question: str) -> str:
    return cfg.prompt_template.replace("{question}", question)


def _arithmetic(cfg: TaskConfig, key: str) -> Task:
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
        _verifier(cfg),
        (cfg.reward_lo, cfg.reward_hi),
        problems("train", cfg.num_train),
        problems("test", cfg.num_test),
    )


def _question_of(raw: Any, cfg: TaskConfig, where: str) -> tuple[str, Any]:
    """(the question's text, its chat messages or None) of a question cell: text, or verl's
    chat messages (the text is the last user turn's); anything else a DataError at ``where``."""
    messages = None
    try:
        if isinstance(raw, list | tuple | dict):  # verl's chat messages, or refused
            messages = chat_messages(raw, cfg.question_key)
            raw = [dict(m) for m in messages if dict(m)["role"] == "user"][-1]["content"]
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None
    question = str(raw).strip()
    if not question:
        raise DataError(f"{where}: empty {cfg.question_key!r}")
    return question, messages


def load_problems(
    source: str, rows: Iterator[tuple[int, Any]], cfg: TaskConfig, limit: int
) -> tuple[list[Problem], int]:
    """Problems from ``rows`` (reward/data.py) of ``source`` (a file, or a hub dataset's split:
    what error messages and problem uids name), and the number of bad rows skipped."""
    path, name = source, Path(source).name  # a glob or a hub split: the name as given
    problems, skipped, seen = [], 0, 0
    for i, row in rows:
        seen += 1
        if len(problems) >= limit:
            break
        try:
            if isinstance(row, DataError):
                raise row
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {i}: expected an object, got {type(row).__name__}")
            for key in (cfg.question_key, cfg.answer_key):
                if cell(row, key) is None:
                    raise DataError(f"{path}: row {i}: missing column {key!r}")
            question, messages = _question_of(cell(row, cfg.question_key), cfg, f"{path}: row {i}")
            try:
                answer = answer_of(cell(row, cfg.answer_key), cfg.answer_format, cfg.answer_key)
                if cfg.options_key is not None:
                    options = options_of(row.get(cfg.options_key), cfg.options_key)
                    if CHOICE_LETTERS.index(answer) >= len(options):
                        raise ValueError(
                            f"{cfg.answer_key!r} is {answer!r} but there are only "
                            f"{len(options)} options"
                        )
                    question += "\n" + "\n".join(
                        f"{letter}. {option}"
                        for letter, option in zip(CHOICE_LETTERS, options, strict=False)
                    )
            except ValueError as err:
                raise DataError(f"{path}: row {i}: {err}") from None
        except DataError:
            if cfg.on_bad_row == "error":
                raise
            skipped += 1
            continue
        source = row.get("data_source")
        problems.append(
            Problem(
                uid=f"{name}:{i}",
                question=question,
                prompt=_prompt(cfg, question),
                answer=answer,
                messages=messages,
                data_source=source if isinstance(source, str) else None,
            )
        )
    if not seen:
        raise DataError(f"{path}: empty (no rows)")
    if not problems and limit > 0:
        raise DataError(f"{path}: every row is bad ({skipped} skipped under on_bad_row=skip)")
    return problems, skipped


def _split(cfg: TaskConfig, key: str, which: str, split: str | None, limit: int):
    """One split's problems (``which``: train or test; errors name the task's ``key``): local
    files (``test_file`` set: the files replace the dataset), else the dataset's split."""
    file = getattr(cfg, f"{which}_file")
    if cfg.test_file:
        if not file:
            return [], 0
        return load_problems(file, file_rows(file, f"{key}.{which}_file", cfg.dataset), cfg, limit)
    if cfg.dataset and split:
        source = ":".join(x for x in (cfg.dataset, cfg.dataset_config, split) if x)
        rows = hub_rows(cfg.dataset, cfg.dataset_config, split, f"{key}.dataset")
        return load_problems(source, rows, cfg, limit)
    return [], 0


def _from_files(cfg: TaskConfig, key: str) -> Task:
    train_split = None if cfg.name in TEST_ONLY_TASKS else cfg.train_split
    train, skipped_train = _split(cfg, key, "train", train_split, cfg.num_train)
    test, skipped_test = _split(cfg, key, "test", cfg.test_split, cfg.num_test)
    return Task(
        cfg.name,
        _verifier(cfg),
        (cfg.reward_lo, cfg.reward_hi),
        train,
        test,
        skipped_rows=skipped_train + skipped_test,
        verifiers={s: _verifier(replace(cfg, verifier=v)) for s, v in cfg.verifiers.items()},
    )


def _reasoning_gym(cfg: TaskConfig, key: str) -> Task:
    import reasoning_gym

    want = cfg.num_train + cfg.num_test
    # entries are generated on demand (entry i from seed + i): draw past `want` when duplicate
    # questions (small configs) would leave the test split short, up to 8x
    data = reasoning_gym.create_dataset(
        cfg.gym_dataset, size=8 * want, seed=cfg.seed, **cfg.gym_config
    )
    seen: set[str] = set()
    splits: dict[str, list[Problem]] = {"train": [], "test": []}
    for i in range(8 * want):
        if len(splits["test"]) >= cfg.num_test:
            break
        entry = data[i]
        question = entry["question"]
        if question in seen:  # a question never lands in both splits
            continue
        seen.add(question)
        split = "train" if len(splits["train"]) < cfg.num_train else "test"
        ref = gym_reference(cfg.gym_dataset, entry, cfg.gym_reward)
        splits[split].append(
            Problem(
                uid=f"{cfg.gym_dataset}:{i}",
                question=question,
                prompt=_prompt(cfg, question),
                answer=ref,
            )
        )
    return Task(
        cfg.name,
        verifier_name("reasoning_gym", cfg.answer_extraction),
        (cfg.reward_lo, cfg.reward_hi),
        splits["train"],
        splits["test"],
    )


# by name: the builder of a task from its config and its key (what its errors name)
TASKS: dict[str, Callable[[TaskConfig, str], Task]] = {
    "arithmetic": _arithmetic,
    "gsm8k": _from_files,
    "math": _from_files,
    "math500": _from_files,
    "minerva_math": _from_files,
    "olympiadbench": _from_files,
    "amc23": _from_files,
    "aime24": _from_files,
    "mmlu_pro": _from_files,
    "custom": _from_files,
    "reasoning_gym": _reasoning_gym,
}


def data_files(cfg: TaskConfig) -> list[str]:
    """The local files a task reads (none for generated, hub and reasoning-gym tasks)."""
    return [f for f in (cfg.train_file, cfg.test_file) if f] if cfg.name in FILE_TASKS else []


def make_task(cfg: TaskConfig, key: str = "task") -> Task:
    """The task ``cfg`` describes; errors name ``key`` (e.g. ``trainer.eval_tasks.math500``)."""
    problem = cfg.check()
    if problem:  # "dataset: ..." -> "task.dataset: ..."
        field_named = problem.split(":", 1)[0] in TaskConfig.__dataclass_fields__
        raise ValueError(f"{key}.{problem}" if field_named else f"{key}: {problem}")
    return TASKS[cfg.name](cfg, key)
