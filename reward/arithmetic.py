"""The embedded default task: seeded integer arithmetic in 7 difficulty levels.

Prompt format (small enough for a character-level tiny model): the expression followed by ``=``,
e.g. ``"12+7="``; the reference is the integer value, e.g. ``"19"``. Python's precedence (``*``
before ``+``/``-``) applies.

| level | problems                                 | example     |
| ----- | ---------------------------------------- | ----------- |
| L0    | a + b, one digit                         | 3+4=        |
| L1    | a + b or a - b, one digit, result >= 0   | 9-4=        |
| L2    | two digits + one digit                   | 23+8=       |
| L3    | two digits +/- two digits, result >= 0   | 61-27=      |
| L4    | a +/- b +/- c, one digit                 | 7-9+3=      |
| L5    | a * b + c or a * b - c, one digit        | 6*7-5=      |
| L6    | a op b op c, two digits, op in + - *     | 12*31-45=   |

Train and test splits never overlap: a problem belongs to the test split iff a stable hash of its
expression falls in the first ``test_share`` of the hash space (10%), whatever the seed.

>>> rng = random.Random(0)
>>> [make_problem(level, rng) for level in (0, 3, 6)]
[('6+6', 12), ('43-15', 28), ('61-48*71', -3347)]
>>> is_test_problem("6+6"), is_test_problem("3+1")
(False, True)
"""

from __future__ import annotations

import hashlib
import random

LEVELS = 7
TEST_SHARE = 0.1


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _evaluate(nums: list[int], ops: list[str]) -> int:
    """Value of ``n0 op0 n1 op1 n2`` with ``*`` first (no eval of any string)."""
    nums, ops = list(nums), list(ops)
    while "*" in ops:
        i = ops.index("*")
        nums[i : i + 2] = [nums[i] * nums[i + 1]]
        del ops[i]
    total = nums[0]
    for op, n in zip(ops, nums[1:], strict=True):
        total = _value(total, op, n)
    return total


def make_problem(level: int, rng: random.Random) -> tuple[str, int]:
    """One problem of ``level`` as (expression, value)."""
    d1 = lambda: rng.randint(0, 9)  # noqa: E731
    d2 = lambda: rng.randint(10, 99)  # noqa: E731
    if level == 0:
        nums, ops = [d1(), d1()], ["+"]
    elif level == 1:
        a, b, op = d1(), d1(), rng.choice("+-")
        nums, ops = ([max(a, b), min(a, b)] if op == "-" else [a, b]), [op]
    elif level == 2:
        nums, ops = [d2(), d1()], ["+"]
    elif level == 3:
        a, b, op = d2(), d2(), rng.choice("+-")
        nums, ops = ([max(a, b), min(a, b)] if op == "-" else [a, b]), [op]
    elif level == 4:
        nums, ops = [d1(), d1(), d1()], [rng.choice("+-"), rng.choice("+-")]
    elif level == 5:
        nums, ops = [d1(), d1(), d1()], ["*", rng.choice("+-")]
    elif level == 6:
        nums, ops = [d2(), d2(), d2()], [rng.choice("+-*"), rng.choice("+-*")]
    else:
        raise ValueError(f"arithmetic level must be in 0..{LEVELS - 1}, got {level}")
    expr = str(nums[0]) + "".join(op + str(n) for op, n in zip(ops, nums[1:], strict=True))
    return expr, _evaluate(nums, ops)


def is_test_problem(expr: str, test_share: float = TEST_SHARE) -> bool:
    digest = hashlib.blake2b(expr.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < test_share * 2**64


def sample_problems(
    level: int, n: int, *, split: str, seed: int, patience: int = 2000
) -> list[tuple[str, int]]:
    """Up to ``n`` distinct problems of one split; fewer when the level's space is smaller
    (sampling stops after ``patience`` draws in a row that bring nothing new)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"arithmetic/{level}/{split}/{seed}")
    want_test = split == "test"
    seen: dict[str, int] = {}
    misses = 0
    while len(seen) < n and misses < patience:
        expr, value = make_problem(level, rng)
        if expr not in seen and is_test_problem(expr) == want_test:
            seen[expr] = value
            misses = 0
        else:
            misses += 1
    return list(seen.items())
