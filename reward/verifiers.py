r"""Verifiers: (model response, reference answer) -> Verdict. They run inside the killable worker
processes of ``reward/pool.py``; called directly they have no time limit.

- ``numeric`` (arithmetic, GSM8K): extract the answer, parse both sides as exact numbers
  (``fractions.Fraction``), compare exactly.
- ``math`` (MATH, MATH-500): extract the answer; exact numbers compare as above; anything else
  goes to math-verify with **LaTeX extraction only** (math-verify's expression extraction calls
  sympy's ``parse_expr``, which evaluates Python, so it is never given model text), with its own
  signal-based timeouts disabled (they fail outside the main thread; the pool enforces time).
- ``reasoning_gym``: the reference is a JSON entry ``{"dataset": name, "entry": {...}}`` and the
  dataset's own ``score_answer`` scores the extracted answer (partial credit allowed). Some of
  those scorers evaluate the answer (``eval``, sympy's ``parse_expr``): their answers pass a
  pre-check first (reward/gym_audit.py), and one that fails it scores 0, reason ``refused``.
- ``choice`` (multiple choice, MMLU-Pro): the option letter the response chose
  (:func:`reward.extract.extract_choice`: "The answer is (C)", "Answer: C", ``\boxed{C}``, the
  last one wins) against the reference letter A-J.

Each has a boxed-only variant, ``<name>_boxed`` (``math_boxed``, ``numeric_boxed``,
``choice_boxed``, ``reasoning_gym_boxed``): the answer is only the content of a complete final
``\boxed{...}`` (``task.answer_extraction: boxed``; :func:`verifier_name` gives the name). The
reference side is the same in both.

Reasons: ``ok`` (score > 0), ``wrong``, ``no_answer`` (nothing extractable), ``refused`` (an
answer a reasoning_gym scorer would evaluate, holding what that task's answers never hold), and,
from the pool, ``timeout`` and ``error``.

>>> verify_numeric("12+7=19", "19"), verify_numeric("so 20", "19").reason
(Verdict(score=1.0, reason='ok'), 'wrong')
>>> verify_math(r"It is \boxed{\frac{1}{2}}.", "0.5").reason, verify_math("hmm", "1").reason
('ok', 'no_answer')
>>> boxed_only = VERIFIERS["math_boxed"]
>>> boxed_only("so it is 12", "12").reason, boxed_only(r"\boxed{12}", "12").reason
('no_answer', 'ok')
>>> verify_choice("The answer is (B).", "B").reason, verify_choice("Maybe (B)?", "B").reason
('ok', 'no_answer')
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reward.extract import (
    CHOICE_LETTERS,
    extract_answer,
    extract_boxed,
    extract_choice,
    extract_final,
    extract_last_number,
    parse_number,
)

if TYPE_CHECKING:
    from rollout.types import Group

REASONS = ("ok", "wrong", "no_answer", "refused", "timeout", "error")


@dataclass(frozen=True)
class Verdict:
    score: float
    reason: str  # one of REASONS
    # a reward function's other numbers (verl's dict beside "score"): logged reward/extra/<key>
    extra: dict[str, float] | None = field(default=None, repr=False, compare=False)


OK = Verdict(1.0, "ok")
WRONG = Verdict(0.0, "wrong")
NO_ANSWER = Verdict(0.0, "no_answer")
REFUSED = Verdict(0.0, "refused")


def reference_answer(reference: str) -> str:
    """The final answer inside a reference: a ``\\boxed{}`` or ``#### n`` if present, else all
    of it (task loaders already store bare answers; this tolerates full solutions)."""
    boxed = extract_boxed(reference)
    if boxed is not None:
        return boxed
    _, sep, after = reference.rpartition("####")
    return after.strip() if sep else reference.strip()


def _number_of(answer: str):
    value = parse_number(answer)
    if value is None:  # "Answer: 42 apples" -> 42
        last = extract_last_number(answer)
        value = parse_number(last) if last else None
    return value


Extract = Callable[[str], str | None]


def verify_numeric(response: str, reference: str, *, extract: Extract = extract_answer) -> Verdict:
    answer = extract(response)
    if answer is None:
        return NO_ANSWER
    gold = _number_of(reference_answer(reference))
    if gold is None:
        raise ValueError(f"reference {reference[:80]!r} is not a number")
    value = _number_of(answer)
    return OK if value is not None and value == gold else WRONG


def _latex_parse(text: str):
    from math_verify import LatexExtractionConfig, parse

    boxed = text if "\\boxed" in text else "\\boxed{" + text + "}"
    return parse(
        boxed,
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
        parsing_timeout=None,
    )


def verify_math(response: str, reference: str, *, extract: Extract = extract_answer) -> Verdict:
    answer = extract(response)
    if answer is None:
        return NO_ANSWER
    gold_text = reference_answer(reference)
    gold_num, value = parse_number(gold_text), parse_number(answer)
    if gold_num is not None and value is not None:
        return OK if value == gold_num else WRONG
    from math_verify import verify

    gold, pred = _latex_parse(gold_text), _latex_parse(answer)
    if not pred:
        return WRONG
    return OK if verify(gold, pred, timeout_seconds=None) else WRONG


@functools.cache
def _gym_scorer(dataset: str) -> Callable[[str, dict], float]:
    """A dataset's ``score_answer``, built once per process (building one reads its data:
    arc_agi's took 0.5-0.9 s of every item)."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(dataset)


def gym_reference(dataset: str, entry: dict, reward: str = "binary") -> str:
    """A reasoning_gym reference: the dataset, its entry and the reward mode, as JSON that
    keeps the entry's tuples and sets (plain JSON makes them lists, and scorers that compare
    them, arc_agi's and rearc's, then gave their own answers 0.05).

    >>> ref = gym_reference("arc_agi", {"metadata": {"output": ((1, 2),), "seen": {3}}})
    >>> gym_entry(json.loads(ref)["entry"])
    {'metadata': {'output': ((1, 2),), 'seen': {3}}}
    """

    def tag(x):
        if isinstance(x, tuple):
            return {"__tuple__": [tag(v) for v in x]}
        if isinstance(x, (set, frozenset)):
            return {"__set__": [tag(v) for v in sorted(x, key=repr)]}
        if isinstance(x, list):
            return [tag(v) for v in x]
        if isinstance(x, dict):
            return {k: tag(v) for k, v in x.items()}
        return x

    return json.dumps({"dataset": dataset, "entry": tag(entry), "reward": reward}, default=list)


def gym_entry(tagged):
    """The entry :func:`gym_reference` wrote, tuples and sets restored."""
    if isinstance(tagged, list):
        return [gym_entry(v) for v in tagged]
    if isinstance(tagged, dict):
        if set(tagged) == {"__tuple__"}:
            return tuple(gym_entry(v) for v in tagged["__tuple__"])
        if set(tagged) == {"__set__"}:
            return {gym_entry(v) for v in tagged["__set__"]}
        return {k: gym_entry(v) for k, v in tagged.items()}
    return tagged


def verify_reasoning_gym(
    response: str, reference: str, *, extract: Extract = extract_final
) -> Verdict:
    """The dataset's own scorer on the extracted answer. The reference is ``{"dataset",
    "entry", "reward"}`` as ``make_task`` wrote it; ``reward`` ``binary`` (the default) scores 1
    when the scorer's score reaches its top (1.0) and 0 otherwise: many scorers give partial
    credit to non-answers (docs/configuration.md); ``partial`` keeps the scorer's score."""
    from reward.gym_audit import admits

    ref = json.loads(reference)
    entry = gym_entry(ref["entry"])
    answer = extract(response)
    if answer is None:
        return NO_ANSWER
    if not admits(ref["dataset"], answer, entry):
        return REFUSED
    score = float(_gym_scorer(ref["dataset"])(answer, entry))
    if ref.get("reward", "binary") == "binary":
        score = 1.0 if score >= 1.0 - 1e-9 else 0.0
    return Verdict(score, "ok") if score > 0 else WRONG


def verify_choice(response: str, reference: str, *, boxed_only: bool = False) -> Verdict:
    """Multiple choice: the chosen letter (:func:`reward.extract.extract_choice`) against the
    reference letter (A-J; a reference that is not one is a ValueError, so an "error")."""
    gold = reference.strip().upper()
    if len(gold) != 1 or gold not in CHOICE_LETTERS:
        raise ValueError(f"reference {reference[:80]!r} is not an option letter A-J")
    chosen = extract_choice(response, boxed_only=boxed_only)
    if chosen is None:
        return NO_ANSWER
    return OK if chosen == gold else WRONG


def verify_by_source(response: str, reference: str) -> Verdict:
    """``task.verifiers`` (one verifier per verl ``data_source``): the reference is
    ``{"verifier": name, "reference": ...}``, built by the driver from the config; the named
    verifier scores the response against the inner reference.

    >>> verify_by_source("so 12", json.dumps({"verifier": "numeric", "reference": "12"}))
    Verdict(score=1.0, reason='ok')
    """
    ref = json.loads(reference)
    return VERIFIERS[ref["verifier"]](response, ref["reference"])


BOXED = "_boxed"  # suffix of the boxed-only variants

VERIFIERS: dict[str, Callable[[str, str], Verdict]] = {
    "numeric": verify_numeric,
    "math": verify_math,
    "reasoning_gym": verify_reasoning_gym,
    "choice": verify_choice,
    "numeric" + BOXED: functools.partial(verify_numeric, extract=extract_boxed),
    "math" + BOXED: functools.partial(verify_math, extract=extract_boxed),
    "reasoning_gym" + BOXED: functools.partial(verify_reasoning_gym, extract=extract_boxed),
    "choice" + BOXED: functools.partial(verify_choice, boxed_only=True),
    "by_source": verify_by_source,
}


def verifier_name(verifier: str, answer_extraction: str = "auto") -> str:
    """The registered name that scores with ``verifier`` under ``answer_extraction`` (auto: the
    verifier itself; boxed: its ``_boxed`` variant). This is the name to pass to
    :func:`reward.verify` / the pool; ``make_task`` stores it as ``Task.verifier``.

    >>> verifier_name("math", "boxed"), verifier_name("numeric", "auto")
    ('math_boxed', 'numeric')
    """
    if answer_extraction == "auto":
        return verifier
    if answer_extraction == "boxed":
        name = verifier + BOXED
        if name not in VERIFIERS:
            raise ValueError(f"verifier {verifier!r} has no boxed-only variant")
        return name
    raise ValueError(f"answer_extraction {answer_extraction!r} is not one of ['auto', 'boxed']")


def _warm_math() -> None:
    verify_math("\\boxed{x^2}", "x^2")  # math-verify's first call: ~75 ms of imports and caches


def _warm_reasoning_gym() -> None:
    import reasoning_gym  # noqa: F401  (~2 s in a fresh process: longer than an item's timeout)


WARMUPS: dict[str, Callable[[], None]] = {
    "math": _warm_math,
    "math" + BOXED: _warm_math,
    "reasoning_gym": _warm_reasoning_gym,
    "reasoning_gym" + BOXED: _warm_reasoning_gym,
    "by_source": _warm_math,  # the slow built-in a source most likely names
}
"""What a pool worker runs once before its first item of a verifier (slow imports), so that an
item's timeout measures the verification only (reward/pool.py)."""


def warm(name: str) -> None:
    """Run ``name``'s warm-up, if it has one."""
    fn = WARMUPS.get(name)
    if fn is not None:
        fn()


def register_verifier(name: str, *, warm: Callable[[], None] | None = None):
    """Add a verifier ``fn(response, reference) -> Verdict`` under ``name`` (with ``warm``, its
    one-time warm-up: slow imports). A module that does this is loaded in the pool's workers
    when listed in ``AVSPO_VERIFIER_MODULES``."""

    def deco(fn: Callable[[str, str], Verdict]) -> Callable[[str, str], Verdict]:
        VERIFIERS[name] = fn
        if warm is not None:
            WARMUPS[name] = warm
        return fn

    return deco


def load_verifier_modules() -> None:
    """Import the modules named in ``AVSPO_VERIFIER_MODULES`` (comma-separated), which register
    extra verifiers; done in the parent and in every worker process (before its sandbox closes;
    reward/custom.py ``register_from_env`` beside it, for ``task.verifier=module:function``)."""
    for name in filter(None, os.environ.get("AVSPO_VERIFIER_MODULES", "").split(",")):
        importlib.import_module(name.strip())


def score_truncated(groups: list[Group], verdicts: list, policy: str, lowest: float) -> list:
    """``task.truncated``: ``as_is`` keeps the verdicts; ``lowest`` gives every response that
    hit the length limit (finish reason "length") the task's lowest reward, reason "truncated".

    >>> from rollout.types import Group, Sample
    >>> done, cut = (Sample([5], [0.0], "4", reason, 0) for reason in ("stop", "length"))
    >>> g = Group("p", [1], [done, cut])
    >>> [(v.score, v.reason) for v in score_truncated([g], [Verdict(1.0, "ok")] * 2, "lowest", 0.0)]
    [(1.0, 'ok'), (0.0, 'truncated')]
    """
    if policy == "as_is":
        return verdicts
    samples = [s for g in groups for s in g.samples]
    return [
        Verdict(lowest, "truncated") if s.finish_reason == "length" else v
        for s, v in zip(samples, verdicts, strict=True)
    ]
