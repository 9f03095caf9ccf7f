"""Random streams of a generation call.

Contract (docs/ARCHITECTURE.md section 4, "Sampling and log-probs"): ``generate(prompts, params)``
with ``params.seed = s`` draws sample j of the prompt at position p from its own stream, seeded with
``sample_seed(s, p, j) = prompt_seed(s, p) + j``. The ``+ j`` is vLLM's own rule for the n
children of a request (``seed + index``, vllm/v1/engine/parallel_sampling.py), so the vLLM
engine sends each prompt with ``prompt_seed(s, p)`` and the transformers engine seeds one
generator per row with ``sample_seed``: the same contract for both. Seeds are 62-bit hashes, so
two streams of a run collide with probability ~1e-18 (no prompt, sample, worker, step, round or
evaluation call shares a stream), and ``prompt_seed + j`` stays below 2**63.

The driver derives every call's ``s`` with :func:`derive_seed` from ``trainer.seed`` and the
call's role (step, round, worker, evaluation), so seeded runs reproduce bit-exactly.

>>> derive_seed(0, "train", 1) == derive_seed(0, "train", 1) != derive_seed(0, "train", 2)
True
>>> sample_seed(7, 3, 2) - sample_seed(7, 3, 0)
2
"""

from __future__ import annotations

import hashlib
import secrets

SEED_BITS = 62


def derive_seed(*parts: int | str) -> int:
    """A seed in [0, 2**62) from ``parts`` (stable across processes, machines and versions)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def prompt_seed(call_seed: int, position: int) -> int:
    """Seed of the prompt at ``position`` of a call seeded with ``call_seed``."""
    return derive_seed(call_seed, "prompt", position)


def sample_seed(call_seed: int, position: int, sample: int) -> int:
    """Seed of sample ``sample`` of the prompt at ``position`` (vLLM's child rule: + index)."""
    return prompt_seed(call_seed, position) + sample


def call_seed(seed: int | None) -> int:
    """The call's seed, or a fresh random one for an unseeded call."""
    return secrets.randbits(SEED_BITS) if seed is None else seed
