"""A composed config checked into a TrainConfig: value checks, and one error line, exit 2."""

from __future__ import annotations

import contextlib
import operator
import sys
from dataclasses import fields, is_dataclass
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launch.config import TrainConfig
from launch.schema_keys import renamed, unknown_keys


class ConfigError(ValueError):
    """A config value is invalid; the message starts with the key's path."""


# What composing and validating a config can raise for a bad config (not a bug): Hydra's errors
# (unknown preset, bad override), OmegaConf's (unknown key, wrong type) and ours.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, ConfigError)


@contextlib.contextmanager
def exit_on_config_error():
    """The entry points' contract: a :class:`ConfigError` or a data error (reward/tasks.py
    DataError) becomes one line on stderr and exit status 2 (no traceback)."""
    from reward.tasks import DataError

    try:
        yield
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    except DataError as err:  # the file, the row, the reason: before any actor starts
        print(f"data error: {err}", file=sys.stderr)
        sys.exit(2)


_BOUNDS = (
    ("ge", operator.ge, ">="),
    ("gt", operator.gt, ">"),
    ("le", operator.le, "<="),
    ("lt", operator.lt, "<"),
)


def validate(node: Any, path: str = "") -> None:
    """Check every field of a dataclass tree against its metadata; raise :class:`ConfigError`."""
    for f in fields(node):
        key = f"{path}.{f.name}" if path else f.name
        value = getattr(node, f.name)
        if is_dataclass(value):
            validate(value, key)
            continue
        if isinstance(value, dict):
            for name, item in value.items():
                if is_dataclass(item):
                    validate(item, f"{key}.{name}")
        if value is None:
            continue
        meta = f.metadata
        choices = meta.get("choices")
        if callable(choices):
            choices = choices()
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        for name, holds, word in _BOUNDS:
            if name in meta and not holds(value, meta[name]):
                raise ConfigError(f"{key}: must be {word} {meta[name]}, got {value!r}")
    check = getattr(node, "check", None)
    if callable(check):
        problem = check()
        if problem:
            head = problem.split(":", 1)[0].split(".", 1)[0]
            if path and head in {f.name for f in fields(node)}:  # "sampling.n: ..." -> full key
                raise ConfigError(f"{path}.{problem}")
            raise ConfigError(f"{path or '<root>'}: {problem}")


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Hydra's composed config -> a validated :class:`TrainConfig`."""
    unknown = unknown_keys(OmegaConf.to_container(cfg, resolve=False), TrainConfig)
    for where, _ in unknown:
        if renamed(where):
            raise ConfigError(renamed(where))
    if unknown:
        where, close = unknown[0]
        parent, _, key = where.rpartition(".")
        hint = f" (did you mean {parent + '.' if parent else ''}{close}?)" if close else ""
        raise ConfigError(f"{where}: unknown key {key!r}, not in the schema{hint}")
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:  # a missing mandatory value (???), ...
        raise ConfigError(str(err).splitlines()[0]) from None
    if not isinstance(obj, TrainConfig):
        raise ConfigError(f"<root>: expected a TrainConfig, got {type(obj).__name__}")
    validate(obj)
    return obj
