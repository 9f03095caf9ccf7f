r"""Verifiers: (model response, reference answer) -> Verdict. They run inside the killable worker
processes of ``reward/pool.py``; called directly they have no time limit.

- ``numeric`` (arithmetic, GSM8K): extract the answer, parse both sides as exact numbers
  (``fractions.Fraction``), compare exactly.
- ``math`` (MATH, MATH-500): extract the answer; exact numbers compare as above; anything else
  goes to math-verify with **LaTeX extraction only** (math-verify's expression extraction calls
  sympy's ``parse_expr``, which evaluates Python, so it is never given model text), with its own
  signal-based timeouts disabled (they fail outside the main thread; the pool enforces time).
- ``reasoning_gym``: the reference is a JSON entry ``{"dataset": name, "entry": {...}}`` and the
  dataset's own ``score_answer`` scores the extracted answer (partial credit allowed).

Reasons: ``ok`` (score > 0), ``wrong``, ``no_answer`` (nothing extractable), and, from the pool,
``timeout`` and ``error``.

>>> verify_numeric("12+7=19", "19"), verify_numeric("so 20", "19").reason
(Verdict(score=1.0, reason='ok'), 'wrong')
>>> verify_math(r"It is \boxed{\frac{1}{2}}.", "0.5").reason, verify_math("hmm", "1").reason
('ok', 'no_answer')
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from reward.extract import extract_answer, extract_boxed, extract_last_number, parse_number

REASONS = ("ok", "wrong", "no_answer", "timeout", "error")


@dataclass(frozen=True)
class Verdict:
    score: float
    reason: str  # one of REASONS


OK = Verdict(1.0, "ok")
WRONG = Verdict(0.0, "wrong")
NO_ANSWER = Verdict(0.0, "no_answer")


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


def verify_numeric(response: str, reference: str) -> Verdict:
    answer = extract_answer(response)
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


def verify_math(response: str, reference: str) -> Verdict:
    answer = extract_answer(response)
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


def verify_reasoning_gym(response: str, reference: str) -> Verdict:
    import reasoning_gym

    ref = json.loads(reference)
    answer = extract_answer(response)
    if answer is None:
        return NO_ANSWER
    score = float(reasoning_gym.get_score_answer_fn(ref["dataset"])(answer, ref["entry"]))
    return Verdict(score, "ok") if score > 0 else WRONG


VERIFIERS: dict[str, Callable[[str, str], Verdict]] = {
    "numeric": verify_numeric,
    "math": verify_math,
    "reasoning_gym": verify_reasoning_gym,
}


def register_verifier(name: str):
    """Add a verifier ``fn(response, reference) -> Verdict`` under ``name``. A module that does
    this is loaded in the pool's workers when listed in ``AVSPO_VERIFIER_MODULES``."""

    def deco(fn: Callable[[str, str], Verdict]) -> Callable[[str, str], Verdict]:
        VERIFIERS[name] = fn
        return fn

    return deco


def load_verifier_modules() -> None:
    """Import the modules named in ``AVSPO_VERIFIER_MODULES`` (comma-separated), which register
    extra verifiers; done in the parent and in every worker process."""
    for name in filter(None, os.environ.get("AVSPO_VERIFIER_MODULES", "").split(",")):
        importlib.import_module(name.strip())
