"""Keys of a composed config that its schema lacks (launch/validation.py ``to_train_config``).

Hydra rejects an unknown key while composing, except one added with ``+``, which it adds to any
node: ``+learner.lrr=1e-6`` used to compose, validate and train at the default lr. Here every
key is checked against the dataclasses, ``+`` or not; only free-form maps take new keys.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any

# Keys that were renamed: the old name -> what to write instead (refused by name, not as a typo)
RENAMED = {"trainer.sampler_temperature": "trainer.sampler_exponent = 1 / the old value"}
# How a value saved under an old name reads under the new one (a checkpoint's run record)
CONVERTED = {"trainer.sampler_temperature": ("trainer.sampler_exponent", lambda t: 1.0 / t)}


def renamed(key: str) -> str | None:
    """The message for a renamed key (``+`` and ``~`` prefixes ignored), else None.

    >>> renamed("+trainer.sampler_temperature")
    'trainer.sampler_temperature was renamed: write trainer.sampler_exponent = 1 / the old value'

    >>> renamed("trainer.sampler_exponent") is None
    True
    """
    key = key.lstrip("+~")
    return f"{key} was renamed: write {RENAMED[key]}" if key in RENAMED else None


def convert_renamed(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config record (dotted keys) written under old names, in today's names and units.

    >>> convert_renamed({"trainer.sampler_temperature": 2.0, "learner.lr": 1e-6})
    {'learner.lr': 1e-06, 'trainer.sampler_exponent': 0.5}
    """
    out = dict(flat)
    for old, (new, convert) in CONVERTED.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, None if value is None else convert(value))
    return out


def _schema_of(hint: Any) -> Any:
    """``X | None`` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def unknown_keys(node: dict, schema: type, path: str = "") -> list[tuple[str, str]]:
    """Keys of a composed config (plain containers) that the dataclass ``schema`` lacks, as
    (full path, a close field name or ""). The values of a dict-typed field are free-form
    (``task.gym_config``), except dataclass values, checked against their class
    (``trainer.eval_tasks.<name>``).

    >>> from launch.config import TrainConfig
    >>> unknown_keys({"learner": {"lrr": 1e-6, "lr": 1.0}}, TrainConfig)
    [('learner.lrr', 'lr')]
    >>> unknown_keys({"task": {"gym_config": {"anything": 1}}}, TrainConfig)
    []
    """
    hints = typing.get_type_hints(schema)
    names = [f.name for f in fields(schema)]
    found: list[tuple[str, str]] = []
    for key, value in node.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            found.append((where, close[0] if close else ""))
            continue
        hint = _schema_of(hints[key])
        if is_dataclass(hint) and isinstance(value, dict):
            found += unknown_keys(value, hint, where)
        elif typing.get_origin(hint) is dict and isinstance(value, dict):
            item = _schema_of(typing.get_args(hint)[1])
            if is_dataclass(item):
                for name, sub in value.items():
                    if isinstance(sub, dict):
                        found += unknown_keys(sub, item, f"{where}.{name}")
    return found
