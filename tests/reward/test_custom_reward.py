"""Your own reward function by config (reward/custom.py): verl's signature unchanged, or the
project's ``(response, reference) -> Verdict``, run in the real verifier pool."""

from __future__ import annotations

import json
import textwrap

import pytest

from reward.custom import ENV, check, reference_for, resolve
from reward.pool import PoolConfig, VerifierPool
from reward.tasks import TaskConfig
from reward.verifiers import Verdict

VERL_FORM = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        # verl's gsm8k-like rule, with the source in the score: 1 right, 0.1 for a number of
        # another source's problem, 0 otherwise
        answer = solution_str.split("=")[-1].strip()
        if answer == ground_truth:
            return {"score": 1.0, "acc": True}
        return 0.1 if data_source == "other" else 0.0


    def pair(response, reference):
        return 0.5


    def broken(x):
        return 1.0
    """
)


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_FORM)
    return path


def test_signatures_are_checked_in_one_line(reward_file):
    assert check(f"{reward_file}:compute_score") is None
    assert check(f"{reward_file}:pair") is None
    broken = check(f"{reward_file}:broken")
    assert "expected verl's compute_score(data_source, solution_str" in broken
    assert "\n" not in broken
    assert "no such file" in check("/nonexistent/r.py:f")
    assert "has no function 'nope'" in check(f"{reward_file}:nope")
    assert "ModuleNotFoundError" in check("no_such_pkg.mod:f")
    problem = TaskConfig(name="custom", test_file="x", verifier=f"{reward_file}:broken").check()
    assert problem.startswith(f"verifier={reward_file}:broken: TypeError")


def test_a_relative_path_is_resolved_where_the_run_starts(reward_file, monkeypatch):
    monkeypatch.chdir(reward_file.parent)
    assert resolve("my_reward.py:compute_score") == f"{reward_file}:compute_score"
    assert resolve("pkg.mod:fn") == "pkg.mod:fn"


def test_the_function_scores_in_the_pool_with_its_data_source(reward_file, monkeypatch):
    """In the real pool: verl's dict (its score), a float, the data_source passed through; a
    score outside the task's range is an error (the pool's check)."""
    spec, pair = f"{reward_file}:compute_score", f"{reward_file}:pair"
    monkeypatch.setenv(ENV, json.dumps([spec, pair]))
    with VerifierPool(PoolConfig(num_workers=1)) as pool:
        refs = [reference_for("19", "gsm8k"), reference_for("19", "other"),
                reference_for("19", None)]  # fmt: skip
        got = pool.verify(["12+7=19", "12+7=20", "12+7=20"], refs, verifier=spec)
        # 1.0 (right), 0.1 (wrong, source "other"), 0.0 (wrong)
        assert got == [Verdict(1.0, "ok"), Verdict(0.1, "ok"), Verdict(0.0, "wrong")]
        # verl's dict: its other numbers come back (logged as reward/extra/acc)
        assert got[0].extra == {"acc": 1.0} and got[1].extra is None
        assert pool.verify(["x"], ["y"], verifier=pair) == [Verdict(0.5, "ok")]
        # a task whose range is [0, 0.25]: 0.5 cannot be its score
        (bad,) = pool.verify(["x"], ["y"], verifier=pair, highest=0.25)
        assert bad.reason == "error" and "outside the reward range" in pool.last_errors[0]


def test_one_verifier_per_data_source(reward_file, ray_cluster):
    """``task.verifiers``: rows of "other" are scored by the pair-form function (0.5 whatever
    the answer), the rest by ``task.verifier`` (numeric), through the real verifier actor."""
    from types import SimpleNamespace

    from launch.stages import Verifier
    from reward.tasks import Problem
    from rollout.types import Group, Sample
    from tests.helpers import load

    pair = f"{reward_file}:pair"
    cfg = load("task=custom", f"task.verifier={reward_file}:compute_score",
               "task.test_file=x", f"+task.verifiers.other={pair}")  # fmt: skip
    verifier = Verifier(cfg, placement=None, log=lambda *_: None)
    try:
        task = SimpleNamespace(verifier="numeric", reward_range=(0.0, 1.0),
                               verifiers={"other": pair})  # fmt: skip
        samples = [Sample([2], [0.0], text, "stop", 0) for text in ("12+7=19", "12+7=20")]
        problems = [Problem("a", "q", "q", "19", data_source="gsm8k"),
                    Problem("b", "q", "q", "19", data_source="other")]  # fmt: skip
        groups = [Group("q", [1], samples), Group("q", [1], samples)]
        got = verifier.verify(groups, problems, task, "as_is")
        # gsm8k rows: numeric (19 right, 20 wrong); "other": 0.5 for both
        assert [v.score for v in got] == [1.0, 0.0, 0.5, 0.5]
    finally:
        verifier.shutdown()


def test_a_reward_file_runs_once_however_often_it_is_named(tmp_path):
    """Validation, make_task and the pool's registration each name the function: the file's
    module code runs once in a process (it counts its imports in a file beside it)."""
    from reward.custom import load

    count = tmp_path / "imports.txt"
    path = tmp_path / "counted.py"
    path.write_text(f"open({str(count)!r}, 'a').write('x')\ndef fn(response, reference):\n"
                    "    return 1.0\n")  # fmt: skip
    assert check(f"{path}:fn") is None and check(f"{path}:fn") is None
    assert load(f"{path}:fn") is load(f"{path}:fn")
    assert count.read_text() == "x"


def test_the_per_source_verifiers_reach_the_task(reward_file, tmp_path, monkeypatch):
    """``task.verifiers`` through make_task: each source's function, its path made absolute."""
    from reward.tasks import make_task

    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2", "data_source": "a"}) + "\n")
    monkeypatch.chdir(reward_file.parent)
    cfg = TaskConfig(name="custom", test_file=str(data), verifier="my_reward.py:compute_score",
                     question_key="question", answer_key="answer",
                     verifiers={"other": "my_reward.py:pair", "b": "numeric"})  # fmt: skip
    task = make_task(cfg)
    assert task.verifier == f"{reward_file}:compute_score"
    assert task.verifiers == {"other": f"{reward_file}:pair", "b": "numeric"}
