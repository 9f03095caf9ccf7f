"""Every accepted reasoning_gym dataset (reward/gym_audit.py) through the project's verifier:
its own reference answer in the prompted format ("... Answer: <answer>"), and junk answers
(fixed ones, the question text, every metadata string the question shows), under
``task.gym_reward`` binary and partial. ``python -m tests.reward.gym_fuzz`` prints the table
(docs/configuration.md keeps it); tests/reward/test_gym_rewards.py checks it.

Called in-process (the verifier functions are pure; the pool adds isolation, not scoring)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from reward.extract import extract_final
from reward.gym_audit import GUARDED, SAFE
from reward.tasks import TaskConfig, make_task
from reward.verifiers import gym_entry, verify_reasoning_gym

JUNK = ("0", "1", "-1", "0.5", "no", "yes", "x", "A", "True", "False", "none", "[]", "{}",
        "0123456789", "abc", "Answer: 0", "?")  # fmt: skip
"""Fixed answers that solve nothing (unless one is a problem's answer: then it is skipped)."""
ENTRIES = 3  # test problems per dataset


@dataclass
class Row:
    dataset: str
    reference: float  # the lowest binary score of its reference answers through the prompt
    reference_partial: float  # the same under partial
    junk_binary: float  # the highest junk score under binary
    junk_partial: float  # the highest junk score under partial
    worst_junk: str  # the junk answer behind junk_partial


def _strings(value, question: str):
    """The strings of ``value`` (nested) that the question shows (what a model can copy)."""
    if isinstance(value, str):
        if 0 < len(value) <= 2000 and value in question:
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, question)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v, question)


def _score(answer: str, ref: str, reward: str) -> float:
    """The score of "... Answer: <answer>"; a scorer that raises scores 0 (the pool's "error"
    at the lowest reward)."""
    ref = json.dumps({**json.loads(ref), "reward": reward})
    try:
        return verify_reasoning_gym(f"Let me think.\nAnswer: {answer}", ref).score
    except Exception:  # noqa: BLE001
        return 0.0


def _same(answer: str, gold: str) -> bool:
    """Whether a junk answer is the problem's answer after all (as extracted; case and
    thousands commas aside, or the same number): then it is no junk."""
    a, g = (extract_final(f"Answer: {x}") or "" for x in (answer, gold))
    a, g = a.strip().casefold(), g.strip().casefold()
    if a == g:
        return True
    try:
        return float(a.replace(",", "")) == float(g.replace(",", ""))
    except ValueError:
        return False


def dataset_row(name: str) -> Row:
    cfg = TaskConfig(name="reasoning_gym", gym_dataset=name, num_train=1, num_test=ENTRIES)
    task = make_task(cfg)
    lowest = lowest_partial = 1.0
    junk_binary = junk_partial = 0.0
    worst = ""
    for ref in (p.answer for p in task.test):
        entry = gym_entry(json.loads(ref)["entry"])
        gold = entry.get("answer")
        gold = gold if isinstance(gold, str) else json.dumps(gold) if gold is not None else None
        if gold is not None:
            lowest = min(lowest, _score(gold, ref, "binary"))
            lowest_partial = min(lowest_partial, _score(gold, ref, "partial"))
        question = entry["question"]
        junk = {*JUNK, question[:4000], *_strings(entry.get("metadata", {}), question)}
        for answer in junk:
            if gold is not None and _same(answer, gold):
                continue  # the right answer is no junk
            b, p = _score(answer, ref, "binary"), _score(answer, ref, "partial")
            junk_binary = max(junk_binary, b)
            if p > junk_partial:
                junk_partial, worst = p, answer
    return Row(name, lowest, lowest_partial, junk_binary, junk_partial, worst[:40])


def rule(name: str) -> str:
    """``base`` where the dataset keeps reasoning_gym's base scorer (1 for the oracle answer;
    len(oracle) / len(answer) when the oracle is inside the answer; else 0), else ``own``."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS

    own = DATASETS[name][0].score_answer is not ProceduralDataset.score_answer
    return "own" if own else "base"


def accepted() -> list[str]:
    return sorted(SAFE | set(GUARDED))


def main(names: list[str]) -> None:
    print("| dataset | scorer | reference (binary) | reference (partial) | worst junk, binary | "
          "worst junk, partial | that junk |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names or accepted():
        try:
            r = dataset_row(name)
        except Exception as exc:  # noqa: BLE001  (a row says why)
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:60]} | | | | | |")
            continue
        junk = json.dumps(r.worst_junk)[1:-1].replace("|", "\\\\|")
        print(f"| {name} | {rule(name)} | {r.reference:.2f} | {r.reference_partial:.2f} | "
              f"{r.junk_binary:.2f} | {r.junk_partial:.3f} | `{junk}` |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
