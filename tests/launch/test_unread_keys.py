"""Issue 61, item 2: a key the user set that the composed run does not read is refused (exit 2,
naming the key and the preset that ignores it), in ``--validate`` and before any actor starts
(launch/unread_keys.py); the keys a run does read pass. The table is walked over every preset."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import TrainConfig
from launch.unread_keys import unread
from launch.validation import ConfigError, refuse_unread
from tests.helpers import ROOT, load, run_cli

GROUPS = ("algorithm", "task", "rollout", "learner", "model", "logger", "cluster", "experiment")
PRESETS = [
    (group, p.stem) for group in GROUPS for p in sorted((ROOT / "conf" / group).glob("*.yaml"))
]
NEEDS = {  # what a preset cannot compose without
    "custom": ["task.test_file=t.jsonl", "task.verifier=reward/verl_example.py:compute_score"],
    "pretrained": ["model.path=x"],
    "minerva_math": ["task.test_file=t.jsonl"],
}
FREE_MAPS = {"task.gym_config", "task.verifiers"}  # free-form maps: any key under them


def schema_has(path: str) -> bool:
    """Whether ``path`` names a field (or section) of TrainConfig."""
    node: object = TrainConfig
    parts = path.split(".")
    if parts[:2] == ["trainer", "eval_tasks"]:  # a named eval task: a TaskConfig
        from reward.tasks import TaskConfig

        node, parts = TaskConfig, parts[3:]
    for part in parts:
        fields = (
            {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        )
        if part not in fields:
            return False
        node = fields[part].default_factory() if callable(fields[part].default_factory) else None
        node = type(node) if dataclasses.is_dataclass(node) else node
    return True


def cli_validate(*overrides: str) -> subprocess.CompletedProcess:
    return run_cli("train", *overrides, "--validate")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (  # the issue's first case: validated and trained the tiny model
            ["model.path=Qwen/Qwen2.5-Math-1.5B"],
            "model.path: set, but this run never reads it: model=tiny (model.source=tiny)",
        ),
        (  # the second: the default task=arithmetic generates its problems
            ["task.train_file=/data/a.jsonl", "task.test_file=/data/b.jsonl"],
            "task.train_file: set, but this run never reads it: task=arithmetic generates",
        ),
    ],
)
def test_the_issues_cases_exit_2_with_one_line_naming_key_and_preset(overrides, message):
    out = cli_validate(*overrides)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"config error: {message}") and out.stderr.count("\n") == 1


@pytest.mark.parametrize("group, preset", PRESETS)
def test_every_preset_refuses_what_it_does_not_read_and_names_real_keys(group, preset):
    """Each preset composed alone: every key its table lists exists in the schema (a renamed
    key cannot drop out of the check), each is refused when the user sets it (a key under a
    listed section too), and the preset's config itself passes (presets are not the user)."""
    cfg = load(f"{group}={preset}", *NEEDS.get(preset, []))
    table = unread(cfg)
    refuse_unread(cfg, [])  # nothing the user set
    for key, why in table.items():
        assert schema_has(key) or key in FREE_MAPS, key
        leaf = f"{key}.x" if key in FREE_MAPS or not schema_has(f"{key}.x") else key
        with pytest.raises(ConfigError, match=f"^{leaf}: set, but this run never reads it: "):
            refuse_unread(cfg, [f"{leaf}=1"])
        assert "=" in why.split(";")[0] or "rank" in why, why  # names the preset or key deciding


@pytest.mark.parametrize(
    "overrides, user",
    [
        (["model=pretrained", "model.path=x"], ["model.path=x", "model.revision=main"]),
        (["task=gsm8k"], ["task.dataset=a/b", "task.dataset_config=main", "task.num_train=9"]),
        (["task=gsm8k", "task.test_file=t.jsonl"], ["task.test_file=t.jsonl", "task.answer_key=a"]),
        (["task=reasoning_gym"], ["+task.gym_config.min_terms=2", "task.gym_reward=partial"]),
        (["algorithm=avspo"], ["algorithm.avspo.alpha=0.3", "algorithm.trigger.eta=0.1"]),
        (["algorithm=grpo"], ["algorithm.eps=1e-5", "learner.lr=1e-5"]),
        (["trainer.prompt_sampler=collapse_aware"], ["trainer.sampler_floor=0.1"]),
        (["learner.lora.rank=8"], ["learner.lora.alpha=16"]),
        (["logger=wandb"], ["logger.wandb_project=p"]),
        (["rollout=vllm"], ["rollout.max_num_seqs=4"]),
        (["+task@trainer.eval_tasks.m=math500"], ["trainer.eval_tasks.m.test_file=x.jsonl"]),
    ],
)
def test_keys_the_run_reads_pass(overrides, user):
    refuse_unread(load(*overrides), user)


@pytest.mark.parametrize(
    "overrides, user, key",
    [  # a key read by one choice and not the other: the check follows the composed choice
        (["algorithm=grpo"], ["algorithm.avspo.strategy=uniform"], "algorithm.avspo.strategy"),
        (["task=gsm8k", "task.test_file=t.jsonl"], ["task.dataset=a/b"], "task.dataset"),
        (["+task@trainer.eval_tasks.m=math500", "trainer.eval_tasks.m.test_file=x"],
         ["trainer.eval_tasks.m.dataset_config=c"], "trainer.eval_tasks.m.dataset_config"),
        (["rollout=hf"], ["rollout.enforce_eager=false"], "rollout.enforce_eager"),
        ([], ["trainer.sampler_decay=0.9"], "trainer.sampler_decay"),
    ],
)  # fmt: skip
def test_keys_the_run_does_not_read_are_refused(overrides, user, key):
    with pytest.raises(ConfigError, match=f"^{key}: set, but this run never reads it"):
        refuse_unread(load(*overrides), user)


def test_submit_refuses_it_before_anything_is_submitted():
    """launch.submit composes through the same check (launch/validation.py compose_config):
    the address is never contacted (nothing listens on port 1)."""
    out = subprocess.run(
        [sys.executable, "-m", "launch.submit", "--address", "http://127.0.0.1:1",
         "task.dataset=a/b"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("launch.submit: config error: task.dataset: set, but this run")
    assert out.stderr.rstrip().endswith("nothing was submitted")


@pytest.mark.slow
def test_a_plain_run_refuses_before_anything_starts(tmp_path: Path):
    """Not only ``--validate``: a run exits 2 with the same line and writes no run directory."""
    out = subprocess.run(
        [sys.executable, "-m", "launch.train", "logger.wandb_project=p",
         f"trainer.run_dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("config error: logger.wandb_project: set, but this run never")
    assert not (tmp_path / "run").exists()
