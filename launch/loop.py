"""The driver loop (DESIGN.md section 2): it asks each stage for its output and hands it on.

    prompts -> rollout workers (n per prompt) -> verifier pool -> learner group (advantage stage
    + ACR monitor + update) -> weight sync (policy version v+1) -> next step

Stages never call each other; the only backward edge is the weight sync. Held-out evaluation
(greedy pass@1) runs at step 0 and every ``trainer.eval_every`` steps.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

import torch

from diagnostics.sinks import JsonlSink, console_line
from launch.bootstrap import ensure_model
from launch.config import ConfigError, TrainConfig
from learner.group import LearnerGroup
from reward.actor import VerifierActor
from reward.tasks import Problem, make_task
from rollout.actors import get, spawn_actor_group
from rollout.types import Group
from rollout.worker import RolloutGroup


class PromptSampler:
    """Seeded passes over the train split, reshuffled each epoch."""

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


def init_ray(cfg: TrainConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return
    # Logical CPUs for every actor (they time-share the real cores; ENVIRONMENT.md: a task
    # waiting for a free logical CPU while actors hold them all would wait forever).
    need = (
        cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker
        + cfg.learner.num_ranks * cfg.learner.num_cpus_per_rank
        + 2
    )
    ray.init(num_cpus=max(4, int(need + 0.999)), include_dashboard=False, log_to_driver=False)


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, log=print):
        from transformers import AutoTokenizer

        self.cfg, self.run_dir, self.log = cfg, run_dir, log
        self.task = make_task(cfg.task)
        if not self.task.train or not self.task.test:
            raise ConfigError(f"task: {cfg.task.name} has an empty train or test split")
        model_path = ensure_model(cfg.model, log)
        pad_id = AutoTokenizer.from_pretrained(model_path).pad_token_id or 0
        init_ray(cfg)
        self.rollout = RolloutGroup(cfg.rollout, model_path, cfg.model.dtype)
        self.verifier = spawn_actor_group(VerifierActor, 1, cfg.verifier, num_cpus=1)[0]
        monitor = dataclasses.replace(cfg.acr, r_lo=self.task.reward_range[0])
        self.learner = LearnerGroup(
            cfg.learner,
            cfg.algorithm,
            model_path,
            dtype=cfg.model.dtype,
            reward_range=self.task.reward_range,
            monitor=monitor,
            pad_id=pad_id,
        )
        self.sampler = PromptSampler(self.task.train, cfg.trainer.seed)
        self.sink = JsonlSink(run_dir / "metrics.jsonl")

    def verify(self, groups: list[Group], problems: list[Problem]):
        responses = [s.text for g in groups for s in g.samples]
        refs = [p.answer for p, g in zip(problems, groups, strict=True) for _ in g.samples]
        return get(
            [self.verifier.verify.remote(responses, refs, self.task.verifier)],
            timeout_s=self.cfg.rollout.timeout_s,
            what="verification",
        )[0]

    def evaluate(self) -> dict[str, float]:
        problems = self.task.test
        params = dataclasses.replace(self.cfg.rollout.sampling, n=1, temperature=0.0, seed=0)
        groups = self.rollout.generate([p.prompt for p in problems], params)
        verdicts = self.verify(groups, problems)
        return {"eval/accuracy": sum(v.score for v in verdicts) / len(verdicts)}

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        problems = self.sampler.next(self.cfg.trainer.prompts_per_step)
        params = dataclasses.replace(
            self.cfg.rollout.sampling,
            n=self.cfg.rollout.n_samples,
            seed=self.cfg.trainer.seed * 1_000_003 + step,
        )
        groups = self.rollout.generate([p.prompt for p in problems], params)
        t1 = time.perf_counter()
        verdicts = self.verify(groups, problems)
        t2 = time.perf_counter()
        rewards = torch.tensor([v.score for v in verdicts])
        metrics = self.learner.step(
            groups,
            rewards,
            prompt_keys=[p.uid for p in problems],
            verifier_reasons=[v.reason for v in verdicts],
        )
        t3 = time.perf_counter()
        sync = self.rollout.push_weights(self.learner.export_weights(), version=step)
        lengths = [len(s.response_ids) for g in groups for s in g.samples]
        metrics.update(
            {
                "reward/mean": float(rewards.mean()),
                "response_length/mean": sum(lengths) / len(lengths),
                "timing_s/generate": t1 - t0,
                "timing_s/verify": t2 - t1,
                "timing_s/learner": t3 - t2,
                "timing_s/weight_sync": sync,
                "perf/generated_tokens_per_s": sum(lengths) / max(t1 - t0, 1e-9),
            }
        )
        metrics["timing_s/step"] = time.perf_counter() - t0
        return metrics

    def run(self) -> dict[str, float]:
        total, every = self.cfg.trainer.total_steps, self.cfg.trainer.eval_every
        first = self.evaluate()
        self.sink.log(0, first)
        self.log(console_line(0, total, first))
        metrics = first
        for step in range(1, total + 1):
            metrics = self.train_step(step)
            if (every and step % every == 0) or step == total:
                metrics.update(self.evaluate())
            self.sink.log(step, metrics)
            self.log(console_line(step, total, metrics))
        self.sink.close()
        return {"eval/accuracy_start": first["eval/accuracy"], **metrics}

    def shutdown(self) -> None:
        import ray

        self.rollout.shutdown()
        self.learner.shutdown()
        ray.kill(self.verifier)
