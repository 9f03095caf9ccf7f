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
each prompt's collapse history, which the sampler gets after every step). ``logger.samples``
of each step's rollouts are logged whole (diagnostics/samples.py: samples.jsonl, wandb).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from diagnostics.samples import SamplesSink, sample_records
from diagnostics.sinks import (
    ConsoleSink,
    JsonlSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    wandb_mode,
)
from launch.config import TrainConfig
from launch.heldout import evaluate_held_out
from launch.resume import CheckpointFailed, Stopped, fingerprint, truncate_logs
from launch.rollouts import Rollouts
from launch.sampler import mixed_token_share
from launch.stages import Stages
from launch.step_metrics import PhaseTimer, step_metrics
from learner import checkpoint
from learner.advantage_stage import dapo_selection, group_faults, informative_groups
from learner.batch import build_batch
from reward.health import VerifierHealth
from reward.intrinsic import mix_rewards
from reward.tasks import Problem
from rollout.seeding import derive_seed


class Trainer:
    """The loop over what :func:`launch.stages.build_stages` built."""

    def __init__(self, cfg: TrainConfig, stages: Stages, run_dir: Path, log=print):
        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.ckpt_root = self.run_dir / "checkpoints"
        self.stop_reason: str | None = None
        self.stages = stages
        self.task, self.eval_sets = stages.task, stages.eval_sets
        self.resume_from = stages.resume_from
        self.stage, self.sampler = stages.stage, stages.sampler
        self.health = VerifierHealth(cfg.verifier.alert_frac)
        self.rollout, self.learner, self.weights = stages.rollout, stages.learner, stages.weights
        self.accuracy_start: float | None = None
        self.samples: list[dict] = []  # the last step's rollouts to log whole (logger.samples)
        self.resumed_row: dict = {}  # restore(): the logged row of the checkpoint's step
        self.wandb_run_id: str | None = None  # logger.wandb: the run's, kept in checkpoints
        # trainer.async=one_step: the next step's rollouts, generated while this step trains
        self.one_step = cfg.trainer.async_mode == "one_step"
        self.pending: Rollouts | None = None
        self.prefetcher = (
            ThreadPoolExecutor(1, thread_name_prefix="prefetch") if self.one_step else None
        )

    def verify(self, groups, problems, task=None, task_cfg=None) -> list:
        """Verdicts of every sample (the training task unless given): launch/stages.py."""
        task, task_cfg = task or self.task, task_cfg or self.cfg.task
        return self.stages.verifier.verify(groups, problems, task, task_cfg.truncated)

    def generate_and_submit(self, batch: list[Problem], params) -> tuple[list, list]:
        """The groups of ``batch`` (prompt order) and their verification calls in flight. With
        ``trainer.verify_while_generating`` each engine step's finished groups go to the
        verifier at once, while the rest decode; else the whole batch after generation."""
        prompts = [p.prompt for p in batch]
        verifier = self.stages.verifier
        if not self.cfg.trainer.verify_while_generating:
            groups = self.rollout.generate(prompts, params)
            return groups, [(list(range(len(batch))), verifier.submit(groups, batch, self.task))]
        groups, pending = [None] * len(batch), []
        for done in self.rollout.stream(prompts, params):
            rows = [i for i, _ in done]
            for i, group in done:
                groups[i] = group
            pending.append((rows, verifier.submit([g for _, g in done], [batch[i] for i in rows],
                                                  self.task)))  # fmt: skip
        return groups, pending

    def verdicts(self, groups: list, pending: list) -> list:
        """Every sample's verdict in sample order, from :meth:`generate_and_submit`'s calls."""
        per_group: list = [None] * len(groups)
        for rows, call in pending:
            verdicts = iter(self.stages.verifier.result(call, self.cfg.task.truncated))
            for i in rows:
                per_group[i] = [next(verdicts) for _ in groups[i].samples]
        return [v for group in per_group for v in group]

    def evaluate(self, step: int, phase: Callable[[str], None] | None = None) -> dict[str, float]:
        return evaluate_held_out(self.cfg, self.stages, step, phase)

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
            params = self.cfg.rollout.sampling.params(
                n=self.cfg.rollout.n_samples,
                seed=derive_seed(self.cfg.trainer.seed, "train", step, rnd),
            )
            t0 = time.perf_counter()
            new, pending = self.generate_and_submit(batch, params)
            t1 = time.perf_counter()
            scored = self.verdicts(new, pending)
            t_gen, t_ver = t_gen + t1 - t0, t_ver + time.perf_counter() - t1
            problems, groups, verdicts = problems + batch, groups + new, verdicts + scored
            if not dyn.enabled:
                break
            scores = [v.score for v in scored]
            faulted = group_faults(new, scored)  # unknown rewards: never informative
            informative += informative_groups(
                new, scores, tau=self.cfg.algorithm.tau, faulted=faulted
            )
            if sum(informative) >= want:
                break
        trained = [True] * len(groups)
        metrics = {"timing_s/generate": t_gen, "timing_s/verify": t_ver}
        if dyn.enabled:  # informative groups first, in generation order, then collapsed ones
            trained = dapo_selection(informative, want)
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
            scored = build_batch(r.groups, torch.zeros_like(scores), pad_id=self.stages.pad_id)
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

    def observe_collapse(self, r: Rollouts, collapsed: list[bool]) -> dict[str, float]:
        """Which of the step's groups collapsed, as the ACR monitor counts them (the rewards it
        sees: after ``algorithm.reward`` mixing and ``algorithm.overlong`` shaping; threshold
        ``algorithm.tau``; every generated group): handed to the prompt sampler (its collapse
        history) and measured as ``rollout/mixed_token_share``, the share of the step's response
        tokens that are in mixed (non-collapsed) groups."""
        self.sampler.update([p.uid for p in r.problems], collapsed)
        tokens = [sum(len(s.response_ids) for s in g.samples) for g in r.groups]
        return {"rollout/mixed_token_share": mixed_token_share(tokens, collapsed)}

    def train_step(self, step: int) -> dict[str, float]:
        timer, t0 = PhaseTimer(), time.perf_counter()
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
        with timer("advantage"):
            verdicts, mixed = self.mix_rewards(r)
            out = self.stage.process(
                r.groups, verdicts, prompt_keys=[p.uid for p in r.problems], trained=r.trained
            )
            metrics = out.metrics | mixed | self.observe_collapse(r, out.collapsed)
        self.samples = sample_records(
            step, r, out.rewards, out.advantages, self.cfg.logger.samples, self.task.reward_range[1]
        )
        with timer("learner"):
            self.weights.before_update()  # colocated on GPUs: the engines sleep
            metrics |= self.learner.train_on(out.batch, learner_version=step - 1)
        with timer("prefetch_wait"):  # one-step mode: the next step's rollouts
            if prefetch is not None:
                self.pending = prefetch.result()  # before the sync: the engines are free again
        with timer("weight_sync"):  # learner rank 0 -> every engine, never via the driver
            self.weights.after_update(step)
        total = time.perf_counter() - t0
        rolled = self.pending.metrics if prefetch is not None else r.metrics  # done this step
        serial = not prefetched and prefetch is None  # every phase ran in this step's time
        metrics |= step_metrics(step, r.metrics, r.groups, timer.seconds, total, rolled, serial)
        return metrics | self.verifier_health(step, metrics) | self.stages.fault_metrics()

    def verifier_health(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Restarts and error classes of the verifier since the last step (reward/health.py);
        new error texts and an alert go to the console."""
        health, lines = self.health.observe(step, metrics, *self.stages.verifier.drain())
        for line in lines:
            self.log(line)
        return health

    # ---- the run ------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary with a checkpoint (SIGINT/SIGTERM: launch/train.py);
        :meth:`run` then raises :class:`Stopped`."""
        self.stop_reason = reason

    def run(self) -> dict[str, float]:
        t = self.cfg.trainer
        start = self.restore()
        sink = self.open_sinks(start)
        # a finished run resumed (no step left): its final metrics are its last logged row
        metrics: dict[str, float] = {k: v for k, v in self.resumed_row.items() if k != "step"}
        try:
            if start == 0:
                with sink.phase(self.eval_phase()) as show:
                    metrics = self.evaluate(0, show)
                self.accuracy_start = metrics["eval/accuracy"]
                sink.log(0, metrics)
            if self.stop_reason:
                raise Stopped(self.stop_reason, start, None)
            for step in range(start + 1, t.total_steps + 1):
                metrics = self.train_step(step)
                last = step == t.total_steps
                if (t.eval_every and step % t.eval_every == 0) or last:
                    with sink.phase(self.eval_phase()) as show:
                        metrics |= self.evaluate(step, show)
                sink.log_samples(step, self.samples)
                sink.log(step, metrics)  # before the checkpoint: a resume never loses a row
                stopping = self.stop_reason is not None and not last
                if (t.save_every and step % t.save_every == 0) or last or stopping:
                    with sink.phase(f"writing the step-{step} checkpoint"):
                        folder = self.save(step)
                if stopping:
                    raise Stopped(self.stop_reason, step, folder)
        finally:
            sink.close()
        self.write_outputs()
        return {"eval/accuracy_start": self.accuracy_start, **metrics}

    def eval_phase(self) -> str:
        n = sum(len(task.test) for task, _ in self.stages.eval_sets.values())
        t = self.cfg.trainer
        k = (t.eval_samples or t.eval_pass_k) if t.eval_pass_k else 0
        return f"evaluating {n} problems" + (f" (greedy, then {k} samples each)" if k else "")

    def open_sinks(self, start: int) -> MultiSink:
        lg = self.cfg.logger
        sinks: list = [JsonlSink(self.run_dir / "metrics.jsonl")]
        if lg.samples:
            sinks.append(SamplesSink(self.run_dir / "samples.jsonl"))
        if lg.console:
            console = ConsoleSink(
                self.cfg.trainer.total_steps, progress=lg.progress, write=self.log, start=start
            )
            self.log = console.write  # above the bar, on a terminal: every line of the run
            sinks.append(console)
        if lg.tensorboard:
            sinks.append(TensorBoardSink(self.run_dir / "tensorboard"))
        if lg.wandb:
            cfg = self.cfg
            wandb = WandbSink(
                self.run_dir,
                project=lg.wandb_project,
                entity=lg.wandb_entity,
                mode=wandb_mode(lg.wandb_mode, dict(os.environ)),
                config=dataclasses.asdict(cfg),
                name=lg.wandb_name or self.run_dir.name,
                group=lg.wandb_group or cfg.algorithm.name,
                tags=lg.wandb_tags or [cfg.algorithm.name, cfg.task.name, cfg.model.name],
                run_id=self.wandb_run_id,  # restore(): the checkpoint's, so a resume continues it
            )
            self.wandb_run_id = wandb.run_id
            sinks.append(wandb)
        return MultiSink(sinks)

    def save(self, step: int) -> str:
        state = {
            "advantage_stage": self.stage.state_dict(),
            "extra": {
                "sampler": self.sampler.state_dict(),
                "accuracy_start": self.accuracy_start,
                "pending": None if self.pending is None else self.pending.state_dict(),
                "wandb_run_id": self.wandb_run_id,
            },
            "run": fingerprint(self.cfg, self.task),
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

    def restore(self) -> int:
        """Load ``self.resume_from`` (if any) into the learner, the engines and the sampler;
        returns the step to continue after (0 for a fresh run, whose run directory may hold
        the rows of an attempt that died before its first checkpoint: they move aside)."""
        if self.resume_from is None:
            truncate_logs(self.run_dir, -1)
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
        self.wandb_run_id = state["extra"].get("wandb_run_id")
        pending = state["extra"].get("pending")
        if pending is not None and self.one_step:
            self.pending = Rollouts.from_state(pending, {p.uid: p for p in self.task.train})
        self.weights.sync(step)
        self.resumed_row = truncate_logs(self.run_dir, step)
        self.log(f"resumed from {self.resume_from} at step {step}")
        return step

    def write_outputs(self) -> None:
        history = self.stage.prompt_history()
        (self.run_dir / "prompt_history.json").write_text(json.dumps(history))
        (self.run_dir / "verifier_health.json").write_text(json.dumps(self.health.summary()))
        if self.cfg.logger.report:
            from diagnostics.report import write_report

            self.log(f"report: {write_report(self.run_dir)}")

    def shutdown(self) -> None:
        """Stop the prefetch thread (the caller shuts the stages down)."""
        if self.prefetcher is not None:
            self.prefetcher.shutdown(wait=False, cancel_futures=True)
