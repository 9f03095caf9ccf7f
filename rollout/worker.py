"""A rollout worker: the Ray actor that owns one engine (vLLM or transformers) and answers the
driver's calls on it: generate (whole, or streamed group by group), score, load weights, sleep.

The driver never calls a worker directly: :class:`rollout.group.RolloutGroup` does.
"""

from __future__ import annotations

import logging
import os

import torch

from comm.hub import ModelRef, node_folder
from rollout.config import RolloutConfig
from rollout.precision import precision_env
from rollout.types import Group, SamplingConfig, Share

logger = logging.getLogger(__name__)


def make_engine(
    cfg: RolloutConfig, model_path: str, dtype: str, sleep_mode: bool = False, device: str = "cpu"
):
    """The configured engine; ``device``: what the actor reserved (comm/devices.py)."""
    engine = cfg.engine
    if engine == "vllm":
        for key, value in precision_env(dtype).items():  # before vLLM (and Triton) start
            os.environ.setdefault(key, value)
        try:
            import vllm  # noqa: F401
        except ImportError:
            logger.warning("vLLM is not installed: using the transformers (hf) engine")
            engine = "hf"
    if engine == "vllm":
        from rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, cfg, dtype=dtype, sleep_mode=sleep_mode, device=device)
    from rollout.hf_engine import HFEngine

    return HFEngine(model_path, dtype=dtype, device=device)


class RolloutWorker:
    """The actor body (wrapped with ``ray.remote`` by :func:`spawn_actor_group`)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        model_path: str | ModelRef,
        dtype: str,
        threads: int | None = None,
        cpus: list[int] | None = None,
        sleep_mode: bool = False,
    ):
        """``threads``: torch threads (default ``num_cpus_per_worker``); ``cpus``: the core ids
        a vLLM engine on CPU binds its OpenMP threads to (default: vLLM's own choice, which on a
        small machine keeps one core for its scheduler); ``sleep_mode``: the engine releases
        its GPU memory between generations (colocated with a learner rank on GPUs).
        ``model_path``: a folder, or the driver's :class:`~comm.hub.ModelRef` (the same hub
        commit on every node)."""
        import os

        from comm.devices import reserved_device

        torch.set_num_threads(threads or max(1, int(cfg.num_cpus_per_worker)))
        device = reserved_device(cfg.num_gpus_per_worker)
        if cpus and device == "cpu":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
        if device == "cpu" and cfg.tensor_parallel_size == 1:
            # vLLM's engine core in this process, not a second one competing for the cores:
            # requests, outputs and weight loads are calls instead of messages between processes
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if device == "cpu" and cfg.enforce_eager:
            # eager means no torch.compile in this actor: vllm-cpu still compiles its sampler's
            # helpers (the log-prob ranks) with inductor at the first call, 16 s of g++ on a
            # machine's cold cache, for the same tokens and log-probs (docs/NOTES.md 2026-12-03)
            from torch._dynamo import config as dynamo_config

            dynamo_config.disable = True
        self.engine = make_engine(cfg, node_folder(model_path), dtype, sleep_mode, device)
        self.device = device
        self.threads = torch.get_num_threads()

    def ready(self) -> str:
        """The engine and its device, e.g. ``HFEngine on cuda``; a vLLM engine adds its attention
        backend and, in fp32, its Triton precision (``VLLMEngine on cuda, attention
        TRITON_ATTN, TRITON_F32_DEFAULT=ieee``). The driver logs it (``engines: ...``)."""
        about = getattr(self.engine, "about", "")
        return f"{type(self.engine).__name__} on {self.device}" + (f", {about}" if about else "")

    def generate(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> list[Group]:
        return self.engine.generate(prompts, params, shares)

    def generate_stream(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ):
        """A Ray streaming generator: each item is what the engine finished in one step,
        ``[(prompt index, group), ...]`` (rollout/engine.py ``generate_stream``)."""
        yield from self.engine.generate_stream(prompts, params, shares)

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        return self.engine.score(prompt_ids, response_ids)

    def load_weights(self, buckets: list, version: int) -> int:
        """``buckets``: refs of ``{name: tensor}`` dicts in the object store, read one at a
        time as the engine takes them."""
        import ray

        self.engine.load_weights((ray.get(ref) for ref in buckets), version)
        return version

    def load_file(self, path: str, version: int) -> int:
        """The weights in the safetensors file at ``path`` on this node (the learner wrote it:
        rollout/weight_sync.py); the file stays (its writer rewrites it in place)."""
        self.engine.load_file(path, version)
        return version

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def policy_version(self) -> int:
        return self.engine.policy_version

    def last_weight_load(self) -> dict:
        """What the engine measured of its last object-store load (the vLLM engine: bytes,
        folder of the file, seconds writing it and reloading; the hf engine: nothing)."""
        return dict(getattr(self.engine, "last_load", {}))

    def weights_checksum(self) -> tuple[float, float]:
        """A diagnostic: (sum, sum of squares) of the engine's weights (comm/weight_protocol.py)."""
        return self.engine.weights_checksum()

    def sleep(self) -> None:
        """Release the engine's device memory for the learner's update (colocated, GPU)."""
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def pid(self) -> int:
        """This actor's process id (fault-injection tests kill it)."""
        import os

        return os.getpid()

    # collective weight sync (comm/weight_protocol.py)
    def weight_sync_ranks(self) -> int:
        """Processes of this engine in the sync group (its tensor-parallel size)."""
        return int(getattr(self.engine, "tensor_parallel_size", 1))  # the hf engine: one

    def open_weight_group(self, group, first_rank: int, specs) -> list[int]:
        return self.engine.open_weight_group(group, first_rank, specs)

    def receive_weights(self, version: int) -> int:
        self.engine.receive_weights(version)
        return version
