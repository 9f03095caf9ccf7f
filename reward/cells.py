"""One data row's cells read: nested columns, chat messages, reference answers, lettered options."""

from __future__ import annotations

import math
from typing import Any

from reward.extract import CHOICE_LETTERS, extract_boxed


def _text_of(raw: Any) -> str:
    """A cell as text; a number column's integral floats lose their ".0" (27.0 -> "27")."""
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise ValueError(f"answer {raw} is not a finite number")
        return str(int(raw)) if raw.is_integer() else repr(raw)
    return str(raw).strip()


def cell(row: dict, key: str) -> Any:
    """``row[key]``, or for a dotted key a field of a nested column (verl's
    ``reward_model.ground_truth``); None when absent.

    >>> cell({"reward_model": {"ground_truth": "7"}}, "reward_model.ground_truth")
    '7'
    >>> cell({"a.b": 1}, "a.b"), cell({"a": {"c": 1}}, "a.b")
    (1, None)
    """
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


ROLES = ("system", "user", "assistant")


def chat_messages(raw: Any, key: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A column of chat messages (a list of ``{"role", "content"}``, verl's ``prompt``) as a
    hashable tuple of ((key, value), ...) pairs, checked: the roles known, the contents text,
    a user turn present. Else a ValueError naming the column and what it holds."""
    if not raw or not all(isinstance(m, dict) for m in raw):
        raise ValueError(f"{key!r} holds a {type(raw).__name__}, not text nor chat messages")
    for m in raw:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"{key!r}: a chat message needs a role in {ROLES} and text content "
                             f"(got {sorted(m)})")  # fmt: skip
    if not any(m["role"] == "user" for m in raw):
        raise ValueError(f"{key!r}: chat messages without a user turn")
    return tuple((("role", m["role"]), ("content", m["content"])) for m in raw)


def answer_of(raw: Any, fmt: str, key: str) -> str:
    """The bare reference answer in ``raw``, held as ``fmt`` says (``TaskConfig.answer_format``);
    else a ValueError naming the column ``key`` and the reason."""
    if isinstance(raw, dict | list | tuple) and fmt != "list_first":
        raise ValueError(f"{key!r} holds a {type(raw).__name__}, not text (a field inside a "
                         "column is named with dots: reward_model.ground_truth)")  # fmt: skip
    if fmt == "list_first":
        if not isinstance(raw, list | tuple):
            raise ValueError(f"{key!r} is not a list of answers (got {type(raw).__name__})")
        if not raw or raw[0] is None:
            raise ValueError(f"{key!r} has no first answer")
        raw = _text_of(raw[0]).strip("$").strip()  # OlympiadBench writes "$\\frac{1}{2}$"
    text = _text_of(raw)
    if fmt == "letter":
        if len(text) != 1 or text not in CHOICE_LETTERS:
            raise ValueError(f"{key!r} is {text[:20]!r}, not an option letter A-J")
    elif fmt == "gsm8k":
        _, sep, after = text.rpartition("####")
        if not sep:
            raise ValueError("answer has no '#### <answer>' line")
        text = after.strip().replace(",", "")
    elif fmt == "boxed":
        boxed = extract_boxed(text)
        if boxed is None:
            raise ValueError("solution has no complete \\boxed{...}")
        text = boxed
    if not text:
        raise ValueError("empty answer")
    return text


def options_of(raw: Any, key: str) -> list[str]:
    """The options listed in ``raw`` (trailing "N/A" padding dropped; 1 to 10, none empty); else
    a ValueError naming the column ``key``."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{key!r} is not a list of options (got {type(raw).__name__})")
    options = [None if o is None else str(o).strip() for o in raw]
    while options and options[-1] == "N/A":  # padding to 10 in some copies
        options.pop()
    if not 1 <= len(options) <= len(CHOICE_LETTERS):
        raise ValueError(f"{key!r} has {len(options)} options, expected 1 to 10")
    for letter, option in zip(CHOICE_LETTERS, options, strict=False):
        if not option:
            raise ValueError(f"{key!r}: option {letter} is empty")
    return options  # type: ignore[return-value]
