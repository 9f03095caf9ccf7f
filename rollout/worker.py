"""Rollout workers: a Ray actor owns one engine; a group spreads prompts over the actors.

The driver calls :class:`RolloutGroup`; it never sees an engine. Results come back in prompt
order; every remote wait has a timeout; a worker that dies makes the call raise
:class:`rollout.actors.ActorGroupError` naming it (restarting is the driver's policy).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from rollout.actors import get, spawn_actor_group
from rollout.config import RolloutConfig
from rollout.seeding import derive_seed
from rollout.types import Group, SamplingConfig
from rollout.weight_sync import TRANSPORTS, ObjectStoreTransport, weight_sync_backend

logger = logging.getLogger(__name__)


def make_engine(cfg: RolloutConfig, model_path: str, dtype: str):
    engine = cfg.engine
    if engine == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError:
            logger.warning("vLLM is not installed: using the transformers (hf) engine")
            engine = "hf"
    if engine == "vllm":
        from rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path,
            dtype=dtype,
            max_model_len=cfg.max_model_len,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_gib=cfg.kv_cache_gib,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            enforce_eager=cfg.enforce_eager,
            max_num_seqs=cfg.max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
        )
    from rollout.hf_engine import HFEngine

    return HFEngine(model_path, dtype=dtype, device=cfg.device)


class RolloutWorker:
    """The actor body (wrapped with ``ray.remote`` by :func:`spawn_actor_group`)."""

    def __init__(self, cfg: RolloutConfig, model_path: str, dtype: str):
        torch.set_num_threads(max(1, int(cfg.num_cpus_per_worker)))
        self.engine = make_engine(cfg, model_path, dtype)

    def ready(self) -> str:
        return type(self.engine).__name__

    def generate(self, prompts: list[str], params: SamplingConfig) -> list[Group]:
        return self.engine.generate(prompts, params)

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        return self.engine.score(prompt_ids, response_ids)

    def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> int:
        self.engine.load_weights(named_tensors, version)
        return version

    def policy_version(self) -> int:
        return self.engine.policy_version

    # collective weight sync (rollout/collective.py)
    def weight_sync_ranks(self) -> int:
        """Processes of this engine in the sync group (its tensor-parallel size)."""
        return int(getattr(self.engine, "tensor_parallel_size", 1))

    def open_weight_group(
        self, host, port, first_rank, world_size, backend, timeout_s, specs, bucket_bytes
    ) -> list[int]:
        return self.engine.open_weight_group(
            host, port, first_rank, world_size, backend, timeout_s, specs, bucket_bytes
        )

    def receive_weights(self, version: int) -> int:
        self.engine.receive_weights(version)
        return version


class RolloutGroup:
    def __init__(
        self,
        cfg: RolloutConfig,
        model_path: str,
        dtype: str = "float32",
        placement=None,
        wait: bool = True,
    ):
        """Spawns the workers; with ``wait`` (default) also waits until their engines are up.
        ``wait=False`` lets the caller start other actors meanwhile, then call
        :meth:`wait_ready` (vLLM takes ~30 s to start on CPU)."""
        self.cfg = cfg
        self.workers = spawn_actor_group(
            RolloutWorker,
            cfg.num_workers,
            cfg,
            model_path,
            dtype,
            num_cpus=cfg.num_cpus_per_worker,
            num_gpus=cfg.num_gpus_per_worker,
            placement=placement,
        )
        self._ready = [w.ready.remote() for w in self.workers]
        self.transport = TRANSPORTS[cfg.weight_sync](
            self.workers,
            timeout_s=cfg.timeout_s,
            bucket_mb=cfg.weight_sync_bucket_mb,
            backend=weight_sync_backend(cfg),
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> list[str]:
        """Wait (``rollout.start_timeout_s``) until every engine is up; returns their names."""
        self.engines = get(
            self._ready, timeout_s=self.cfg.start_timeout_s, what="starting rollout workers"
        )
        return self.engines

    def generate(self, prompts: list[str], params: SamplingConfig | None = None) -> list[Group]:
        """Groups of ``params.n`` samples for each prompt, in prompt order. Prompts are split
        into contiguous, equal-sized chunks, one per worker; with a seed s, worker i's call is
        seeded with ``derive_seed(s, "worker", i)`` (its own streams), so a run is reproducible
        for a given number of workers."""
        params = params or dataclasses.replace(self.cfg.sampling, n=self.cfg.n_samples)
        k = len(self.workers)
        bounds = [round(i * len(prompts) / k) for i in range(k + 1)]
        calls = []
        for i, w in enumerate(self.workers):
            chunk = prompts[bounds[i] : bounds[i + 1]]
            if chunk:
                seed = None if params.seed is None else derive_seed(params.seed, "worker", i)
                calls.append(w.generate.remote(chunk, dataclasses.replace(params, seed=seed)))
        parts = get(calls, timeout_s=self.cfg.timeout_s, what="rollout generation")
        return [group for part in parts for group in part]

    def push_weights(self, named_tensors, version: int) -> float:
        """Load new weights (a state dict, or an ObjectRef to one) into every engine through the
        object store (any transport's engines take this); returns the sync time in seconds."""
        return ObjectStoreTransport(self.workers, timeout_s=self.cfg.timeout_s).push(
            named_tensors, version
        )

    def sync_from(self, learner, version: int) -> float:
        """Learner rank 0's weights into every engine by ``rollout.weight_sync``; seconds."""
        return self.transport.sync_from(learner, version)

    def policy_versions(self) -> list[int]:
        return get(
            [w.policy_version.remote() for w in self.workers],
            timeout_s=self.cfg.timeout_s,
            what="policy versions",
        )

    def score(self, prompt_ids: list[int], response_ids: list[int], worker: int = 0) -> list[float]:
        return get(
            [self.workers[worker].score.remote(prompt_ids, response_ids)],
            timeout_s=self.cfg.timeout_s,
            what="scoring",
        )[0]

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
