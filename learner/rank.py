"""One DeepSpeed learner rank, the body of a Ray actor (spawned by learner/group.py).

Each rank owns a replica (ZeRO 1/2) or a shard (ZeRO 3) of the policy, joins one
torch.distributed group (gloo on CPU, NCCL on GPU) and runs the PPO-style update on its shard
of the step's batch: micro-batches, log-probs recomputed under the current policy, the policy
loss with the *global* token and sequence counts of the mini-batch (so the loss and gradient do
not depend on the split), ``backward(loss * world_size)`` (DeepSpeed averages gradients over
ranks; the loss pieces must sum) and one optimizer step per mini-batch.

Non-finite steps: DeepSpeed's ZeRO 1-3 optimizers detect a non-finite global grad norm and skip
the update (weights and optimizer state untouched); we read that back per step and count it.
ZeRO stage 0 has no such check, so there every rank tests its gradients and a MAX all-reduce
makes all ranks skip together.
"""

from __future__ import annotations

import os
import socket
import time

import torch

from learner.batch import TrainBatch, token_logprobs
from learner.config import LearnerConfig
from learner.loss import LossConfig, policy_loss


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LearnerRank:
    def __init__(
        self,
        rank: int,
        world_size: int,
        cfg: LearnerConfig,
        loss: LossConfig,
        model_path: str,
        dtype: str = "float32",
    ):
        self.rank, self.world_size, self.cfg, self.loss_cfg = rank, world_size, cfg, loss
        self.model_path, self.dtype = model_path, dtype
        torch.set_num_threads(max(1, int(cfg.num_cpus_per_rank)))

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group (called on rank 0 only)."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    def init(self, master_addr: str, master_port: int) -> int:
        import deepspeed
        from transformers import AutoModelForCausalLM

        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend)
        torch.manual_seed(self.cfg.seed)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=getattr(torch, self.dtype)
        )
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=self.cfg.lr,
            betas=tuple(self.cfg.betas),
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
        )
        warmup = self.cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        ds_config = {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,  # step() is the boundary we choose
            "gradient_clipping": self.cfg.grad_clip,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": self.dtype == "bfloat16"},
            "steps_per_print": 10**9,
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        # A frozen reference policy for the KL term, only when it is used (kl_coef > 0): a full
        # replica per rank (fine for small models; large ones want a ZeRO-3 inference engine).
        self.reference = None
        if self.loss_cfg.kl_coef > 0:
            self.reference = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=getattr(torch, self.dtype)
            ).eval()
            self.reference.requires_grad_(False)
        return self.rank

    def train(self, minibatches: list[TrainBatch], totals: list[tuple[float, float]]) -> dict:
        """One optimizer step per mini-batch; ``totals[i]`` = (response tokens, sequences) of
        mini-batch i over all ranks. Returns this rank's metrics (sums, for the group to add)."""
        t0 = time.perf_counter()
        engine, cfg = self.engine, self.cfg
        sums = {"loss": 0.0, "pg_clipfrac": 0.0, "approx_kl": 0.0, "ref_kl": 0.0, "tokens": 0.0}
        steps = skipped = 0
        grad_norms = []
        for batch, (total_tokens, total_seqs) in zip(minibatches, totals, strict=True):
            for start in range(0, len(batch), cfg.micro_batch_size):
                mb = batch.select(list(range(start, min(start + cfg.micro_batch_size, len(batch)))))
                logits = engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
                logp = token_logprobs(logits, mb.input_ids)
                ref_logp = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logits = self.reference(
                            input_ids=mb.input_ids, attention_mask=mb.attention_mask
                        ).logits
                    ref_logp = token_logprobs(ref_logits, mb.input_ids)
                out = policy_loss(
                    logp,
                    mb.old_logprobs,
                    mb.advantages,
                    mb.response_mask,
                    clip_low=self.loss_cfg.clip_low,
                    clip_high=self.loss_cfg.clip_high,
                    clip_ratio_c=self.loss_cfg.clip_ratio_c,
                    aggregation=self.loss_cfg.aggregation,
                    norm_len=self.loss_cfg.norm_len,
                    ref_logprobs=ref_logp,
                    kl_coef=self.loss_cfg.kl_coef,
                    total_tokens=total_tokens,
                    total_seqs=total_seqs,
                )
                engine.backward(out.loss * self.world_size, scale_wrt_gas=False)
                tokens = float(mb.response_mask.sum())
                sums["loss"] += float(out.loss)
                sums["pg_clipfrac"] += float(out.metrics["pg_clipfrac"]) * tokens
                sums["approx_kl"] += float(out.metrics["approx_kl"]) * tokens
                sums["ref_kl"] += float(out.metrics.get("ref_kl", 0.0)) * tokens
                sums["tokens"] += tokens
            steps += 1
            if self.cfg.zero_stage == 0 and not self._grads_finite_everywhere():
                engine.zero_grad()  # ZeRO-0 has no overflow check of its own: skip by hand
                skipped += 1
                grad_norms.append(float("nan"))
                continue
            engine.step()
            if not engine.was_step_applied():
                skipped += 1
            norm = engine.get_global_grad_norm()
            grad_norms.append(float("nan") if norm is None else float(norm))
        return {
            **sums,
            "optimizer_steps": steps,
            "skipped_steps": skipped,
            "grad_norm": grad_norms[-1] if grad_norms else float("nan"),
            "lr": self.scheduler.get_last_lr()[0],
            "seconds": time.perf_counter() - t0,
        }

    def _grads_finite_everywhere(self) -> bool:
        """All ranks agree whether any rank holds a non-finite gradient (before the allreduce:
        a non-finite local gradient makes the averaged one non-finite too)."""
        import torch.distributed as dist

        local = all(
            bool(torch.isfinite(p.grad).all())
            for p in self.engine.module.parameters()
            if p.grad is not None
        )
        flag = torch.tensor([0.0 if local else 1.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() == 0.0

    def export_weights(self, every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        """The full state dict on rank 0, or on every rank (gathered under ZeRO-3, where every
        rank must call this at the same time)."""
        import deepspeed

        module = self.engine.module
        want = every_rank or self.rank == 0

        def snapshot():
            if not want:
                return None
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

        if self.cfg.zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return snapshot()
        return snapshot()

    def save(self, folder: str) -> None:
        """DeepSpeed's own checkpoint (model shards, optimizer, scheduler) under
        ``folder/deepspeed`` on every rank, and an HF model (safetensors) in ``folder/model``
        written by rank 0. Every rank must call this at the same time."""
        self.engine.save_checkpoint(folder, tag="deepspeed", save_latest=False)
        state = self.export_weights()
        if self.rank == 0:
            from transformers import AutoTokenizer

            self.engine.module.save_pretrained(
                os.path.join(folder, "model"), state_dict=state, safe_serialization=True
            )
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(
                os.path.join(folder, "model")
            )

    def load(self, folder: str) -> None:
        path, _ = self.engine.load_checkpoint(
            folder, tag="deepspeed", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {folder}")
