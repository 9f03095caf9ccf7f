r"""Answer extraction from untrusted model text, and exact numeric parsing.

Everything here is plain string scanning and bounded regular expressions: no ``eval``, ``exec``,
``sympify`` or ``parse_expr`` of model text, ever. Every function runs in time linear in the
input (hostile text such as 5,000 unclosed ``\boxed{`` is one pass).

Extraction order in :func:`extract_answer` (the first that matches wins):

1. the last complete ``\boxed{...}`` / ``\fbox{...}`` (nested braces; an enclosing box wins over
   a box nested inside it);
2. the last ``#### ...`` line (GSM8K);
3. the last ``Answer: ...`` / ``answer is ...`` (up to the end of its line);
4. the last number in the text.

``answer_extraction: boxed`` (a task key) uses :func:`extract_boxed` alone: a response without a
complete ``\boxed{...}`` has no answer, so a truncated derivation is never credited by its last
number (:func:`extractor`).

Multiple choice (:func:`extract_choice`) has its own patterns: "The answer is (C)", "answer is
C", "Answer: C", ``\boxed{C}``; the last occurrence wins and a bare letter in prose never
counts.

>>> extract_answer(r"so \boxed{\frac{1}{2}} and not \boxed{3")
'\\frac{1}{2}'
>>> extract_answer("Natalia sold 48 + 24 = 72 clips.\n#### 72")
'72'
>>> extract_answer("The answer is: -3.5 apples")
'-3.5 apples'
>>> extract_answer("12+7=19"), extract_answer("no digits here")
('19', None)
>>> extractor("boxed")("so the answer is 12"), extractor("boxed")(r"\boxed{12}")
(None, '12')
>>> extract_choice("The answer is (C). On reflection, the answer is (D).")
'D'
>>> parse_number("1,234"), parse_number("-3/4"), parse_number("0.50"), parse_number("1e9999")
(Fraction(1234, 1), Fraction(-3, 4), Fraction(1, 2), None)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

_BOX_OPENERS = ("\\boxed", "\\fbox")
_HASH = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER = re.compile(r"(?i)\banswer(?:[ \t]+is)?[ \t]*[:=]?[ \t]*([^\n]*)")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")
_NUMBER_FULL = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:/\d+)?")
_MAX_DIGITS = 400  # longer "numbers" are not parsed (Fraction of a 1e6-digit string is slow)


def extract_boxed(text: str) -> str | None:
    r"""Content of the last complete ``\boxed{...}`` (or ``\fbox{...}``), or None.

    One left-to-right pass with a stack of open braces; a brace opened right after ``\boxed``
    is marked, and when it closes its content is a candidate. The candidate that closes last
    wins, so ``\boxed{\boxed{1}}`` gives ``\boxed{1}``'s enclosing content.

    >>> extract_boxed(r"\boxed{1} then \boxed{x^{2}}"), extract_boxed(r"\boxed{") is None
    ('x^{2}', True)
    """
    stack: list[tuple[int, bool]] = []  # (content start, opened by a box)
    best: tuple[int, int] | None = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            opener = next((o for o in _BOX_OPENERS if text.startswith(o, i)), None)
            if opener is not None:
                j = i + len(opener)
                while j < n and text[j] in " \t":
                    j += 1
                if j < n and text[j] == "{":
                    stack.append((j + 1, True))
                    i = j + 1
                    continue
            i += 2  # skip the escaped character (\{ is not a brace)
            continue
        if c == "{":
            stack.append((i + 1, False))
        elif c == "}" and stack:
            start, boxed = stack.pop()
            if boxed:
                best = (start, i)
        i += 1
    return None if best is None else text[best[0] : best[1]].strip()


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    last = None
    for m in pattern.finditer(text):
        last = m
    return None if last is None else last.group(1).strip() or None


def extract_last_number(text: str) -> str | None:
    """The last number (integer, decimal, ``a/b``, thousands commas) in the text."""
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    return None if last is None else last.group(0)


_FINAL = re.compile(r"(?i)\banswer[ \t]*:")


def extract_final(text: str) -> str | None:
    r"""The answer of a response asked to end with "Answer: ...": the last complete
    ``\boxed{...}``, else everything after the last "Answer:" (several lines: a grid, a list of
    moves), else :func:`extract_answer`'s. For reasoning_gym, whose answers may span lines.

    >>> extract_final("Thinking.\nAnswer: 1 0\n0 1")
    '1 0\n0 1'
    >>> extract_final("answer: 3; Answer:  7 ") , extract_final("so 12")
    ('7', '12')
    """
    found = extract_boxed(text)
    if found:
        return found
    last = None
    for m in _FINAL.finditer(text):
        last = m
    rest = text[last.end() :].strip() if last else ""
    return rest or extract_answer(text)


def extract_answer(text: str) -> str | None:
    """The model's final answer by the order in the module docstring, or None."""
    for extract in (
        extract_boxed,
        lambda t: _last_match(_HASH, t),
        lambda t: _last_match(_ANSWER, t),
        extract_last_number,
    ):
        found = extract(text)
        if found:
            return found
    return None


ANSWER_EXTRACTIONS = ("auto", "boxed")
"""auto: :func:`extract_answer` (boxed, ``####``, ``Answer:``, last number); boxed: only a
complete final ``\boxed{...}`` (:func:`extract_boxed`)."""


def extractor(mode: str) -> Callable[[str], str | None]:
    """The answer extractor of an ``answer_extraction`` mode (:data:`ANSWER_EXTRACTIONS`)."""
    if mode == "auto":
        return extract_answer
    if mode == "boxed":
        return extract_boxed
    raise ValueError(f"answer_extraction {mode!r} is not one of {list(ANSWER_EXTRACTIONS)}")


CHOICE_LETTERS = "ABCDEFGHIJ"  # MMLU-Pro: up to 10 options
# The content of a box that names an option: C, (C), \text{C}, \textbf{(c)}.
_BOX_LETTER = (
    r"(?:\\text(?:bf)?[ \t]{0,3}\{[ \t]{0,3})?"  # \text{ or \textbf{
    r"\(?[ \t]{0,3}([A-Ja-j])[ \t]{0,3}\)?[ \t]{0,3}\}?"
)
_BOX_LETTER_FULL = re.compile(_BOX_LETTER)
# A bare letter: A and I are also English words, so they count only when no lowercase word
# follows ("Answer: I think ..." is not an answer); no letter counts inside a word ("Apple").
_BARE_LETTER = r"(?:[AI](?![ \t]+[a-z])|[B-HJ])(?![\w'])"
_CHOICE = re.compile(
    r"\\(?:boxed|fbox)[ \t]{0,3}\{[ \t]{0,3}" + _BOX_LETTER + r"[ \t]{0,3}\}"
    r"|(?i:\banswer)(?:[ \t]{1,3}(?i:is))?(?:[ \t*$:=]{1,10}|(?=\())"
    r"(?:(?i:option|choice)[ \t]{1,3})?"
    r"(?:\([ \t]{0,3}([A-Ja-j])[ \t]{0,3}\)|(" + _BARE_LETTER + r"))"
)


def extract_choice(text: str, *, boxed_only: bool = False) -> str | None:
    r"""The option letter (A-J, upper case) a response chose, or None.

    Recognised, case-insensitive in the words: "The answer is (C)", "the answer is C.",
    "Answer: C", "**Answer:** (c)", "answer is option C", ``\boxed{C}``, ``\boxed{(C)}``,
    ``\boxed{\text{C}}``; the last occurrence in the text wins. A bare letter counts only in
    upper case and not inside a word; "(C)" alone, with no "answer" before it, is never an
    answer. One regular-expression pass with bounded repetitions: linear in the text.
    ``boxed_only``: only the content of the last complete ``\boxed{...}`` (as
    :func:`extract_boxed`) counts, and it must be just a letter.

    >>> extract_choice("Answer: I think it is B"), extract_choice(r"so $\boxed{(b)}$")
    (None, 'B')
    >>> extract_choice("the answer is C. Wait.", boxed_only=True) is None
    True
    """
    if boxed_only:
        boxed = extract_boxed(text)
        m = _BOX_LETTER_FULL.fullmatch(boxed) if boxed is not None else None
        return None if m is None else m.group(1).upper()
    last = None
    for m in _CHOICE.finditer(text):
        last = m
    if last is None:
        return None
    return next(g for g in last.groups() if g).upper()


def parse_number(text: str) -> Fraction | None:
    """An exact number from ``text`` (int, decimal, ``a/b``, ``\\frac{a}{b}``, ``1,234``,
    a trailing ``%`` or ``$``), or None when it is not one plain number."""
    s = text.strip().replace("$", "").replace(" ", "").rstrip(".")
    if s.startswith("\\frac{") or s.startswith("-\\frac{") or s.startswith("\\dfrac{"):
        m = re.fullmatch(r"(-?)\\d?frac\{(-?\d{1,400})\}\{(\d{1,400})\}", s)
        if m is None:
            return None
        sign = -1 if m.group(1) else 1
        den = int(m.group(3))
        return None if den == 0 else sign * Fraction(int(m.group(2)), den)
    s = s.removesuffix("\\%").removesuffix("%")
    if not s or len(s) > _MAX_DIGITS or _NUMBER_FULL.fullmatch(s) is None:
        return None
    if not any(ch.isdigit() for ch in s):
        return None
    num, _, den = s.replace(",", "").partition("/")
    try:
        value = Fraction(num)
        if den:
            d = int(den)
            if d == 0:
                return None
            value /= d
    except (ValueError, ZeroDivisionError):
        return None
    return value
