r"""Which reasoning_gym scorers may see model text, and the pre-check of those that evaluate it.

Every dataset of reasoning_gym 0.1.25 was read (its ``score_answer`` and the helpers it calls):

- :data:`GUARDED`: the scorer evaluates the answer. ``countdown`` and ``puzzle24`` (sympy's
  ``parse_expr``, which runs Python), ``polynomial_multiplication``, ``simple_integration`` and
  ``intermediate_integration`` (``parse_expr`` too), and ``binary_matrix``, ``spiral_matrix``,
  ``string_insertion`` and ``n_queens`` (Python's ``eval`` of any answer that is not an exact
  match, to give partial credit to a Python list). Each gets a pre-check, applied before the
  scorer: the answer may hold only the characters and forms that task's answers take (digits,
  operators, parentheses, the task's variable and function names, list brackets, the task's
  letters); anything else scores 0 with the verdict ``refused``. With those characters no
  Python can run: no attribute access (``.`` only inside numbers), no names but the allowed
  ones (ASCII only: Python folds full-width letters into names), no string prefixes that
  format (``f''``), no calls in the list forms (no parentheses there).
- :data:`REFUSED`: refused at validation (``task.gym_dataset``), with the reason.
- :data:`SAFE`: the scorer compares strings, numbers (``float``, ``int``, ``Decimal``,
  ``Fraction``), JSON (``json.loads``), ``np.loadtxt`` rows or simulated moves; the ``eval`` in
  ``number_sorting`` and ``bitwise_arithmetic`` reads the reference, never the answer.
- :data:`BOUNDED`: safe scorers whose work the answer sizes. ``rubiks_cube`` expands a move's
  count before simulating (``U5`` is five turns): ``U1000000000`` is a list of a billion
  strings, gigabytes and minutes in a verifier worker until its limits kill it. An answer of
  more than :data:`MAX_CUBE_MOVES` turns in all scores 0, ``refused``, unsimulated.

The project's own verifiers were audited too: ``numeric`` (``Fraction`` and a regex), ``choice``
(a regex), ``math`` (math-verify with LaTeX extraction only: latex2sympy's ANTLR parser, whose
only ``sympify`` is of its NUMBER tokens, digits; never math-verify's expression extraction,
which is ``parse_expr``). tests/reward/test_gym_safety.py checks all of them with an audit hook:
no text holding a payload is ever compiled.

A dataset a later reasoning_gym adds is neither safe nor guarded: refused until read, and so is
every dataset while another version than :data:`AUDITED_VERSION` is installed (its scorers may
evaluate answers where these did not).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

AUDITED_VERSION = "0.1.25"

Guard = Callable[[str, dict[str, Any]], bool]

_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPR_CHARS = re.compile(r"[A-Za-z0-9 \t\n.+\-*/^(),]*")
_LOOSE_DOT = re.compile(r"(?<![0-9])\.|\.(?![0-9])")  # a dot that is not inside a number


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FUNCTIONS = _words(
    "sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh atanh "
    "exp log ln sqrt Abs pi E Integral"
)
"""Names an integration answer may use (the generators' answers use sin, cos, exp, log, sqrt,
asin, atan and Integral)."""


def _expression(names: Callable[[dict], frozenset[str]], *, power: bool) -> Guard:
    """An arithmetic expression over ``names(entry)``: digits, ``+ - * / ^ ( ) ,``, spaces, ``**``
    only when ``power`` (countdown's 9**9**9 would be a CPU bomb, and its answers have none)."""

    def guard(answer: str, entry: dict) -> bool:
        if not _EXPR_CHARS.fullmatch(answer) or _LOOSE_DOT.search(answer):
            return False
        if not power and "**" in answer:
            return False
        allowed = names(entry)
        return all(name in allowed for name in _ASCII_NAME.findall(answer))

    return guard


def _characters(pattern: str) -> Guard:
    """Only these characters (a regex character class), for the ``eval`` fallbacks."""
    allowed = re.compile(f"[{pattern}]*")
    return lambda answer, entry: allowed.fullmatch(answer) is not None


_NO_NAMES = frozenset()
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")  # polynomial variables (config: x, y, z)


def _integration_names(entry: dict) -> frozenset[str]:
    return FUNCTIONS | {"C", str(entry["metadata"]["variable"])}


GUARDED: dict[str, Guard] = {
    "countdown": _expression(lambda e: _NO_NAMES, power=False),
    "puzzle24": _expression(lambda e: _NO_NAMES, power=False),
    "polynomial_multiplication": _expression(lambda e: _LETTERS, power=True),
    "simple_integration": _expression(_integration_names, power=True),
    "intermediate_integration": _expression(_integration_names, power=True),
    # eval(answer) fallbacks: grids of digits / lists of them; letters A-E, or "_" and "Q", in
    # quotes (no parentheses: nothing can be called; no f, F, r, R: no formatting prefixes)
    "binary_matrix": _characters(r"0-9 \t\n\[\],"),
    "spiral_matrix": _characters(r"0-9 \t\n\[\],"),
    "string_insertion": _characters(r"A-E \t\n\[\],'\""),
    "n_queens": _characters(r"Q_ \t\n\[\],'\""),
}

MAX_CUBE_MOVES = 10_000
"""Turns a rubiks_cube answer may ask for, counts expanded: ~0.3 s of simulation (~32 us a turn,
measured); the dataset's example solutions take up to ~190 (3x3x3, 100 problems)."""

_CUBE_MOVE = re.compile(r"([^\d]*)(\d*)")  # reasoning_gym's expand_moves: a move, then its count


def _cube_moves_at_most(answer: str, entry: dict) -> bool:
    total = 0
    for move in answer.split():
        match = _CUBE_MOVE.fullmatch(move)
        if match is None:  # the scorer skips it (digits inside a move)
            continue
        count = match.group(2)
        if len(count) > len(str(MAX_CUBE_MOVES)):  # no int() of a thousand digits either
            return False
        total += int(count) if count else 1
        if total > MAX_CUBE_MOVES:
            return False
    return True


BOUNDED: dict[str, Guard] = {"rubiks_cube": _cube_moves_at_most}

REFUSED: dict[str, str] = {
    "composite": (
        "its scorer dispatches to sub-datasets built from its own config, which the verifier "
        "does not have (use one dataset per task)"
    ),
    "game_of_life_halting": (
        "its scorer gives 1.0 to any non-empty answer (bool(answer) == bool(reference))"
    ),
    "coin_flip": (
        "its scorer rewards a matching prefix: the fixed answer '0' scored 0.95 on average and "
        "counted as solved on 38 of 40 problems"
    ),
    "propositional_logic": (
        "its scorer gives 1.0 to any valid conclusion (copying the first premise scored 0.72 "
        "on average, solved 25 of 40) and 0.25 to any answer at all"
    ),
}

SAFE = _words(
    """ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf
    binary_alternation bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic chain_sum
    circuit_logic codeio color_cube_rotation complex_arithmetic count_bits count_primes
    course_schedule cryptarithm decimal_arithmetic decimal_chain_sum dice emoji_mystery
    family_relationships figlet_font fraction_simplification futoshiki game_of_life gcd
    graph_color group_anagrams gsm_symbolic isomorphic_strings jugs kakurasu knight_swap
    knights_knaves largest_island lcm leg_counting letter_counting letter_jumble list_functions
    mahjong_puzzle manipulate_matrix maze mini_sudoku modulo_grid needle_haystack
    number_filtering number_format number_sequence number_sorting palindrome_generation
    palindrome_partitioning path_star polynomial_equations pool_matrix power_function
    prime_factorization products quantum_lock ransom_note rearc
    rectangle_count rotate_matrix rotten_oranges rubiks_cube rush_hour self_reference
    sentence_reordering shortest_path simple_equations simple_geometry sokoban spell_backward
    string_manipulation string_splitting string_synthesis sudoku survo syllogism time_intervals
    tower_of_hanoi tsumego word_ladder word_sequence_reversal word_sorting zebra_puzzles"""
)


def installed_version() -> str | None:
    """The installed reasoning_gym's version (None when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return None


def dataset_problem(name: str) -> str | None:
    """Why ``task.gym_dataset=name`` cannot be used, or None."""
    installed = installed_version()
    if installed is not None and installed != AUDITED_VERSION:
        return (
            f"reasoning_gym {installed} is installed; its scorers were audited at "
            f"{AUDITED_VERSION} (reward/gym_audit.py): install reasoning-gym=={AUDITED_VERSION} "
            "or read the new scorers and update the lists"
        )
    if name in REFUSED:
        return f"{name!r} is refused: {REFUSED[name]}"
    if name not in SAFE and name not in GUARDED:
        return (
            f"{name!r} is not an audited reasoning_gym dataset (reward/gym_audit.py lists the "
            f"{len(SAFE) + len(GUARDED)} whose scorers were read, at reasoning_gym "
            f"{AUDITED_VERSION})"
        )
    return None


def admits(dataset: str, answer: str, entry: dict) -> bool:
    """Whether ``dataset``'s scorer may be given ``answer``; a ValueError for a dataset that is
    not audited (the pool makes that an ``error`` verdict).

    >>> entry = {"metadata": {"numbers": [1, 2], "target": 3}}
    >>> admits("countdown", "1 + 2", entry), admits("countdown", "__import__('os')", entry)
    (True, False)
    >>> admits("countdown", "9**9**9", entry), admits("word_sorting", "anything()", {})
    (False, True)
    >>> admits("rubiks_cube", "U2 R' F", {}), admits("rubiks_cube", "U1000000000", {})
    (True, False)
    """
    problem = dataset_problem(dataset)
    if problem:
        raise ValueError(f"reasoning_gym dataset {problem}")
    guard = GUARDED.get(dataset) or BOUNDED.get(dataset)
    return guard is None or guard(answer, entry)
