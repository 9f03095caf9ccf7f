"""What a rollout engine is: the calls the Ray worker (rollout/worker.py) makes on it. Two
implement it: ``VLLMEngine`` (rollout/vllm_engine.py) and ``HFEngine`` (rollout/hf_engine.py);
tests/unit/test_engine_protocol.py checks that both have every method with these parameters."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from rollout.types import Group, SamplingConfig, Share


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids of a rendered prompt. The tokenizer adds its special tokens (the BOS its
    model was trained with) unless the text already begins with the BOS token, as a chat
    template that writes it does (Llama-3, Gemma): no prompt gets two (tests/rollout/
    test_prompt_tokens.py)."""
    bos = tokenizer.bos_token
    written = bool(bos) and text.startswith(bos)
    return tokenizer(text, add_special_tokens=not written)["input_ids"]


class Engine(Protocol):
    policy_version: int  # the weights' version, stamped on every sample

    def generate(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> list[Group]:
        """``params.n`` samples per prompt, in prompt order, seeded per (prompt, sample).
        ``shares[k]``: which samples of which prompt of the caller's call ``prompts[k]`` stands
        for (rollout/shares.py): its group holds samples ``start..stop-1``, drawn from the
        streams of that position and those sample indices; None: ``Share(k, 0, params.n)``."""

    def generate_stream(
        self, prompts: list[str], params: SamplingConfig, shares: list[Share] | None = None
    ) -> Iterator[list[tuple[int, Group]]]:
        """The groups of :meth:`generate` as they finish: per engine step, ``(prompt index,
        group)`` of each prompt whose samples all ended in it (the verifier starts on them
        while the rest decode). An engine that decodes a static batch yields once."""

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-probs of ``response_ids`` after ``prompt_ids``."""

    def load_weights(self, buckets: Iterable[dict[str, torch.Tensor]], version: int) -> None:
        """New weights, one ``{name: tensor}`` bucket at a time (the object-store sync)."""

    def open_weight_group(self, group, first_rank: int, specs) -> list[int]:
        """Join the collective sync group (comm/weight_protocol.py ``SyncGroup``); its ranks."""

    def receive_weights(self, version: int) -> None:
        """Receive ``version`` from learner rank 0's broadcast and load it in place."""

    def weights_checksum(self) -> tuple[float, float]:
        """(sum, sum of squares) of the weights (comm/weight_protocol.py ``checksum``)."""

    def sleep(self) -> None:
        """Release device memory for a colocated update (a no-op where there is nothing to
        release)."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the memory back: ``["weights"]``, then ``["kv_cache"]``; None: all."""
