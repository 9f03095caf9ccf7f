"""A composed config checked into a TrainConfig: value checks, and one error line, exit 2."""

from __future__ import annotations

import contextlib
import itertools
import operator
import shlex
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launch.config import TrainConfig
from launch.schema_keys import renamed, unknown_keys
from reward.tasks import TaskConfig

CONF = Path(__file__).resolve().parents[1] / "conf"  # the checkout's, or the installed copy's


class ConfigError(ValueError):
    """A config value is invalid; the message starts with the key's path."""


# What composing and validating a config can raise for a bad config (not a bug): Hydra's errors
# (unknown preset, bad override), OmegaConf's (unknown key, wrong type) and ours.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, ConfigError)


@contextlib.contextmanager
def exit_on_config_error():
    """The entry points' contract: a :class:`ConfigError` or a data error (reward/data.py
    DataError) becomes one line on stderr and exit status 2 (no traceback); a missing file that
    its task's hub id can fill names the command that writes it (launch/prepare_data.py)."""
    from reward.tasks import DataError

    try:
        yield
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    except DataError as err:  # the file, the row, the reason: before any actor starts
        print(f"data error: {err}{_write_it_with(err)}", file=sys.stderr)
        sys.exit(2)


VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path",
               "-cp", "--config-dir", "-cd", "--info", "-i")  # fmt: skip
"""Hydra's flags that take a value (never an override)."""


def overrides_of(argv: list[str]) -> list[str]:
    """The Hydra overrides among command-line arguments.

    >>> overrides_of(["--cfg", "job", "algorithm=grpo", "-p", "trainer", "--validate", "x=1"])
    ['algorithm=grpo', 'x=1']
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in VALUE_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


PREPARE = "python -m launch.prepare_data"


def prepare_command(overrides: list[str]) -> str:
    """launch/prepare_data.py's command with ``overrides``, shell-quoted.

    >>> prepare_command(["experiment=paper_qwen2.5_math_1.5b", "trainer.run_dir=/r 1"])
    "python -m launch.prepare_data experiment=paper_qwen2.5_math_1.5b 'trainer.run_dir=/r 1'"
    """
    return shlex.join([*PREPARE.split(), *overrides])


def _write_it_with(err: Exception) -> str:
    """A task's missing file that its hub dataset can fill: the command that writes it, with
    this command's overrides when it is an entry point of ``launch`` (``python -m launch.train
    ...``; called from elsewhere, the overrides are not known)."""
    from reward.data import MissingFile

    if not (isinstance(err, MissingFile) and err.dataset):
        return ""
    if Path(sys.argv[0]).parent.name != "launch":
        return f"; write it with: {PREPARE} <the run's overrides>"
    return f"; write it with: {prepare_command(overrides_of(sys.argv[1:]))}"


def error_line(err: Exception) -> str:
    r"""A config error as one line, the same from every entry point (launch.train, evaluate,
    submit, prepare_data): ours as it is; Hydra's and OmegaConf's multi-line text as its first
    line, the options Hydra lists (whole, on this line) and the first line of the cause.

    >>> from hydra.errors import MissingConfigException
    >>> error_line(MissingConfigException(
    ...     "In 'config': Could not find 'algorithm/x'\n\nAvailable options in 'algorithm':\n"
    ...     "\tavspo\n\tgrpo\nConfig search path:\n\tprovider=hydra, path=pkg://hydra.conf"))
    "In 'config': Could not find 'algorithm/x' (available options in 'algorithm': avspo, grpo)"
    """
    lines = str(err).splitlines() or [type(err).__name__]
    text = lines[0]
    for i, line in enumerate(lines):
        if line.startswith("Available options in "):
            listed = itertools.takewhile(lambda s: s.startswith(("\t", " ")), lines[i + 1 :])
            text += f" (a{line[1:].rstrip(':')}: {', '.join(s.strip() for s in listed)})"
    if err.__cause__ is not None and str(err.__cause__).strip():
        text += f" ({str(err.__cause__).splitlines()[0]})"
    return text


def compose_config(overrides: list[str]) -> TrainConfig:
    """conf/ composed with Hydra ``overrides`` and checked (:func:`to_train_config`), as every
    entry point composes it; a problem is a :class:`ConfigError` of one line
    (:func:`error_line`). A renamed key is named before Hydra, whose error would not name the
    new one; a key the composed run never reads is refused after (launch/unread_keys.py)."""
    from hydra import compose, initialize_config_dir

    for override in overrides:
        if renamed(override.split("=", 1)[0]):
            raise ConfigError(renamed(override.split("=", 1)[0]))
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = to_train_config(compose("config", overrides=overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(error_line(err)) from None
    refuse_unread(cfg, overrides)
    return cfg


def refuse_unread(cfg: TrainConfig, overrides: list[str]) -> None:
    """A ConfigError for the first override whose key this run never reads
    (launch/unread_keys.py)."""
    from launch.unread_keys import unread_problem

    problem = unread_problem(cfg, overrides)
    if problem:
        raise ConfigError(problem)


def task_configs(cfg: TrainConfig) -> dict[str, TaskConfig]:
    """Every task a run reads, by its key: ``task``, then ``trainer.eval_tasks.<name>`` (what an
    error about it names)."""
    evals = {f"trainer.eval_tasks.{name}": tc for name, tc in cfg.trainer.eval_tasks.items()}
    return {"task": cfg.task, **evals}


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
