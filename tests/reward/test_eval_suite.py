r"""The paper's evaluation suite from local files in their published layouts (docs/ARCHITECTURE.md
section 10): Minerva-Math, OlympiadBench, AMC23, AIME24, MMLU-Pro (and MATH-500); the ``choice``
verifier; boxed-only answer extraction; the presets through Hydra."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hydra import compose, initialize_config_dir

from launch.config import TrainConfig
from launch.validation import ConfigError, to_train_config
from reward import verify
from reward.extract import extract_choice
from reward.tasks import TASK_NAMES, TASKS, TEST_ONLY_TASKS, DataError, TaskConfig, make_task
from reward.verifiers import VERIFIERS, verifier_name, verify_choice

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
NEW_TASKS = ("minerva_math", "olympiadbench", "amc23", "aime24", "mmlu_pro")
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def preset(name: str, **overrides) -> TaskConfig:
    """The task as ``conf/task/<name>.yaml`` sets it, plus overrides."""
    values = yaml.safe_load((CONF / "task" / f"{name}.yaml").read_text())
    return TaskConfig(**{**values, **overrides})


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write(path: Path, rows: list[dict]) -> str:
    return write_parquet(path, rows) if path.suffix == ".parquet" else write_jsonl(path, rows)


# ---- the published layouts ----------------------------------------------------------------------

MINERVA = [  # minerva_math/test.jsonl: problem, solution (ends in \boxed{}), type, idx
    {
        "problem": "Compute the escape velocity ... in km/s.",
        "solution": r"$v=\sqrt{2GM/R}$, so the answer is \boxed{11.2}.",
        "type": "Introduction to Astronomy (8.282J Spring 2006)",
        "idx": 0,
    },
    {
        "problem": "Subproblem 0: what is $x$?",
        "solution": r"We get $x = \boxed{\frac{3}{4}}$.",
        "type": "Physical Chemistry",
        "idx": 1,
    },
    {"problem": "How many?", "solution": r"First 2, then \boxed{2^{10}}", "type": "t", "idx": 2},
]
OLYMPIAD = [  # olympiadbench: question, final_answer (a LIST of strings), and more columns
    {
        "id": 1606,
        "question": "Find all pairs $(x, y)$ ...",
        "solution": ["We show ..."],
        "final_answer": ["$(2,2)$"],
        "is_multiple_answer": False,
        "unit": None,
        "answer_type": "Tuple",
        "error": None,
    },
    {
        "id": 1607,
        "question": "Compute the smallest $n$ ...",
        "solution": ["..."],
        "final_answer": ["$\\frac{1}{2}$", "$0.5$"],
        "is_multiple_answer": True,
        "unit": None,
        "answer_type": "Numerical",
        "error": None,
    },
    {
        "id": 1608,
        "question": "Determine $k$.",
        "solution": ["..."],
        "final_answer": ["7"],
        "is_multiple_answer": False,
        "unit": None,
        "answer_type": "Numerical",
        "error": None,
    },
]
AMC = [  # amc23/test.jsonl: id, question, answer (a number), url
    {"id": 0, "question": "What is $1+26$?", "answer": 27.0, "url": "https://x/0"},
    {"id": 1, "question": "Half of 25?", "answer": 12.5, "url": "https://x/1"},
    {"id": 2, "question": "Two?", "answer": 2, "url": "https://x/2"},
]
AIME = [  # aime24/test.jsonl: id, problem, solution, answer, url
    {"id": 60, "problem": "Every morning Aya ...", "solution": "...", "answer": "204", "url": "u"},
    {"id": 61, "problem": "Let $ABC$ ...", "solution": "...", "answer": "113", "url": "u"},
    {"id": 62, "problem": "Find $m+n$.", "solution": "...", "answer": "033", "url": "u"},
]
MMLU_OPTIONS = [f"option {i}" for i in range(10)]
MMLU = [  # TIGER-Lab/MMLU-Pro test parquet: question_id, question, options, answer, ...
    {
        "question_id": 70,
        "question": "Typical advertising regulatory bodies suggest ...",
        "options": MMLU_OPTIONS,
        "answer": "J",
        "answer_index": 9,
        "cot_content": "",
        "category": "business",
        "src": "ori_mmlu-business_ethics",
    },
    {
        "question_id": 71,
        "question": "Which is prime?",
        "options": ["4", "6", "7", "9"],
        "answer": "C",
        "answer_index": 2,
        "cot_content": "",
        "category": "math",
        "src": "stemez",
    },
    {
        "question_id": 72,
        "question": "Pick A.",
        "options": ["yes", "no", "N/A", "N/A"],
        "answer": "A",
        "answer_index": 0,
        "cot_content": "",
        "category": "other",
        "src": "x",
    },
]

LAYOUTS = {  # task -> (rows, file suffixes as published, expected answers)
    "minerva_math": (MINERVA, (".jsonl",), ["11.2", r"\frac{3}{4}", "2^{10}"]),
    "olympiadbench": (OLYMPIAD, (".jsonl", ".parquet"), ["(2,2)", r"\frac{1}{2}", "7"]),
    "amc23": (AMC, (".jsonl",), ["27", "12.5", "2"]),
    "aime24": (AIME, (".jsonl", ".parquet"), ["204", "113", "033"]),
    "mmlu_pro": (MMLU, (".parquet", ".jsonl"), ["J", "C", "A"]),
}


def test_every_new_task_is_registered_with_a_preset():
    for name in NEW_TASKS:
        assert name in TASK_NAMES and name in TASKS and name in TEST_ONLY_TASKS
        text = (CONF / "task" / f"{name}.yaml").read_text()
        assert text.startswith("# ") and "column" in text.split("\nname:")[0]
        assert preset(name).name == name


@pytest.mark.parametrize(
    "name, suffix",
    [(name, suffix) for name, (_, suffixes, _) in LAYOUTS.items() for suffix in suffixes],
)
def test_loads_the_published_layout(tmp_path, name, suffix):
    rows, _, answers = LAYOUTS[name]
    f = write(tmp_path / f"test{suffix}", rows)
    task = make_task(preset(name, test_file=f))
    assert task.name == name and task.train == [] and task.skipped_rows == 0
    assert [p.answer for p in task.test] == answers
    assert [p.uid for p in task.test] == [f"test{suffix}:{i}" for i in (1, 2, 3)]
    key = "problem" if name in ("minerva_math", "aime24") else "question"
    if name != "mmlu_pro":
        assert task.verifier == "math_boxed"
        assert [p.question for p in task.test] == [r[key] for r in rows]
        assert [p.prompt for p in task.test] == [r[key] + MATH_SUFFIX for r in rows]
        return
    assert task.verifier == "choice"
    q = task.test[1]
    assert q.question == "Which is prime?\nA. 4\nB. 6\nC. 7\nD. 9"
    assert q.prompt == (
        "Which is prime?\nA. 4\nB. 6\nC. 7\nD. 9\nPlease reason step by step, then finish your "
        "answer with 'The answer is (X)', where X is the letter of the correct option."
    )
    assert task.test[0].question.endswith("\nI. option 8\nJ. option 9")
    assert task.test[2].question == "Pick A.\nA. yes\nB. no"  # trailing "N/A" padding dropped
    assert VERIFIERS[task.verifier]("The answer is (C)", q.answer).reason == "ok"


def test_aime_mirror_with_capitalised_columns(tmp_path):
    rows = [{"ID": f"2024-I-{i}", "Problem": f"P{i}", "Solution": "s", "Answer": i} for i in (1, 2)]
    f = write_parquet(tmp_path / "aime_2024_problems.parquet", rows)
    task = make_task(preset("aime24", test_file=f, question_key="Problem", answer_key="Answer"))
    assert [(p.question, p.answer) for p in task.test] == [("P1", "1"), ("P2", "2")]


@pytest.mark.parametrize(
    "name, bad_row, reason",
    [
        ("minerva_math", {"problem": "q", "solution": "no box"}, r"solution has no complete"),
        ("olympiadbench", {"question": "q", "final_answer": "$3$"}, "'final_answer' is not a list"),
        ("olympiadbench", {"question": "q", "final_answer": []}, "'final_answer' has no first"),
        ("amc23", {"question": "q"}, "missing column 'answer'"),
        ("amc23", '{"question": "q", "answer": NaN}', "answer nan is not a finite number"),
        ("aime24", {"problem": "  ", "answer": "1"}, "empty 'problem'"),
        ("mmlu_pro", {"question": "q", "options": ["a", "b"], "answer": "K"}, "'K', not an"),
        ("mmlu_pro", {"question": "q", "options": ["a", "b"], "answer": "E"}, "only 2 options"),
        ("mmlu_pro", {"question": "q", "options": "a,b", "answer": "A"}, "not a list of options"),
        ("mmlu_pro", {"question": "q", "options": ["a"] * 11, "answer": "A"}, "has 11 options"),
        ("mmlu_pro", {"question": "q", "options": ["a", ""], "answer": "A"}, "option B is empty"),
    ],
)
def test_bad_row_names_file_row_and_reason(tmp_path, name, bad_row, reason):
    rows = LAYOUTS[name][0]
    f = write_jsonl(tmp_path / "test.jsonl", [rows[0], bad_row, rows[1]])
    with pytest.raises(DataError) as err:
        make_task(preset(name, test_file=f))
    assert str(err.value).startswith(f"{f}: row 2: ")
    assert reason in str(err.value)
    task = make_task(preset(name, test_file=f, on_bad_row="skip"))
    assert len(task.test) == 2 and task.skipped_rows == 1


# ---- boxed-only extraction ----------------------------------------------------------------------


def test_boxed_only_extraction_never_credits_a_last_number():
    assert verifier_name("math", "boxed") == "math_boxed"
    assert verifier_name("numeric", "boxed") == "numeric_boxed"
    assert verifier_name("choice", "auto") == "choice"
    for name in ("math_boxed", "numeric_boxed"):
        check = VERIFIERS[name]
        assert check("... 3 + 9, so the answer is 12", "12").reason == "no_answer"
        assert check("Answer: 12", "12").reason == "no_answer"
        assert check("#### 12", "12").reason == "no_answer"
        assert check(r"so \boxed{12}", "12").reason == "ok"
        assert check(r"\boxed{12} ... and now, truncated: 12+1=13, \boxed{1", "12").reason == "ok"
        assert check(r"\boxed{13}", "12").reason == "wrong"
    # the default extraction still falls back to the last number
    assert VERIFIERS["math"]("... so the answer is 12", "12").reason == "ok"
    assert VERIFIERS["choice_boxed"]("The answer is (B)", "B").reason == "no_answer"
    assert VERIFIERS["choice_boxed"](r"The answer is $\boxed{B}$", "B").reason == "ok"


def test_answer_extraction_selects_the_verifier_name(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", MINERVA)
    assert make_task(preset("minerva_math", test_file=f)).verifier == "math_boxed"
    auto = make_task(preset("minerva_math", test_file=f, answer_extraction="auto"))
    assert auto.verifier == "math"
    assert make_task(TaskConfig(num_train=2, num_test=2)).verifier == "numeric"
    boxed = make_task(TaskConfig(num_train=2, num_test=2, answer_extraction="boxed"))
    assert boxed.verifier == "numeric_boxed"


def test_task_config_documentation_fields_have_their_defaults():
    cfg = TaskConfig()
    assert (cfg.chat_template, cfg.system_prompt, cfg.truncated) == (False, None, "as_is")
    assert cfg.answer_extraction == "auto" and cfg.options_key is None


# ---- the choice verifier ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, letter",
    [
        ("The answer is (C)", "C"),
        ("so the answer is C.", "C"),
        ("Answer: C", "C"),
        ("**Answer:** (c)", "C"),
        ("The correct answer is option D", "D"),
        (r"Thus $\boxed{E}$", "E"),
        (r"\boxed{(F)}", "F"),
        (r"\boxed{\text{G}}", "G"),
        ("Answer: $J$", "J"),
        ("The answer is (A). No wait: the answer is (B). Double-check...", "B"),
        (r"\boxed{A} ... after all, Answer: H", "H"),
        ("The answer is (K)", None),  # not an MMLU-Pro letter
        ("I think (C) is right.", None),  # a bare letter in prose never counts
        ("C", None),
        ("Answer: I think it is B", None),  # "I" the pronoun
        ("The answer isn't C", None),
        ("answer is Copper", None),
        ("", None),
    ],
)
def test_extract_choice(text, letter):
    assert extract_choice(text) == letter


@pytest.mark.parametrize(
    "hostile",
    [
        "(A" * 50_000,
        "The answer is (" * 7_000,
        "answer " * 15_000,
        "Answer: " * 12_500,
        "\\boxed{" * 15_000,
        "\\boxed{\\text{" * 8_000,
        "answer" + " " * 100_000 + "C",
        "A" * 100_000,
    ],
    ids=lambda s: f"{s[:14]!r}x{len(s)}",
)
def test_choice_extraction_is_fast_on_hostile_text(hostile):
    assert len(hostile) >= 100_000
    t0 = time.perf_counter()
    for boxed_only in (False, True):
        extract_choice(hostile, boxed_only=boxed_only)
    assert verify_choice(hostile, "A").reason in ("no_answer", "wrong")
    assert time.perf_counter() - t0 < 1.0


def test_choice_verifier_last_answer_wins_and_reasons():
    many = "The answer is (A). " * 5_000 + "Hmm. The answer is (D)."
    assert verify_choice(many, "D").reason == "ok" and verify_choice(many, "A").reason == "wrong"
    assert verify_choice("The answer is (c)", " C ").score == 1.0
    assert verify_choice("no idea (B)", "B").reason == "no_answer"
    with pytest.raises(ValueError, match="not an option letter"):
        verify_choice("The answer is (A)", "42")


@pytest.mark.slow
def test_choice_and_boxed_verifiers_through_the_worker_pool():
    verdicts = verify(
        ["The answer is (B).", "Answer: C", "(A" * 50_000, "The answer is (A)", "x"],
        ["B", "D", "A", "not a letter", "A"],
        verifier="choice",
    )
    assert [v.reason for v in verdicts] == ["ok", "wrong", "no_answer", "error", "no_answer"]
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0, 0.0, 0.0]
    boxed = verify(
        ["so the answer is 12", r"\boxed{12}", r"\boxed{\frac{1}{2}}"],
        ["12", "12", "0.5"],
        verifier="math_boxed",
    )
    assert [v.reason for v in boxed] == ["no_answer", "ok", "ok"]


# ---- the presets through Hydra ------------------------------------------------------------------


def load(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))


EXPECTED_PRESETS = {  # name -> (verifier, answer_extraction, answer_format, question, answer)
    "math": ("math", "boxed", "boxed", "problem", "solution"),
    "math500": ("math", "boxed", "plain", "problem", "answer"),
    "minerva_math": ("math", "boxed", "boxed", "problem", "solution"),
    "olympiadbench": ("math", "boxed", "list_first", "question", "final_answer"),
    "amc23": ("math", "boxed", "plain", "question", "answer"),
    "aime24": ("math", "boxed", "plain", "problem", "answer"),
    "mmlu_pro": ("choice", "auto", "letter", "question", "answer"),
    "gsm8k": ("numeric", "auto", "gsm8k", "question", "answer"),
    "arithmetic": ("numeric", "auto", "plain", "question", "answer"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_presets_compose_and_validate(name):
    overrides = [f"task={name}"]
    if name != "arithmetic":
        overrides.append("task.test_file=/x.parquet")
    task = load(*overrides).task
    got = (task.verifier, task.answer_extraction, task.answer_format)
    assert got + (task.question_key, task.answer_key) == EXPECTED_PRESETS[name]
    assert task.name == name and task.train_file is None
    assert task.options_key == ("options" if name == "mmlu_pro" else None)


@pytest.mark.parametrize("name", TEST_ONLY_TASKS)
def test_test_only_tasks_need_a_dataset_or_a_test_file(name):
    said = r"^task\.dataset: .*set it \(a hub id\) or test_file"
    with pytest.raises(ConfigError, match=said):
        load(f"task={name}", "task.dataset=null")


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.answer_extraction=last", "task.answer_extraction: 'last' is not one of"),
        ("task.truncated=drop", "task.truncated: 'drop' is not one of"),
        ("task.verifier=letters", "task: verifier='letters': expected one of"),
        ("task.answer_format=csv", "task.answer_format: 'csv' is not one of"),
        ("task.answer_format=plain", "options_key lists lettered options"),
    ],
)
def test_bad_task_values_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load("task=mmlu_pro", "task.test_file=/x.parquet", override)


# where each preset's hub id keeps its rows (repo path, and README configs if it has them)
HUB_FILES = {
    "olympiadbench": "OlympiadBench/OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.parquet",
    "amc23": "data/test-00000-of-00001.parquet",
    "aime24": "data/train-00000-of-00001.parquet",
    "mmlu_pro": "data/test-00000-of-00001.parquet",
}


@pytest.mark.parametrize("name", sorted(HUB_FILES))
def test_loads_the_hub_id_with_its_published_split_and_columns(monkeypatch, tmp_path, name):
    """``task=<name>`` alone: the preset's hub id (served by tests/hub_server.py, in the layout
    published there: split names, configuration, columns) read with the datasets library."""
    import io

    import datasets  # before hub_env: it patches datasets' own copy of the endpoint

    from tests.hub_server import FakeHub, hub_env

    cfg = preset(name)
    rows, _, answers = LAYOUTS[name]
    if name == "mmlu_pro":  # its parquet holds lists of options: pad as published (to 10)
        rows = [{**r, "options": r["options"] + ["N/A"] * (10 - len(r["options"]))} for r in rows]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    files = {HUB_FILES[name]: buffer.getvalue()}
    if cfg.dataset_config:
        folder = HUB_FILES[name].rsplit("/", 1)[0]
        files["README.md"] = (
            f"---\nconfigs:\n- config_name: {cfg.dataset_config}\n  data_files:\n"
            f"  - split: {cfg.test_split}\n    path: {folder}/*.parquet\n---\n"
        )
    with FakeHub() as hub:
        hub.add_repo(cfg.dataset, files, repo_type="dataset")
        hub_env(monkeypatch, hub, tmp_path)
        assert hub.url == datasets.config.HF_ENDPOINT
        task = make_task(cfg)
    assert [p.answer for p in task.test] == answers and task.train == []
    split = f"{cfg.dataset_config}:{cfg.test_split}" if cfg.dataset_config else cfg.test_split
    assert task.test[0].uid == f"{cfg.dataset.split('/')[1]}:{split}:1"
