"""The learner group: N DeepSpeed ranks as Ray actors, with the advantage stage and the ACR
monitor in front of them (DESIGN.md section 2: between reward collection and the update).

``step(groups, rewards, ...)`` runs, in order: the advantage stage over whole groups (estimator
by name, AVSPO trigger), the ACR monitor (reusing the stage's collapse statistics), the train
batch, its split over ranks (equal sample counts, balanced tokens), and the update on every rank
with the mini-batch's global token and sequence counts. Every remote wait has a timeout.
"""

from __future__ import annotations

from pathlib import Path

import torch

from diagnostics.acr import ACRMonitor, MonitorConfig
from learner import checkpoint
from learner.advantage_stage import AdvantageStage
from learner.batch import TrainBatch, build_batch, shard_by_tokens
from learner.config import AlgorithmConfig, LearnerConfig, minibatch_problem
from learner.rank import LearnerRank
from rollout.actors import ActorGroupError, get, spawn_actor_group
from rollout.types import Group


class LearnerGroup:
    def __init__(
        self,
        cfg: LearnerConfig,
        algorithm: AlgorithmConfig,
        model_path: str,
        *,
        dtype: str = "float32",
        reward_range: tuple[float, float] = (0.0, 1.0),
        monitor: MonitorConfig | None = None,
        pad_id: int = 0,
        placement=None,
    ):
        self.cfg, self.pad_id = cfg, pad_id
        self.stage = AdvantageStage(algorithm, reward_range=reward_range, seed=cfg.seed)
        self.monitor = ACRMonitor(monitor or MonitorConfig(r_lo=reward_range[0]))
        self.ranks = [
            spawn_actor_group(
                LearnerRank,
                1,
                r,
                cfg.num_ranks,
                cfg,
                algorithm.loss,
                model_path,
                dtype,
                num_cpus=cfg.num_cpus_per_rank,
                num_gpus=cfg.num_gpus_per_rank,
                placement=placement,
                first_bundle=r,
            )[0]
            for r in range(cfg.num_ranks)
        ]
        addr, port = get(
            [self.ranks[0].address.remote()], timeout_s=cfg.timeout_s, what="learner rank 0 address"
        )[0]
        get(
            [r.init.remote(addr, port) for r in self.ranks],
            timeout_s=cfg.timeout_s,
            what="starting DeepSpeed learner ranks",
        )

    def _minibatches(self, batch: TrainBatch) -> tuple[list[list[TrainBatch]], list]:
        """Per rank, its mini-batches; and each mini-batch's global (tokens, sequences)."""
        n, k = len(batch), self.cfg.num_ranks
        problem = minibatch_problem(n, self.cfg.mini_batch_size, k)
        if problem:
            raise ValueError(problem)
        size = n // -(-n // (self.cfg.mini_batch_size or n))  # n / ceil(n / mini_batch_size)
        per_rank: list[list[TrainBatch]] = [[] for _ in range(k)]
        totals = []
        for start in range(0, n, size):
            mini = batch.select(list(range(start, start + size)))
            for r, rows in enumerate(shard_by_tokens(mini, k)):
                per_rank[r].append(mini.select(rows))
            totals.append((float(mini.num_tokens), float(size)))
        return per_rank, totals

    def train_on(self, batch: TrainBatch) -> dict[str, float]:
        """The PPO update on a ready batch (ppo_epochs passes); summed/averaged rank metrics."""
        per_rank, totals = self._minibatches(batch)
        results = []
        for _ in range(self.cfg.ppo_epochs):
            results += get(
                [r.train.remote(per_rank[i], totals) for i, r in enumerate(self.ranks)],
                timeout_s=self.cfg.timeout_s,
                what="learner update",
            )
        tokens = sum(m["tokens"] for m in results) or 1.0
        first = results[0]
        return {
            "actor/pg_loss": sum(m["loss"] for m in results) / self.cfg.ppo_epochs,
            "actor/pg_clipfrac": sum(m["pg_clipfrac"] for m in results) / tokens,
            "actor/approx_kl": sum(m["approx_kl"] for m in results) / tokens,
            "actor/ref_kl": sum(m["ref_kl"] for m in results) / tokens,
            "actor/grad_norm": first["grad_norm"],
            "actor/lr": first["lr"],
            "actor/skipped_steps": float(first["skipped_steps"]),
            "actor/optimizer_steps": float(first["optimizer_steps"]),
            "perf/learner_tokens": tokens / self.cfg.ppo_epochs,
            "timing_s/update": max(m["seconds"] for m in results),
        }

    def step(
        self,
        groups: list[Group],
        rewards: torch.Tensor,
        *,
        prompt_keys: list[str] | None = None,
        verifier_reasons: list[str] | None = None,
    ) -> dict[str, float]:
        """Advantage stage + ACR monitor + update for one step's reward groups."""
        group_ids = torch.arange(len(groups)).repeat_interleave(
            torch.tensor([len(g.samples) for g in groups])
        )
        result, metrics = self.stage(rewards, group_ids)
        batch = build_batch(groups, result.advantages, pad_id=self.pad_id)
        metrics.update(
            self.monitor.update(
                rewards,
                group_ids,
                result.advantages,
                batch.response_mask.sum(1),
                prompt_keys=prompt_keys,
                verifier_reasons=verifier_reasons,
                stats=result.stats,
            )
        )
        metrics.update(self.train_on(batch))
        return metrics

    def export_weights(self, every_rank: bool = False) -> list:
        """Full state dicts (rank 0's, or every rank's); every rank takes part (ZeRO-3)."""
        states = get(
            [r.export_weights.remote(every_rank) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="weight export",
        )
        return states if every_rank else states[0]

    def export_weights_ref(self):
        """Rank 0's full state dict as an ObjectRef, left in the object store for the rollout
        workers to read (it never passes through the driver); every rank takes part (ZeRO-3)."""
        import ray

        refs = [r.export_weights.remote(False) for r in self.ranks]
        get(refs[1:], timeout_s=self.cfg.timeout_s, what="weight export")  # None each
        done, _ = ray.wait(refs[:1], timeout=self.cfg.timeout_s, fetch_local=False)
        if not done:
            raise ActorGroupError(f"weight export: no answer within {self.cfg.timeout_s:.0f} s")
        return refs[0]

    def save_checkpoint(self, root: str, step: int, extra: dict | None = None) -> str:
        """A complete checkpoint of the learner (all ranks) with the advantage stage's and the
        ACR monitor's state and ``extra`` (the driver's: data position, RNG) in the sidecar."""
        tmp = checkpoint.staging_dir(root, step)
        get(
            [r.save.remote(str(tmp)) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="saving a learner checkpoint",
        )
        state = {
            "step": step,
            "advantage_stage": self.stage.state_dict(),
            "acr_monitor": self.monitor.state_dict(),
            "extra": extra or {},
        }
        return str(checkpoint.commit(root, step, tmp, state))

    def load_checkpoint(self, folder: str) -> dict:
        """Restore ranks, advantage stage and monitor; returns the sidecar (step, extra)."""
        path = Path(folder)
        checkpoint.check_complete(path)
        get(
            [r.load.remote(str(path)) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="loading a learner checkpoint",
        )
        state = checkpoint.read_state(path)
        self.stage.load_state_dict(state["advantage_stage"])
        self.monitor.load_state_dict(state["acr_monitor"])
        return state

    def shutdown(self) -> None:
        import ray

        for r in self.ranks:
            ray.kill(r)
        self.ranks = []
