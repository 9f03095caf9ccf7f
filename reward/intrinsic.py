r"""Rewards from the policy's own token distributions (INTUITOR, RENT), alone or mixed with the
verifier's: no extra generation, one no-gradient forward of the step's samples on the learner
(learner/logprobs.py ``model_intrinsic``).

Per sample i with response tokens t = 1..|o_i| and next-token distributions p_t = softmax(z_t / T)
(T the sampling temperature, the distribution the sample was drawn from):

- self-certainty (INTUITOR, Zhao et al. 2025, arXiv 2505.19590, their Eq. for
  Self-certainty(o|q)): SC_i = (1/|o_i|) sum_t KL(U || p_t) = (1/|o_i|) sum_t [-log V -
  (1/V) sum_v log p_t(v)], V the vocabulary size;
- negative entropy (RENT, Prabhudesai et al. 2025, arXiv 2505.22660): NE_i = -(1/|o_i|) sum_t
  H(p_t), over the whole response (RENT also reports an answer-span variant; not built here).

The step's reward: r_i = w_verifier * score_i + w_self_certainty * SC_i + w_neg_entropy * NE_i
(``algorithm.reward``). Where we chose: both use the sampling temperature's distribution (the
papers compute them from the policy's logits while sampling at T = 1 in their main runs, where the
two agree); the policy is the one that generated the step (before its update), as INTUITOR's
online self-certainty is.

Collapse with continuous rewards: two samples never score exactly alike, so ACR needs a tolerance:
the presets set ``algorithm.tau`` (a group is collapsed when the population std of its rewards is
below tau nats), which GRPO then also uses to give such a group 0 (its std division would only
amplify noise).

>>> cfg = IntrinsicRewardConfig(verifier=0.5, self_certainty=1.0)
>>> mix_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.2, 0.4]), torch.tensor([3.0, 1.0]), cfg)
tensor([3.5000, 1.0000])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class IntrinsicRewardConfig:
    """Weights of the step's reward sources (module docstring); the default is the verifier
    alone."""

    verifier: float = 1.0
    """Weight of the verifier's score."""
    self_certainty: float = field(default=0.0, metadata={"ge": 0.0})
    """Weight of INTUITOR's self-certainty (mean KL(U || p_t) over the response, nats)."""
    neg_entropy: float = field(default=0.0, metadata={"ge": 0.0})
    """Weight of RENT's negative mean token entropy over the response (nats)."""

    @property
    def intrinsic(self) -> bool:
        """Whether the learner must score the samples before the advantages."""
        return self.self_certainty != 0.0 or self.neg_entropy != 0.0


def response_means(values: Tensor, mask: Tensor) -> Tensor:
    """Per-row mean of ``values [B, T]`` over ``mask [B, T]`` (0 for an empty response).

    >>> response_means(torch.tensor([[9.0, 1.0, 3.0], [9.0, 4.0, 0.0]]),
    ...                torch.tensor([[0, 1, 1], [0, 1, 0]]))
    tensor([2., 4.])
    """
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def mix_rewards(
    scores: Tensor, entropy: Tensor, certainty: Tensor, cfg: IntrinsicRewardConfig
) -> Tensor:
    """r = w_verifier * score + w_self_certainty * certainty - w_neg_entropy * entropy, all
    ``[N]`` (per-sample means over the response)."""
    return (
        cfg.verifier * scores.double()
        + cfg.self_certainty * certainty.double()
        - cfg.neg_entropy * entropy.double()
    ).to(torch.float32)
