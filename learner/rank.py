"""One DeepSpeed learner rank, the body of a Ray actor (spawned by learner/group.py).

Each rank owns a replica (ZeRO 1/2) or a shard (ZeRO 3) of the policy, joins one
torch.distributed group (gloo on CPU, NCCL on GPU) and runs the PPO-style update on its shard
of the step's batch: micro-batches, log-probs recomputed under the current policy at the
sampling temperature (learner/logprobs.py), optionally the old log-probs recomputed first with
truncated importance weights (``learner.old_logprobs=recompute``), the policy loss with the
*global* token and sequence counts of the mini-batch (so the loss and gradient do not depend on
the split), ``backward(loss * world_size)`` (DeepSpeed averages gradients over ranks; the loss
pieces must sum) and one optimizer step per mini-batch. LoRA: learner/lora.py.

Non-finite steps: DeepSpeed's ZeRO 1-3 optimizers detect a non-finite global grad norm and skip
the update (weights and optimizer state untouched); we read that back per step and count it.
A non-finite loss (which may have finite gradients after the log-ratio clamp) is backpropagated
scaled by NaN so that its gradients are non-finite too. ZeRO stage 0 has no overflow check, so
there every rank tests its gradients and a MAX all-reduce makes all ranks skip together.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket

import torch

from comm.devices import dist_backend, reserved_device
from comm.hub import ModelRef, node_folder
from learner.batch import MicroBatch, TrainBatch
from learner.bf16_masters import dither_masters
from learner.config import LearnerConfig, old_logprobs_mode
from learner.export import WeightExport
from learner.logprobs import logits_problem, prefix_problem
from learner.lora import save_model
from learner.loss import LossConfig
from learner.policy import (
    available_ram_bytes,
    deepspeed_config,
    learner_dtype,
    load_policy,
    make_optimizer,
    skip_shm_all_reduce,
)
from learner.rank_update import RankUpdate
from learner.shared_prefix import packing_supported


class LearnerRank:
    def __init__(
        self,
        rank: int,
        world_size: int,
        cfg: LearnerConfig,
        loss: LossConfig,
        model_path: str | ModelRef,
        dtype: str = "float32",
        temperature: float = 1.0,
        threads: int | None = None,
    ):
        """``threads``: torch threads (default ``num_cpus_per_rank``; colocated: the node's
        cores divided by the ranks on it, launch/cluster.py ``plan_threads``)."""
        self.rank, self.world_size, self.cfg, self.loss_cfg = rank, world_size, cfg, loss
        self.model_path, self.temperature = node_folder(model_path), temperature
        self.dtype = learner_dtype(cfg, dtype)  # learner.dtype, else the model's
        mode = old_logprobs_mode(cfg.old_logprobs, self.dtype)  # auto: recompute in bf16
        self.cfg = cfg = dataclasses.replace(cfg, old_logprobs=mode)
        self.logits = cfg.logits  # "full" after init if the model needs it
        self.device = reserved_device(cfg.num_gpus_per_rank)  # what this actor reserved
        if self.device == "cpu":  # DeepSpeed would pick CUDA wherever it is visible
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            # compiles nothing: no inductor import for DeepSpeed's Muon (docs/NOTES.md 12-03)
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        self._listeners: dict[int, socket.socket] = {}  # rank 0: bound rendezvous ports
        torch.set_num_threads(threads or max(1, int(cfg.num_cpus_per_rank)))

    def address(self, host: str | None = None) -> tuple[str, int]:
        """A rendezvous address on this rank's node (called on rank 0, once per store it will
        host: DeepSpeed's process group, the weight-sync group). The port is bound here, on
        ``host`` only (default: the node's IP as Ray knows it, 127.0.0.1 for a loopback local
        Ray), and kept until the store takes it."""
        from comm.rendezvous import listen_socket

        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        sock = listen_socket(host)
        host, port = sock.getsockname()[:2]
        self._listeners[port] = sock
        return host, port

    def _listener(self, port: int):
        """The socket :meth:`address` bound for ``port`` (rank 0), else None (a client)."""
        return self._listeners.pop(port) if self.rank == 0 else None

    def init(self, master_addr: str, master_port: int) -> int:
        import deepspeed
        import torch.distributed as dist

        from comm.rendezvous import tcp_store

        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        backend = dist_backend(self.device)
        skip_shm_all_reduce()
        # The store first, on the socket rank 0 bound (torch's env:// store would listen on
        # every interface); DeepSpeed then adopts the initialised default group.
        timeout = datetime.timedelta(seconds=self.cfg.timeout_s)
        store = tcp_store(
            master_addr,
            master_port,
            self.world_size,
            timeout=timeout,
            listener=self._listener(master_port),
        )
        dist.init_process_group(
            backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout
        )
        deepspeed.init_distributed(dist_backend=backend)
        torch.manual_seed(0 if self.cfg.seed is None else self.cfg.seed)
        self.engine, self.optimizer, self.scheduler = self._deepspeed_engine()
        if self.dtype == "bfloat16" and self.cfg.bf16_masters == "dither":
            dither_masters(self.engine.module, 0 if self.cfg.seed is None else self.cfg.seed)
        self.export = WeightExport(self.engine.module, self.rank, self.cfg.zero_stage == 3)
        if self.logits == "chunked":
            # Every rank checks (a forward pass: ZeRO-3 gathers) and all take the full path if
            # any rank must (the two paths call the output embedding a different number of times).
            problem = self._on_any_rank(logits_problem(self.engine), dist)
            if problem is not None:
                self.logits = "full"
                print(f"learner: learner.logits=chunked falls back to full logits: {problem}")
        self.shared_prefix = self._shared_prefix_usable(dist)
        self.pack = self._pack_usable(dist) if self.shared_prefix else "off"
        # A frozen reference policy for the KL term, only when it is used (kl_coef > 0): a full
        # replica per rank (fine for small models; large ones want a ZeRO-3 inference engine).
        self.reference = None
        if self.loss_cfg.kl_coef > 0:
            self.reference = load_policy(self.model_path, self.cfg, self.dtype, trainable=False)
            self.reference.to(self.engine.device).eval().requires_grad_(False)
        self.update = RankUpdate(
            self.engine, self.scheduler, self.cfg, self.loss_cfg,
            temperature=self.temperature, logits=self.logits, shared_prefix=self.shared_prefix,
            pack=self.pack, reference=self.reference, world_size=self.world_size,
            device=self.device,
        )  # fmt: skip
        return self.rank

    def _deepspeed_engine(self):
        """The policy with AdamW and the warm-up schedule (learner/policy.py ``make_optimizer``)
        under DeepSpeed (ZeRO stage, dtype and clipping from the config: ``deepspeed_config``)."""
        import deepspeed

        model = load_policy(self.model_path, self.cfg, self.dtype)
        trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters alone
        optimizer, scheduler = make_optimizer(trained, self.cfg)
        config = deepspeed_config(self.cfg, self.dtype)
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
        )
        return engine, optimizer, scheduler

    def _on_any_rank(self, problem: str | None, dist) -> str | None:
        """This rank's ``problem`` with a self-check, or a stand-in when only another rank has one
        (all ranks must choose the same path: ZeRO-3 gathers per module call); None if none."""
        flag = torch.tensor([float(problem is not None)], device=self.engine.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() == 0:
            return None
        return problem or "it failed on another rank"

    def _shared_prefix_usable(self, dist) -> bool:
        """``learner.shared_prefix``, unless gradient checkpointing or full logits rule it out or
        the model fails the numeric check on any rank (every rank runs it: ZeRO-3 gathers)."""
        cfg = self.cfg
        if not cfg.shared_prefix:
            return False
        why = None
        if cfg.gradient_checkpointing:
            why = "learner.gradient_checkpointing is on (transformers keeps no KV cache then)"
        elif self.logits != "chunked":
            why = "the full-logits path is in use"
        if why is None:
            why = self._on_any_rank(prefix_problem(self.engine), dist)
        if why is not None and self.rank == 0:
            print(f"learner: learner.shared_prefix is off: {why}")
        return why is None

    def _pack_usable(self, dist) -> str:
        """``learner.pack``, or ``off`` when the decoder cannot take the packed layout or its
        shared-prefix check fails in that layout on any rank (every rank runs it)."""
        if self.cfg.pack == "off":
            return "off"
        why = packing_supported(self.engine.module.get_decoder())
        if why is None:
            why = self._on_any_rank(prefix_problem(self.engine, pack="on"), dist)
        if why is None:
            return self.cfg.pack
        if self.rank == 0:
            print(f"learner: learner.pack={self.cfg.pack} falls back to off: {why}")
        return "off"

    def memory(self) -> tuple[str, str, float]:
        """``(node id, device kind, free bytes)``: where this rank runs and the memory its
        activations may use (GPU: free device memory now; CPU: the node's available RAM)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        if self.device == "cuda":
            return node, "cuda", float(torch.cuda.mem_get_info()[0])
        return node, "cpu", available_ram_bytes()

    def micro_batch_budget(self, sharing: int) -> int:
        """The automatic micro-batch token budget (learner/policy.py), memory shared by
        ``sharing`` ranks."""
        from learner.policy import auto_micro_batch_tokens

        _, _, free = self.memory()
        return auto_micro_batch_tokens(
            self.engine.module.config,
            self.dtype,
            free,
            self.cfg.activation_memory_fraction,
            sharing,
        )

    def train(self, minibatches, totals, plans, epochs: int = 1, learner_version=None) -> dict:
        """learner/rank_update.py ``RankUpdate.train``: this rank's share of the update."""
        return self.update.train(minibatches, totals, plans, epochs, learner_version)

    def score(self, shard: TrainBatch, plan: list[MicroBatch]) -> torch.Tensor:
        """learner/rank_update.py ``RankUpdate.score``: intrinsic rewards of ``shard``."""
        return self.update.score(shard, plan)

    # ---- weights out (learner/export.py: every rank calls these at the same time) ------------

    def export_weights(self, every_rank: bool = False, adapter: bool = False):
        """The full (LoRA: merged) weights the engines load, on rank 0 or on every rank (None
        on the others); with ``adapter``, ``(weights, the adapter alone or None)``."""
        state = self.export.state(every_rank)
        return (state, self.export.adapter(every_rank)) if adapter else state

    def save(self, folder: str) -> None:
        """DeepSpeed's checkpoint in ``folder/deepspeed`` on every rank (LoRA: without the frozen
        weights); rank 0 writes the HF model in ``folder/model`` (LoRA: merged, and adapter/),
        gathered one parameter at a time under ZeRO-3."""
        frozen_out = self.cfg.lora.rank > 0
        self.engine.save_checkpoint(
            folder, "deepspeed", save_latest=False, exclude_frozen_parameters=frozen_out
        )
        state, adapter = self.export_weights(adapter=True)
        if self.rank == 0:
            from transformers import AutoTokenizer

            save_model(self.engine.module, state, adapter, folder)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(
                os.path.join(folder, "model")
            )

    def load(self, folder: str) -> None:
        """DeepSpeed's checkpoint under ``folder`` (the driver verified its manifest first),
        every torch file read with ``weights_only=True`` (learner/checkpoint.py)."""
        from learner.checkpoint import safe_torch_load

        self.engine.checkpoint_engine.load = safe_torch_load
        strict = self.cfg.lora.rank == 0  # LoRA: the frozen weights are the base model's
        path, _ = self.engine.load_checkpoint(folder, "deepspeed", load_module_strict=strict)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {folder}")

    def weight_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return self.export.specs()

    def open_weight_group(self, group) -> int:
        """Join the collective sync group (rank 0; every rank plans the buckets)."""
        self.export.open_group(group, self._listener)
        return self.rank

    def export_buckets(self, bucket_bytes: int) -> list | None:
        """The object-store sync's bucket refs (rank 0; None on the others)."""
        return self.export.bucket_refs(bucket_bytes)

    def export_file(self, bucket_bytes: int) -> tuple[str, str, int] | None:
        """The object-store sync on one node: ``(node id, path, bytes)`` of the weights file
        rank 0 wrote (learner/export.py ``write_file``); None on the other ranks."""
        import ray

        out = self.export.write_file(bucket_bytes)
        return None if out is None else (ray.get_runtime_context().get_node_id(), *out)

    def remove_weight_file(self) -> None:
        self.export.remove_file()

    def broadcast_weights(self, version: int) -> int:
        """Send policy ``version`` to the engines; the bytes sent (0 on ranks other than 0)."""
        return self.export.broadcast(version)
