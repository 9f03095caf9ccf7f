"""Record types of the rollout stage: what a generation request asks and what comes back.

Plain dataclasses of Python values (token ids, floats, strings), cheap to send through Ray.
``logprobs`` are the log-probabilities of the sampled tokens under the distribution that was
sampled, softmax(logits / T) over the whole vocabulary (no top-p), i.e. what the learner
recomputes for the PPO ratio with its logits divided by the same T; both engines follow this
convention. Every (prompt, sample) of a seeded call has its own random stream
(rollout/seeding.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SamplingConfig:
    """Sampling parameters of one generation call (made from ``rollout.sampling``,
    :class:`SamplingSettings`, with the call's group size and seed)."""

    n: int = field(default=1, metadata={"ge": 1})
    """Samples per prompt (the group size G)."""
    temperature: float = field(default=1.0, metadata={"ge": 0.0})
    """0 = greedy. The learner divides its logits by the same T (no top-p: the learner scores
    the whole tempered distribution, docs/ARCHITECTURE.md section 4)."""
    max_new_tokens: int = field(default=8, metadata={"ge": 1})
    seed: int | None = None
    """Seed of the call; the same seed, prompts and weights give the same samples; sample j of
    the prompt at position p draws from its own stream (rollout/seeding.py)."""


@dataclass
class SamplingSettings:
    """``rollout.sampling``: what every generation call of a run shares. The group size and the
    seed are the call's (``rollout.n_samples``, seeds derived from ``trainer.seed``).

    >>> SamplingSettings(max_new_tokens=16).params(n=4, seed=3)
    SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=3)
    """

    temperature: float = field(default=1.0, metadata={"ge": 0.0})
    """0 = greedy (training needs T > 0: the learner divides its logits by T)."""
    max_new_tokens: int = field(default=8, metadata={"ge": 1})

    def params(self, *, n: int = 1, seed: int | None = None, **changes) -> SamplingConfig:
        """One call's parameters: these settings with ``changes``, ``n`` samples, ``seed``."""
        return SamplingConfig(n=n, seed=seed, **{**dataclasses.asdict(self), **changes})


@dataclass(frozen=True)
class Share:
    """Samples ``[start, stop)`` of the prompt at ``position`` of a call: what one worker
    generates of that prompt's group when a group is spread over workers (rollout/shares.py).
    Sample j draws from the stream ``sample_seed(s, position, j)`` (rollout/seeding.py)."""

    position: int
    start: int
    stop: int


@dataclass
class Sample:
    response_ids: list[int]  # generated tokens, EOS included when generation stopped on it
    logprobs: list[float]  # one per response token
    text: str  # decoded response without special tokens
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    policy_version: int  # weights version that produced it


@dataclass
class Group:
    """The n samples of one prompt."""

    prompt: str
    prompt_ids: list[int]
    samples: list[Sample]
