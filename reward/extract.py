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

>>> extract_answer(r"so \boxed{\frac{1}{2}} and not \boxed{3")
'\\frac{1}{2}'
>>> extract_answer("Natalia sold 48 + 24 = 72 clips.\n#### 72")
'72'
>>> extract_answer("The answer is: -3.5 apples")
'-3.5 apples'
>>> extract_answer("12+7=19"), extract_answer("no digits here")
('19', None)
>>> parse_number("1,234"), parse_number("-3/4"), parse_number("0.50"), parse_number("1e9999")
(Fraction(1234, 1), Fraction(-3, 4), Fraction(1, 2), None)
"""

from __future__ import annotations

import re
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
