"""Every ``python -m launch.*`` command line in README.md and docs/ runs through ``--validate``:
its keys, values and cross-field rules (``launch.train.validate``, for ``launch.prepare_data``
lines too; ``launch.submit``'s own check for submit lines; the experiment and flags for
``launch.reproduce``; the arguments for ``launch.analyze``). Documented failures (a ``# config
error: ...`` line under the command) must fail with that message.

Not checked here: data files (the docs name files on the reader's machine, such as
/data/gsm8k/train.jsonl: ``--validate`` reads them there), and ``model.path`` when it is a hub id
not in this machine's hub cache (tests have no network; ``test_validate.py`` checks that part
against a fake hub). Syntax lines whose arguments are placeholders (``[overrides]``,
``<experiment>``, ``RUN_DIR...``) are listed in PLACEHOLDERS and skipped; a choice written
``<grpo | avspo_fast>`` is validated with each value, and a placeholder inside a value
(``trainer.run_dir=runs/smol_<name>``) as its name.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"python -m launch\.(\w+)((?:(?!python -m)[^`\n|])*)")
PLACEHOLDERS = {
    "analyze RUN_DIR", "analyze RUN_DIR...", "evaluate [overrides]", "reproduce <exp> --refresh",
    "reproduce <exp> --report-only", "reproduce <experiment>", "reproduce NAME",
    "reproduce <experiment> --report-only",
    "submit [overrides]", "train --validate [overrides]", "train [overrides]",
    "prepare_data [overrides]",
    "reproduce",  # a heading naming the module
}  # fmt: skip
CHOICE = re.compile(r"<([\w.-]+(?:\s*\|\s*[\w.-]+)+)>")
SUBMIT_FLAGS = {"--follow": 0, "--no-wait": 0, "--address": 1, "--timeout-s": 1, "--job-id": 1}


def commands() -> list[tuple[str, str, list[str], str | None]]:
    """(where, module, arguments, expected error or None) of every command line, once each."""
    found: dict[tuple[str, tuple[str, ...]], tuple[str, str | None]] = {}
    for doc in DOCS:
        text = re.sub(r"\\\n\s*", " ", doc.read_text())  # continued lines joined
        # <a | b>: one argument, each value in turn ("|" ends a command in a table)
        text = CHOICE.sub(lambda m: "{" + ",".join(re.split(r"\s*\|\s*", m.group(1))) + "}", text)
        for m in COMMAND.finditer(text):
            rest = m.group(2)
            if text[m.start() - 1] == "`" and text[m.end()] == "\n":  # `...` across a line
                rest += " " + text[m.end() : text.index("`", m.end())].replace("\n", " ")
            rest = re.split(r"\s#\s|\s#$|\s[0-9]?>|\s<\s|\s&$|\s&\s", rest)[0]
            args = shlex.split(rest)
            after = text[m.end() :].lstrip("\n").splitlines()[:1]
            expected = after[0][len("# config error: ") :] if after and after[0].startswith(
                "# config error: "
            ) else None  # fmt: skip
            key = (m.group(1), tuple(args))
            where = f"{doc.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            found.setdefault(key, (where, expected))
    return [(where, mod, list(args), exp) for (mod, args), (where, exp) in found.items()]


def is_placeholder(module: str, args: list[str]) -> bool:
    return " ".join([module, *args]) in PLACEHOLDERS


def sweep(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Every combination of the values of ``{a,b}`` choices, and of ``--multirun`` lines'
    comma-separated values."""

    def values(o: str) -> list[str]:
        key, _, value = o.partition("=")
        if value.startswith("{") and value.endswith("}"):
            return [f"{key}={v}" for v in value[1:-1].split(",")]
        return [f"{key}={v}" for v in value.split(",")] if multirun and "," in value else [o]

    return [list(c) for c in itertools.product(*map(values, overrides))]


def _model_check(overrides: list[str]) -> str:
    """model.path checked where this machine can (a folder, or a hub id in the cache)."""
    from launch.models.bootstrap import _in_cache, check_model_path
    from tests.helpers import load

    model = load(*overrides).model
    if model.source != "path":
        return "no path"
    if Path(model.path).expanduser().is_dir() or _in_cache(model.path, model.revision):
        check_model_path(model)
        return "checked"
    return f"skipped: {model.path} is a hub id not in this machine's cache"


def validate_command(module: str, args: list[str]) -> None:
    """Raise SystemExit(2) (with the message on stderr) as the command's own check would."""
    from launch.train import overrides_of, validate

    if module in ("train", "evaluate", "bootstrap", "prepare_data"):
        overrides = [re.sub(r"<(\w+)>", r"\1", o) for o in overrides_of(args)]
        for run in sweep(overrides, bool({"--multirun", "-m"} & set(args))):
            validate(run, data=False)
            if module != "bootstrap" and any(o.startswith("model") for o in run):
                _model_check(run)
    elif module == "submit":
        from launch.submit import check_overrides

        overrides, skip = [], 0
        for arg in args:
            if skip:
                skip -= 1
            elif arg in SUBMIT_FLAGS:
                skip = SUBMIT_FLAGS[arg]
            else:
                overrides.append(arg)
        check_overrides(overrides)
    elif module == "reproduce":
        from launch.experiments.experiment import load_experiment
        from launch.experiments.reproduce import parser

        load_experiment(parser().parse_args(args).experiment)
    elif module == "analyze":
        from launch.analyze import parse_args

        parse_args(args)
    else:
        raise AssertionError(f"a command of launch.{module}: teach this test to check it")


ALL = commands()


def test_the_docs_have_the_commands_this_test_reads():
    """The collection itself: README and docs lines, continued lines joined, placeholders only
    where listed (a new placeholder line must be added to PLACEHOLDERS on purpose)."""
    modules = {mod for _, mod, _, _ in ALL}
    assert {"train", "evaluate", "submit", "reproduce", "analyze"} <= modules
    readme = [args for where, mod, args, _ in ALL if where.startswith("README.md")]
    assert ["model=pretrained", "model.path=Qwen/Qwen2.5-Math-1.5B", "model.dtype=bfloat16",
            "task=gsm8k", "cluster=gpu_node"] in readme  # fmt: skip
    skipped = {" ".join([m, *a]) for _, m, a, _ in ALL if is_placeholder(m, a)}
    assert skipped == PLACEHOLDERS


@pytest.mark.parametrize(
    "where, module, args, expected",
    [c for c in ALL if not is_placeholder(c[1], c[2])],
    ids=lambda v: v if isinstance(v, str) and ":" in v else "",
)
def test_every_documented_command_validates(where, module, args, expected, capsys):
    if expected is None:
        validate_command(module, args)
        return
    with pytest.raises(SystemExit) as err:  # documented to fail, with that message
        validate_command(module, args)
    assert err.value.code == 2
    assert f"config error: {expected}" in capsys.readouterr().err
