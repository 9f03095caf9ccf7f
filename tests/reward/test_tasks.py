"""Tasks: arithmetic levels and splits, local-file loaders with bad-row errors, reasoning_gym."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reward.arithmetic import LEVELS, is_test_problem, sample_problems
from reward.tasks import DataError, TaskConfig, make_task
from reward.verifiers import VERIFIERS


@pytest.mark.parametrize("level", range(LEVELS))
def test_arithmetic_splits_never_overlap_and_answers_are_right(level):
    train = sample_problems(level, 3000, split="train", seed=1)
    test = sample_problems(level, 300, split="test", seed=1)
    assert train and test
    assert not {e for e, _ in train} & {e for e, _ in test}
    assert not any(is_test_problem(e) for e, _ in train) and all(
        is_test_problem(e) for e, _ in test
    )
    for expr, value in train[:200]:
        # an independent evaluation of the restricted grammar: digits and + - * only
        assert set(expr) <= set("0123456789+-*")
        tokens = expr.replace("-", " - ").replace("+", " + ").replace("*", " * ").split()
        terms, sign, product = [], 1, None
        for tok in tokens:  # shunting by hand: products first, then the signed sum
            if tok in "+-":
                terms.append(sign * product)
                sign, product = (1 if tok == "+" else -1), None
            elif tok == "*":
                continue
            else:
                product = int(tok) if product is None else product * int(tok)
        terms.append(sign * product)
        assert sum(terms) == value, expr


def test_arithmetic_is_seeded_and_levels_grow_harder():
    a = make_task(TaskConfig(difficulty=3, seed=7, num_train=50, num_test=10))
    b = make_task(TaskConfig(difficulty=3, seed=7, num_train=50, num_test=10))
    c = make_task(TaskConfig(difficulty=3, seed=8, num_train=50, num_test=10))
    assert a.train == b.train and a.train != c.train
    # the test split is a fixed set of problems whatever the seed; the sample drawn from it moves
    assert all(is_test_problem(p.question) for p in c.test)
    sizes = [len(sample_problems(lv, 10_000, split="train", seed=0)) for lv in range(3)]
    assert sizes[0] < sizes[1] < sizes[2]  # L0: 90 sums; L1 adds differences; L2 two digits
    assert a.train[0].uid.startswith("L3:") and a.train[0].prompt.endswith("=")


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_gsm8k_loader(tmp_path):
    rows = [
        {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"},
        {"question": "A farm has 1,200 cows...", "answer": "...\n#### 1,200"},
    ]
    f = _write_jsonl(tmp_path / "train.jsonl", rows)
    task = make_task(
        TaskConfig(
            name="gsm8k",
            train_file=f,
            test_file=f,
            answer_format="gsm8k",
            prompt_template="Q: {question}\nA:",
        )
    )
    assert [p.answer for p in task.train] == ["5", "1200"]
    assert task.train[0].prompt == "Q: Tom has 2 apples and buys 3. How many?\nA:"
    assert task.train[0].uid == "train.jsonl:1"
    assert VERIFIERS["numeric"]("so #### 1200", task.train[1].answer).reason == "ok"


def test_math_loader_parquet_with_column_mapping(tmp_path):
    table = pa.table(
        {
            "problem": ["Half of one?", "Sum 1..3?"],
            "solution": [r"It is \boxed{\frac{1}{2}}.", r"1+2+3 = \boxed{6}"],
        }
    )
    f = str(tmp_path / "math.parquet")
    pq.write_table(table, f)
    cfg = TaskConfig(
        name="math",
        train_file=f,
        test_file=f,
        question_key="problem",
        answer_key="solution",
        answer_format="boxed",
        verifier="math",
    )
    task = make_task(cfg)
    assert [p.answer for p in task.test] == [r"\frac{1}{2}", "6"]


def test_math500_loader_plain_answers(tmp_path):
    f = _write_jsonl(tmp_path / "m500.jsonl", [{"problem": "x?", "answer": r"\sqrt{2}"}])
    task = make_task(
        TaskConfig(name="math500", test_file=f, question_key="problem", verifier="math")
    )
    assert task.train == [] and task.test[0].answer == r"\sqrt{2}"


@pytest.mark.parametrize(
    "bad_row, reason",
    [
        ("{not json", "row 2: not valid JSON (Expecting property name enclosed in double quotes)"),
        ({"question": "q"}, "row 2: missing column 'answer'"),
        ({"question": "  ", "answer": "#### 1"}, "row 2: empty 'question'"),
        ({"question": "q", "answer": "no marker"}, "row 2: answer has no '#### <answer>' line"),
        ([1, 2], "row 2: expected an object, got list"),
    ],
)
def test_bad_row_names_file_row_and_reason(tmp_path, bad_row, reason):
    good = {"question": "1+1?", "answer": "#### 2"}
    f = _write_jsonl(tmp_path / "data.jsonl", [good, bad_row, good])
    cfg = TaskConfig(name="gsm8k", train_file=f, test_file=f, answer_format="gsm8k")
    with pytest.raises(DataError) as err:
        make_task(cfg)
    assert str(err.value) == f"{f}: {reason}"
    cfg.on_bad_row = "skip"
    task = make_task(cfg)
    assert len(task.train) == 2 and task.skipped_rows == 2  # one bad row in each split's read


def test_missing_files_are_config_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^task.dataset: .* set it \(a hub id\) or test_file"):
        make_task(TaskConfig(name="gsm8k"))
    with pytest.raises(DataError, match="no such file"):
        make_task(TaskConfig(name="math500", test_file=str(tmp_path / "nope.jsonl")))


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("empty.jsonl", b"", "empty (no rows)"),
        ("blank.jsonl", b"\n\n", "empty (no rows)"),
        ("latin1.jsonl", b'{"question": "caf\xe9", "answer": "#### 1"}\n', "not UTF-8 text"),
        ("bad.parquet", b"PAR1 not really", "not a readable parquet file"),
        ("allbad.jsonl", b'{"q": 1}\n', "every row is bad (1 skipped"),
    ],
)
def test_unusable_files_name_the_file_and_why(tmp_path, name, content, reason):
    f = tmp_path / name
    f.write_bytes(content)
    cfg = TaskConfig(name="math500", test_file=str(f), answer_format="plain")
    if name == "allbad.jsonl":
        cfg.on_bad_row = "skip"
    with pytest.raises(DataError) as err:
        make_task(cfg)
    assert str(err.value).startswith(f"{f}: {reason}")


def test_reasoning_gym_adapter_and_its_scorer():
    task = make_task(
        TaskConfig(
            name="reasoning_gym",
            gym_dataset="basic_arithmetic",
            num_train=20,
            num_test=5,
            prompt_template="{question}",
        )
    )
    assert task.verifier == "reasoning_gym"
    assert len(task.train) == 20 and 0 < len(task.test) <= 5
    assert not {p.question for p in task.train} & {p.question for p in task.test}
    p = task.train[0]
    right = json.loads(p.answer)["entry"]["answer"]
    assert VERIFIERS["reasoning_gym"](f"Answer: {right}", p.answer).score == 1.0
    assert VERIFIERS["reasoning_gym"]("no idea", p.answer).reason == "no_answer"
