"""reasoning_gym rewards that mean what they say: no reward without solving (binary by default,
scorers that pay for non-answers refused), right answers in the prompted format score 1, and
references from data files never reach a reasoning_gym scorer."""

from __future__ import annotations

import json

import pytest

from reward.tasks import TaskConfig, make_task
from reward.verifiers import gym_reference, verify_reasoning_gym
from tests.reward import gym_fuzz


@pytest.mark.parametrize("name", ["coin_flip", "propositional_logic", "game_of_life_halting"])
def test_scorers_that_pay_for_non_answers_are_refused_at_validation(name):
    problem = TaskConfig(name="reasoning_gym", gym_dataset=name).check()
    assert problem is not None and f"{name!r} is refused" in problem


def test_the_reasoning_gym_verifier_takes_no_reference_from_a_file():
    cfg = TaskConfig(name="gsm8k", verifier="reasoning_gym", test_file="x.jsonl")
    assert "verifier=reasoning_gym scores only task=reasoning_gym" in cfg.check()


def test_partial_credit_for_a_non_answer_is_zero_under_binary():
    """gcd's scorer (reasoning_gym's base one) gives len(oracle) / len(answer) when the oracle
    is a substring: "-1" against an answer of "1" is 1 / 2 = 0.5 under partial, 0 under
    binary; the right answer is 1 under both."""
    entry = {"question": "gcd?", "answer": "1", "metadata": {}}
    for reward, junk in (("binary", 0.0), ("partial", 0.5)):
        ref = gym_reference("gcd", entry, reward)
        assert verify_reasoning_gym("Answer: -1", ref).score == junk
        assert verify_reasoning_gym("Answer: 1", ref).score == 1.0


def test_a_multi_line_answer_after_answer_scores_one():
    """binary_matrix answers are grids over several lines; before, only the first line after
    "Answer:" was taken and the model that followed the prompt scored 0."""
    cfg = TaskConfig(name="reasoning_gym", gym_dataset="binary_matrix", num_train=1, num_test=2)
    for p in make_task(cfg).test:
        gold = json.loads(p.answer)["entry"]["answer"]
        assert "\n" in gold
        assert verify_reasoning_gym(f"I worked it out.\nAnswer: {gold}", p.answer).score == 1.0


def test_a_rubiks_cube_answer_that_asks_for_too_many_turns_is_refused_unsimulated():
    """rubiks_cube's scorer expands a move's count before it simulates (``U5`` is five turns):
    ``U10001`` (one past gym_audit.MAX_CUBE_MOVES, 10,000) is refused instead of simulated, as
    ``U1000000000`` is instead of a list of a billion strings. 10,000 turns in all, over
    several moves (9,999 of U, one of R), are still simulated: wrong for this problem's
    scramble (the task's seed fixes it), not refused."""
    cfg = TaskConfig(name="reasoning_gym", gym_dataset="rubiks_cube", num_train=1, num_test=1)
    ref = make_task(cfg).test[0].answer
    for answer in ("U10001", "U1000000000", "U5000 R4999 F2", "U" + "9" * 5000):
        assert verify_reasoning_gym(f"Answer: {answer}", ref).reason == "refused", answer
    assert verify_reasoning_gym("Answer: U5000 U4999 R", ref).reason == "wrong"


@pytest.mark.slow
@pytest.mark.parametrize("name", gym_fuzz.accepted())
def test_every_accepted_dataset_scores_its_reference_and_no_junk(name):
    """Its reference answer through the prompted format scores 1 under binary (and its top,
    1, under partial); no junk answer (tests/reward/gym_fuzz.py: fixed ones, the question,
    the metadata strings the question shows) scores above 0 under binary."""
    row = gym_fuzz.dataset_row(name)
    assert row.reference == 1.0 and row.reference_partial == 1.0, row
    assert row.junk_binary == 0.0, row


@pytest.mark.parametrize("reward", ["binary", "partial"])
def test_gym_reward_reaches_every_reference(reward):
    cfg = TaskConfig(name="reasoning_gym", gym_dataset="gcd", num_train=2, num_test=2,
                     gym_reward=reward)  # fmt: skip
    task = make_task(cfg)
    assert {json.loads(p.answer)["reward"] for p in task.train + task.test} == {reward}
