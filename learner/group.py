"""The learner group: N DeepSpeed ranks as Ray actors, an adapter that trains on what it is given.

The driver's advantage stage (learner/advantage_stage.py) turns a step's reward groups into a
finished :class:`~learner.batch.TrainBatch` with advantages; :meth:`LearnerGroup.train_on` splits
it into mini-batches (one optimizer step each) with equal sample counts and balanced tokens per
rank, runs ``learner.ppo_epochs`` passes on every rank with each mini-batch's global token and
sequence counts, and sums the ranks' metrics. Every remote wait has a timeout.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch

from comm.actors import get, spawn_actor_group
from comm.hub import ModelRef
from learner import checkpoint
from learner.batch import TrainBatch, plan_microbatches, shard_by_tokens
from learner.config import LearnerConfig
from learner.loss import LossConfig
from learner.rank import LearnerRank
from learner.update import split_for_ranks, summarize_ranks


class LearnerGroup:
    def __init__(
        self,
        cfg: LearnerConfig,
        loss: LossConfig,
        model_path: str | ModelRef,
        *,
        dtype: str = "float32",
        temperature: float = 1.0,
        placement=None,
        resources: tuple[float, float] | None = None,
        threads: list[int] | None = None,
    ):
        """``loss`` is the algorithm's loss config with ``norm_len`` resolved (the driver sets
        it to the max response length for Dr. GRPO); ``temperature`` is the sampling
        temperature, by which the ranks divide their logits (docs/ARCHITECTURE.md section 4).
        ``resources``: (CPUs, GPUs) each rank asks Ray for (default: the config's); ``threads``:
        torch threads per rank (launch/cluster.py ``plan_threads``)."""
        num_cpus, num_gpus = resources or (cfg.num_cpus_per_rank, cfg.num_gpus_per_rank)
        threads = threads or [None] * cfg.num_ranks
        self.cfg = cfg
        self.ranks = [
            spawn_actor_group(
                LearnerRank,
                1,
                r,
                cfg.num_ranks,
                cfg,
                loss,
                model_path,
                dtype,
                temperature,
                threads[r],
                num_cpus=num_cpus,
                num_gpus=num_gpus,
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
        self.micro_batch_tokens = cfg.micro_batch_tokens
        if cfg.micro_batch_size is None and cfg.micro_batch_tokens is None:
            self.micro_batch_tokens = self._auto_micro_batch_tokens()

    def _auto_micro_batch_tokens(self) -> int:
        """The smallest rank's automatic budget; on CPU the ranks of a node share its RAM."""
        where = get(
            [r.memory.remote() for r in self.ranks], timeout_s=self.cfg.timeout_s, what="memory"
        )
        sharing = [
            sum(1 for n, kind, _ in where if n == node) if kind == "cpu" else 1
            for node, kind, _ in where
        ]
        budgets = get(
            [r.micro_batch_budget.remote(k) for r, k in zip(self.ranks, sharing, strict=True)],
            timeout_s=self.cfg.timeout_s,
            what="micro-batch budget",
        )
        return min(budgets)

    def train_on(self, batch: TrainBatch, learner_version: int | None = None) -> dict[str, float]:
        """The PPO update on a ready batch (``ppo_epochs`` passes). Loss terms are token means
        over every epoch and rank; counts and grad norms cover every optimizer step.
        ``learner_version``: the policy version the learner holds (samples of older versions
        are lagged: their log-prob gap is logged apart from the numerical one)."""
        per_rank, totals, plans = split_for_ranks(batch, self.cfg, self.micro_batch_tokens)
        ranks = get(
            [
                r.train.remote(per_rank[i], totals, plans[i], self.cfg.ppo_epochs, learner_version)
                for i, r in enumerate(self.ranks)
            ],
            timeout_s=self.cfg.timeout_s,
            what="learner update",
        )
        return summarize_ranks(ranks, self.cfg)

    def intrinsic(self, batch: TrainBatch) -> torch.Tensor:
        """``[N, 2]``: each sample's mean response-token entropy and self-certainty under the
        current policy (reward/intrinsic.py), the rows sharded over the ranks by tokens."""
        shards = shard_by_tokens(batch, self.cfg.num_ranks)
        parts = [batch.select(rows) for rows in shards]
        plans = plan_microbatches(
            parts,
            micro_batch_size=self.cfg.micro_batch_size,
            micro_batch_tokens=self.micro_batch_tokens,
            chunk_tokens=self.cfg.logits_chunk_tokens,
        )
        got = get(
            [r.score.remote(p, plan) for r, p, plan in zip(self.ranks, parts, plans, strict=True)],
            timeout_s=self.cfg.timeout_s,
            what="intrinsic rewards",
        )
        out = torch.zeros(len(batch), 2)
        for rows, values in zip(shards, got, strict=True):
            out[rows] = values
        return out

    def export_weights(self, every_rank: bool = False) -> list:
        """Full state dicts (rank 0's, or every rank's); every rank takes part (ZeRO-3)."""
        states = get(
            [r.export_weights.remote(every_rank) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="weight export",
        )
        return states if every_rank else states[0]

    def export_bucket_refs(self, bucket_bytes: int) -> list:
        """Rank 0's parameters as refs of ``{name: tensor}`` buckets of at most
        ``bucket_bytes``, left in the object store for the rollout workers to read (they never
        pass through the driver); every rank takes part (ZeRO-3 gathers each bucket)."""
        got = get(
            [r.export_buckets.remote(bucket_bytes) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="weight export",
        )
        return got[0]

    def export_file(self, bucket_bytes: int) -> tuple[str, str, int]:
        """``(node id, path, bytes)``: rank 0's weights written into one file in shared memory
        on its node (learner/export.py ``write_file``), for engines on that node; every rank
        takes part (ZeRO-3 gathers each bucket)."""
        got = get(
            [r.export_file.remote(bucket_bytes) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="weight export",
        )
        return got[0]

    def save_checkpoint(
        self, root: str, step: int, state: dict | None = None, keep: int | None = None
    ) -> str:
        """A complete checkpoint of the learner (all ranks), with ``state`` (the driver's:
        advantage stage and monitor, data position, RNG; JSON) in the sidecar; then only the
        newest ``keep`` are kept. Checks the free space first (the last checkpoint's size); a
        failed write leaves no partial folder and the earlier checkpoints intact."""
        previous = checkpoint.checkpoints(root)
        if previous:
            checkpoint.check_space(root, checkpoint.size(previous[-1]))
        tmp = checkpoint.staging_dir(root, step)
        try:
            get(
                [r.save.remote(str(tmp)) for r in self.ranks],
                timeout_s=self.cfg.timeout_s,
                what="saving a learner checkpoint",
            )
            folder = checkpoint.commit(root, step, tmp, {"step": step, **(state or {})})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        checkpoint.retain(root, keep)
        return str(folder)

    def load_checkpoint(self, folder: str) -> dict:
        """Restore the ranks; returns the sidecar (``step`` and the driver's state)."""
        path = Path(folder)
        checkpoint.check_complete(path)
        checkpoint.verify(path)
        get(
            [r.load.remote(str(path)) for r in self.ranks],
            timeout_s=self.cfg.timeout_s,
            what="loading a learner checkpoint",
        )
        return checkpoint.read_state(path)

    # ---- collective weight sync: the transport (rollout/weight_sync.py) waits on these refs ---

    def weight_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(name, dtype, shape)`` of the tensors a collective sync sends, in order."""
        return get(
            [self.ranks[0].weight_specs.remote()], timeout_s=self.cfg.timeout_s, what="weight specs"
        )[0]

    def sync_address(self) -> tuple[str, int]:
        """Where the sync group's store will listen: learner rank 0's node, a free port."""
        return get(
            [self.ranks[0].address.remote()], timeout_s=self.cfg.timeout_s, what="sync address"
        )[0]

    def open_weight_group(self, group) -> list:
        """Refs: every rank plans the buckets, rank 0 joins the group (``group``:
        comm/weight_protocol.py ``SyncGroup``; it returns once every engine has joined too, so the
        caller waits on these together with the engines)."""
        return [r.open_weight_group.remote(group) for r in self.ranks]

    def broadcast_weights(self, version: int) -> list:
        """Refs of every rank's part of one broadcast (bytes sent, rank 0's first)."""
        return [r.broadcast_weights.remote(version) for r in self.ranks]

    def shutdown(self) -> None:
        import ray

        if self.ranks:  # the sync's weights file (a killed rank's: removed by the next engine)
            with contextlib.suppress(Exception):
                ray.get(self.ranks[0].remove_weight_file.remote(), timeout=10)
        for r in self.ranks:
            ray.kill(r)
        self.ranks = []
