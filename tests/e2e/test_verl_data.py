"""verl's parquet layout trains as it is: a ``prompt`` column of chat messages rendered by the
model's own chat template, the reference in ``reward_model.ground_truth`` (a dotted key), the
``data_source`` kept; and a nested value where text belongs is refused naming the file, row,
column and type."""

from __future__ import annotations

import pytest

from reward.arithmetic import sample_problems
from reward.data import DataError
from reward.tasks import TaskConfig, make_task
from tests.conftest import fast_tiny_model
from tests.e2e.runs import rows, run_train

VERL = ["task.question_key=prompt", "task.answer_key=reward_model.ground_truth",
        "task.answer_format=plain"]  # fmt: skip
# one DeepSpeed rank in the runs below: what they test is the data and the reward, which the
# driver and the verifier carry (two ranks: tests/e2e/test_train_cli.py, the default run)
ONE_RANK = ["learner.num_ranks=1"]


def write_verl_parquet(path, problems, *, prompt=None) -> None:
    """Rows as verl's data preprocessing writes them (examples/data_preprocess/gsm8k.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = [
        {
            "data_source": "arithmetic/L1",
            "prompt": prompt if prompt is not None else [{"role": "user", "content": expr + "="}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"split": "train", "index": i},
        }
        for i, (expr, value) in enumerate(problems)
    ]
    pq.write_table(pa.Table.from_pylist(table), path)


def test_verl_rows_become_problems_with_their_messages(tmp_path):
    problems = sample_problems(1, 3, split="train", seed=0)
    data = tmp_path / "train.parquet"
    write_verl_parquet(data, problems)
    cfg = TaskConfig(name="gsm8k", train_file=str(data), test_file=str(data),
                     question_key="prompt", answer_key="reward_model.ground_truth")  # fmt: skip
    task = make_task(cfg)
    first = task.train[0]
    expr, value = problems[0]
    assert first.question == expr + "=" and first.answer == str(value)
    assert [dict(m) for m in first.messages] == [{"role": "user", "content": expr + "="}]
    assert first.data_source == "arithmetic/L1"


@pytest.mark.parametrize(
    ("column", "holds", "expect"),
    [
        ("prompt", {"role": "user"}, "'prompt' holds a dict, not text nor chat messages"),
        ("prompt", [{"role": "robot", "content": "1+1="}], "needs a role in"),
        ("reward_model", None, "'reward_model' holds a dict, not text"),
    ],
)
def test_a_nested_value_where_text_belongs_is_refused_naming_it(tmp_path, column, holds, expect):
    data = tmp_path / "bad.parquet"
    write_verl_parquet(data, sample_problems(1, 2, split="train", seed=0),
                       prompt=holds if column == "prompt" else None)  # fmt: skip
    cfg = TaskConfig(name="gsm8k", train_file=str(data), test_file=str(data),
                     question_key="prompt", answer_key=column)  # fmt: skip
    with pytest.raises(DataError, match=f"{data}: row 1: .*") as err:
        make_task(cfg)
    assert expect in str(err.value)


@pytest.mark.slow
def test_a_verl_parquet_trains_two_steps_with_rendered_prompts(
    tmp_path, tiny_model_dir, joined_ray
):
    """Two steps of ``launch.train`` on verl-layout files. The model sees the messages through
    its chat template (the tiny one writes each turn's content: "12+7="), not the Python text
    of the list ("[{'role': 'user', ..."), which is what the rows became before."""
    problems = sample_problems(1, 16, split="train", seed=0)
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    write_verl_parquet(train, problems[:12])
    write_verl_parquet(test, problems[12:])
    stdout = run_train(
        tmp_path / "run", *fast_tiny_model(tiny_model_dir), "task=gsm8k",
        f"task.train_file={train}", f"task.test_file={test}", *VERL, "rollout=hf",
        "trainer.total_steps=2", "trainer.prompts_per_step=4", "trainer.eval_every=0",
        "trainer.eval_pass_k=0", "logger.report=false", *ONE_RANK, *joined_ray,
    )  # fmt: skip
    expr, _ = problems[0]
    shown = stdout.split("prompt example (as the model sees it): ")[1].splitlines()[0]
    assert shown == repr(expr + "="), shown
    got = rows(tmp_path / "run")
    assert {1, 2} <= set(got) and all(0 <= got[s]["reward/mean"] <= 1 for s in (1, 2))


VERL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's form, unchanged. 1 for the right sum; 0.5 for any other answer of a row whose
    data_source is the task's (so this function, not a built-in verifier, is what scored:
    a built-in gives 0 there)."""
    right = solution_str.strip() == ground_truth
    if right:
        return {"score": 1.0, "acc": 1.0}
    return {"score": 0.5 if data_source == "arithmetic/L1" else 0.0, "acc": 0.0}
'''


@pytest.mark.slow
def test_a_verl_reward_function_trains_two_steps_with_task_custom(
    tmp_path, tiny_model_dir, joined_ray
):
    """``task=custom`` with verl's data files and a reward file in verl's form, no other key:
    every reward is 0.5 or 1, so ``reward/mean`` is at least 0.5 on both steps (a built-in
    verifier would score the wrong answers 0: the tiny model gets ~40% of L1 right)."""
    problems = sample_problems(1, 16, split="train", seed=0)
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    write_verl_parquet(train, problems[:12])
    write_verl_parquet(test, problems[12:])
    reward = tmp_path / "my_reward.py"
    reward.write_text(VERL_REWARD)
    run_train(
        tmp_path / "run", *fast_tiny_model(tiny_model_dir), "task=custom",
        f"task.verifier={reward}:compute_score", f"task.train_file={train}",
        f"task.test_file={test}", "rollout=hf", "trainer.total_steps=2",
        "trainer.prompts_per_step=4", "trainer.eval_every=0", "trainer.eval_pass_k=0",
        "logger.report=false", *ONE_RANK, *joined_ray,
    )  # fmt: skip
    got = rows(tmp_path / "run")
    assert {1, 2} <= set(got) and all(got[s]["reward/mean"] >= 0.5 for s in (1, 2)), got
    # the dict's other number, logged: acc = (reward/mean - 0.5) / 0.5 (rewards 1 or 0.5)
    for s in (1, 2):
        assert got[s]["reward/extra/acc"] == pytest.approx(2 * got[s]["reward/mean"] - 1)
