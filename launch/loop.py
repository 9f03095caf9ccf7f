"""The driver loop (DESIGN.md section 2): it asks each stage for its output and hands it on.

    prompts -> rollout workers (n per prompt) -> verifier pool -> learner group (advantage stage
    + ACR monitor + update) -> weight sync (policy version v+1) -> next step

Stages never call each other; the only backward edge is the weight sync. Held-out evaluation
(greedy pass@1, and pass@k) runs at step 0, every ``trainer.eval_every`` steps and at the end;
a checkpoint is written every ``trainer.save_every`` steps and at the end, and
``trainer.resume=auto|<path>`` continues a run from one, bit-exactly on CPU (the data position
and every RNG state are in the checkpoint; each step's sampling seed derives from the step).
With ``algorithm.dynamic_sampling.enabled`` (DAPO), collapsed groups are dropped and more
prompts generated, for at most ``max_rounds`` rounds per step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path

import torch

from diagnostics.acr import collapse_stats
from diagnostics.sinks import (
    ConsoleSink,
    JsonlSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    wandb_mode,
)
from launch.bootstrap import ensure_model
from launch.cluster import init_ray, reserve
from launch.config import ConfigError, TrainConfig
from launch.evaluate import evaluate
from learner import checkpoint
from learner.config import DynamicSamplingConfig
from reward.tasks import Problem, make_task
from rollout.actors import get, spawn_actor_group
from rollout.types import Group

SEED_STRIDE = 1_000_003  # trainer.seed * stride + step: distinct seeds for every (seed, step)
MAX_ROUNDS = DynamicSamplingConfig.MAX_ROUNDS  # (seed-step) * MAX_ROUNDS + round: per round


class PromptSampler:
    """Seeded passes over the train split, reshuffled each epoch; its state is checkpointed."""

    def __init__(self, problems: list[Problem], seed: int):
        self.problems, self.rng, self.order, self.pos = problems, random.Random(seed), [], 0

    def next(self, k: int) -> list[Problem]:
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order, self.pos = list(range(len(self.problems))), 0
                self.rng.shuffle(self.order)
            out.append(self.problems[self.order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"order": self.order, "pos": self.pos, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.pos = list(state["order"]), int(state["pos"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


@dataclasses.dataclass
class Rollouts:
    """One step's training groups with their problems and verdicts, plus what it took."""

    problems: list[Problem]
    groups: list[Group]
    verdicts: list
    metrics: dict[str, float]


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, log=print, learner: bool = True):
        from transformers import AutoTokenizer

        from learner.group import LearnerGroup
        from reward.actor import VerifierActor
        from rollout.worker import RolloutGroup

        self.cfg, self.run_dir, self.log = cfg, Path(run_dir), log
        self.task = make_task(cfg.task)
        if not self.task.train or not self.task.test:
            raise ConfigError(f"task: {cfg.task.name} has an empty train or test split")
        self.ckpt_root = self.run_dir / "checkpoints"
        self.resume_from = self._resolve_resume()
        self.model_path = ensure_model(cfg.model, log)
        if self.resume_from is not None and not learner:  # evaluate a checkpoint's weights
            self.model_path = str(self.resume_from / "model")
        pad_id = AutoTokenizer.from_pretrained(self.model_path).pad_token_id or 0
        init_ray(cfg)
        placement = reserve(
            cfg, ("rollout", "verifier", "learner") if learner else ("rollout", "verifier")
        )
        # vLLM engines start (~30 s on CPU) while the verifier and learner ranks start.
        self.rollout = RolloutGroup(
            cfg.rollout,
            self.model_path,
            cfg.model.dtype,
            placement=placement["rollout"],
            wait=False,
        )
        self.verifier = spawn_actor_group(
            VerifierActor, 1, cfg.verifier, num_cpus=1, placement=placement["verifier"]
        )[0]
        self.learner = None
        if learner:
            self.learner = LearnerGroup(
                cfg.learner,
                cfg.algorithm,
                self.model_path,
                dtype=cfg.model.dtype,
                reward_range=self.task.reward_range,
                monitor=dataclasses.replace(cfg.acr, r_lo=self.task.reward_range[0]),
                pad_id=pad_id,
                placement=placement["learner"],
            )
        self.rollout.wait_ready()
        self.sampler = PromptSampler(self.task.train, cfg.trainer.seed)
        self.accuracy_start: float | None = None

    def _resolve_resume(self) -> Path | None:
        resume = self.cfg.trainer.resume
        if resume is None:
            return None
        try:
            return checkpoint.resolve(resume, self.ckpt_root)
        except checkpoint.CheckpointError as err:
            raise ConfigError(f"trainer.resume: {err}") from None

    # ---- stages -------------------------------------------------------------------------------

    def verify(self, groups: list[Group], problems: list[Problem]) -> list:
        responses = [s.text for g in groups for s in g.samples]
        refs = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g.samples]
        return get(
            [self.verifier.verify.remote(responses, refs, self.task.verifier)],
            timeout_s=self.cfg.rollout.timeout_s,
            what="verification",
        )[0]

    def evaluate(self) -> dict[str, float]:
        t = self.cfg.trainer
        return evaluate(
            self.rollout.generate,
            self.verify,
            self.task.test,
            self.cfg.rollout.sampling,
            k=t.eval_pass_k,
            temperature=t.eval_temperature,
            seed=t.seed,
        )

    def collect(self, step: int) -> Rollouts:
        """Generate and verify one step's groups; with dynamic sampling, keep only groups whose
        rewards differ, generating again (at most ``max_rounds`` rounds) until the step has
        ``prompts_per_step`` of them."""
        want, dyn = self.cfg.trainer.prompts_per_step, self.cfg.algorithm.dynamic_sampling
        kept, dropped = [], []  # (problem, group, verdicts) triples
        t_gen = t_ver = 0.0
        rounds = dyn.max_rounds if dyn.enabled else 1
        for rnd in range(rounds):
            problems = self.sampler.next(want)
            seed = (self.cfg.trainer.seed * SEED_STRIDE + step) * MAX_ROUNDS + rnd
            params = dataclasses.replace(
                self.cfg.rollout.sampling, n=self.cfg.rollout.n_samples, seed=seed
            )
            t0 = time.perf_counter()
            groups = self.rollout.generate([p.prompt for p in problems], params)
            t1 = time.perf_counter()
            verdicts = self.verify(groups, problems)
            t_gen, t_ver = t_gen + t1 - t0, t_ver + time.perf_counter() - t1
            n = self.cfg.rollout.n_samples
            triples = [
                (p, g, verdicts[i * n : (i + 1) * n])
                for i, (p, g) in enumerate(zip(problems, groups, strict=True))
            ]
            if not dyn.enabled:
                kept = triples
                break
            rewards = torch.tensor([v.score for v in verdicts])
            ids = torch.arange(len(groups)).repeat_interleave(n)
            collapsed = collapse_stats(rewards, ids, tau=self.cfg.algorithm.tau).collapsed.tolist()
            kept += [x for x, c in zip(triples, collapsed, strict=True) if not c]
            dropped += [x for x, c in zip(triples, collapsed, strict=True) if c]
            if len(kept) >= want:
                break
        informative = min(len(kept), want)
        batch = (kept + dropped)[:want]
        metrics = {"timing_s/generate": t_gen, "timing_s/verify": t_ver}
        if dyn.enabled:
            generated = len(kept) + len(dropped)
            metrics |= {
                "dapo/rounds": float(rnd + 1),
                "dapo/generated_groups": float(generated),
                "dapo/informative_groups": float(informative),
                "dapo/acr_generated": len(dropped) / generated,
            }
        return Rollouts(
            problems=[p for p, _, _ in batch],
            groups=[g for _, g, _ in batch],
            verdicts=[v for _, _, vs in batch for v in vs],
            metrics=metrics,
        )

    def sync_weights(self, version: int) -> None:
        """Learner rank 0's weights -> object store -> every engine (never via the driver)."""
        self.rollout.push_weights(self.learner.export_weights_ref(), version=version)

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        r = self.collect(step)
        t1 = time.perf_counter()
        rewards = torch.tensor([v.score for v in r.verdicts])
        metrics = self.learner.step(
            r.groups,
            rewards,
            prompt_keys=[p.uid for p in r.problems],
            verifier_reasons=[v.reason for v in r.verdicts],
        )
        t2 = time.perf_counter()
        self.sync_weights(step)
        t3 = time.perf_counter()
        lengths = [len(s.response_ids) for g in r.groups for s in g.samples]
        metrics |= r.metrics | {
            "reward/mean": float(rewards.mean()),
            "response_length/mean": sum(lengths) / len(lengths),
            "timing_s/learner": t2 - t1,
            "timing_s/weight_sync": t3 - t2,  # export from the ranks + load into the engines
            "perf/generated_tokens_per_s": sum(lengths) / max(r.metrics["timing_s/generate"], 1e-9),
        }
        metrics["timing_s/step"] = t3 - t0
        stages = ("generate", "verify", "learner", "weight_sync")
        metrics["timing_s/other"] = t3 - t0 - sum(metrics[f"timing_s/{k}"] for k in stages)
        return metrics

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        t = self.cfg.trainer
        start = self.restore()
        sink = self.open_sinks(start)
        metrics: dict[str, float] = {}
        try:
            if start == 0:
                metrics = self.evaluate()
                self.accuracy_start = metrics["eval/accuracy"]
                sink.log(0, metrics)
            for step in range(start + 1, t.total_steps + 1):
                metrics = self.train_step(step)
                last = step == t.total_steps
                if (t.eval_every and step % t.eval_every == 0) or last:
                    metrics |= self.evaluate()
                sink.log(step, metrics)  # before the checkpoint: a resume never loses a row
                if (t.save_every and step % t.save_every == 0) or last:
                    self.save(step)
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
        extra = {"sampler": self.sampler.state_dict(), "accuracy_start": self.accuracy_start}
        return self.learner.save_checkpoint(str(self.ckpt_root), step, extra=extra)

    def restore(self) -> int:
        """Load ``self.resume_from`` (if any) into the learner, the engines and the sampler;
        returns the step to continue after (0 for a fresh run)."""
        if self.resume_from is None:
            return 0
        state = self.learner.load_checkpoint(str(self.resume_from))
        step = int(state["step"])
        self.sampler.load_state_dict(state["extra"]["sampler"])
        self.accuracy_start = state["extra"]["accuracy_start"]
        self.sync_weights(step)
        truncate_metrics(self.run_dir / "metrics.jsonl", step)
        self.log(f"resumed from {self.resume_from} at step {step}")
        return step

    def write_outputs(self) -> None:
        history = {
            "summary": self.learner.monitor.prompt_summary(),
            "prompts": self.learner.monitor.prompt_history,
        }
        (self.run_dir / "prompt_history.json").write_text(json.dumps(history))
        if self.cfg.logger.report:
            from diagnostics.report import write_report

            self.log(f"report: {write_report(self.run_dir)}")

    def shutdown(self) -> None:
        import ray

        self.rollout.shutdown()
        if self.learner is not None:
            self.learner.shutdown()
        ray.kill(self.verifier)


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
