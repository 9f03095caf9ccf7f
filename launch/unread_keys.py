"""Settings the composed run does not read: a key the user set that no part of this run reads is
refused (exit 2, naming the key and the preset that ignores it), in ``--validate`` and before any
actor starts, rather than validated and silently dropped (``model.path`` without
``model=pretrained`` trained the tiny model; ``task.train_file`` under ``task=arithmetic`` trained
on generated problems).

One table, :func:`unread`, says per section which keys the run's choices leave unread; the
check (:func:`unread_problem`, raised by launch/validation.py ``refuse_unread``) compares it with
the keys of the user's overrides. Keys that presets set are not the user's: only the command
line's (and a ``--multirun`` job's) overrides count.
"""

from __future__ import annotations

HUB_KEYS = ("dataset", "dataset_config", "train_split", "test_split")
FILE_KEYS = ("train_file", "test_file", "question_key", "answer_key", "answer_format",
             "options_key", "on_bad_row", "verifiers")  # fmt: skip
GYM_KEYS = ("gym_dataset", "gym_config", "gym_reward")
VLLM_KEYS = ("tensor_parallel_size", "gpu_memory_utilization", "kv_cache_gib",
             "max_num_batched_tokens", "enforce_eager", "max_num_seqs",
             "enable_prefix_caching")  # fmt: skip
SAMPLER_KEYS = ("sampler_prior", "sampler_floor", "sampler_exponent", "sampler_decay")
WANDB_KEYS = ("wandb_project", "wandb_entity", "wandb_mode", "wandb_name", "wandb_group",
              "wandb_tags")  # fmt: skip


def task_unread(task, at: str) -> dict[str, str]:
    """The keys of one task config (at ``at``: ``task`` or ``trainer.eval_tasks.<name>``) that
    its task does not read."""
    from reward.tasks import FILE_TASKS

    name = f"task={task.name}"
    data = f"{name} generates its problems; a dataset task (task=gsm8k, math, custom, ...) reads it"
    if task.name == "arithmetic":
        keys = {k: data for k in (*HUB_KEYS, *FILE_KEYS)}
        keys |= {k: f"{name} generates its problems; task=reasoning_gym reads it" for k in GYM_KEYS}
    elif task.name == "reasoning_gym":
        keys = {k: data for k in (*HUB_KEYS, *FILE_KEYS)}
        keys["difficulty"] = f"{name} reads task.gym_config (difficulty is arithmetic's level)"
        keys["verifier"] = f"{name} scores with the dataset's own scorer"
    elif task.name in FILE_TASKS:
        keys = {k: f"{name} reads a dataset (these are task=reasoning_gym's)" for k in GYM_KEYS}
        keys["difficulty"] = f"{name} reads a dataset (difficulty is task=arithmetic's level)"
        if task.test_file:  # local files replace the hub dataset
            keys |= {k: f"{name} reads task.test_file, which replaces the hub's" for k in HUB_KEYS}
    else:
        keys = {}
    return {f"{at}.{k}": why for k, why in keys.items()}


def unread(cfg) -> dict[str, str]:
    """Every key (a full path; a section's keys under its prefix) that ``cfg``'s choices leave
    unread -> why, naming the preset or key that decides it."""
    from learner.estimators import ESTIMATORS, unread_sections

    out: dict[str, str] = {}
    model = cfg.model
    if model.source != "path":
        why = (f"model={model.name} (model.source={model.source}) loads its own weights; "
               "model=pretrained reads it")  # fmt: skip
        out |= {"model.path": why, "model.revision": why}
    if model.source != "tiny":
        why = f"model={model.name} (model.source={model.source}) is not the tiny model"
        out |= {"model.tiny": why, "model.rebuild": why}
    out |= task_unread(cfg.task, "task")
    for name, task in cfg.trainer.eval_tasks.items():
        out |= task_unread(task, f"trainer.eval_tasks.{name}")
    est = cfg.algorithm.estimator
    for section in unread_sections(est):
        users = [n for n, e in ESTIMATORS.items() if section.split(".")[1] in e.sections]
        out[section] = (f"algorithm={cfg.algorithm.name} (estimator {est}) has no use for it; "
                        f"estimator {' or '.join(users)} reads it")  # fmt: skip
    if cfg.trainer.prompt_sampler != "collapse_aware":
        why = f"trainer.prompt_sampler={cfg.trainer.prompt_sampler}; collapse_aware reads it"
        out |= {f"trainer.{k}": why for k in SAMPLER_KEYS}
    if cfg.rollout.engine != "vllm":
        why = f"rollout={cfg.rollout.engine} (rollout.engine={cfg.rollout.engine}) is not vLLM"
        out |= {f"rollout.{k}": why for k in VLLM_KEYS}
    if cfg.learner.lora.rank == 0:
        why = "learner.lora.rank=0 trains every weight (no adapter); set a rank for LoRA"
        out |= {f"learner.lora.{k}": why for k in ("alpha", "dropout", "target_modules")}
    if not cfg.logger.wandb:
        why = "logger.wandb=false; logger=wandb turns it on"
        out |= {f"logger.{k}": why for k in WANDB_KEYS}
    return out


def override_key(override: str) -> str | None:
    """The config key an override sets, or None (a group choice, a deletion, Hydra's own).

    >>> override_key("+task.verifiers.openai/gsm8k=f.py:g"), override_key("model=pretrained")
    ('task.verifiers.openai/gsm8k', None)
    >>> override_key("+task@trainer.eval_tasks.math500=math500"), override_key("hydra.run.dir=x")
    (None, None)
    """
    key = override.split("=", 1)[0].lstrip("+")
    if "=" not in override or key.startswith(("~", "hydra.")) or "@" in key or "." not in key:
        return None
    return key


def unread_problem(cfg, overrides: list[str]) -> str | None:
    """The message for the first override whose key this run does not read, or None."""
    table = unread(cfg)
    for override in overrides:
        key = override_key(override)
        if key is None:
            continue
        for prefix, why in table.items():
            if key == prefix or key.startswith(prefix + "."):
                return f"{key}: set, but this run never reads it: {why}"
    return None
