"""Sliding-window decoders never take the shared-prefix layouts (their log-probs were wrong
once a row crossed the window), and the start-up check says so even on rows that never cross
it."""

from __future__ import annotations

import pytest
import torch

from learner.logprobs import model_logprobs, prefix_problem
from learner.shared_prefix import packing_supported, window_problem
from tests.helpers import random_lm

WINDOW = 8  # tokens: the rows below are 2-3 windows long


@pytest.mark.parametrize("arch", ["Mistral", "Gemma2"])
def test_a_sliding_window_model_gets_no_shared_prefix(arch):
    model = random_lm(arch, 2, 32, 64, 2, 2, 64, sliding_window=WINDOW,
                      attn_implementation="eager").eval()  # fmt: skip
    # the padded shared-prefix layout scores these rows wrong: prompts of 12 and 5 tokens with
    # responses of 10 (row lengths 22 and 15 > 8), the short prompt padded to the long one
    lens = [(12, 10), (12, 6), (5, 10), (5, 6)]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (4, 22), generator=g)
    ids[1, :12], ids[3, :5] = ids[0, :12], ids[2, :5]
    mask = torch.zeros_like(ids)
    token_mask = torch.zeros(ids.shape)
    for r, (p, n) in enumerate(lens):
        mask[r, : p + n] = 1
        token_mask[r, p : p + n] = 1
    with torch.no_grad():
        plain, _ = model_logprobs(model, ids, mask, token_mask=token_mask)
        shared, _ = model_logprobs(model, ids, mask, token_mask=token_mask,
                                   prompt_lens=torch.tensor([p for p, _ in lens]))  # fmt: skip
    assert float((plain - shared).abs().max()) > 1e-3  # what the layout would have given
    # so the learner turns it off: the start-up check names the window, every layout
    why = prefix_problem(model)
    assert why is not None and "sliding-window" in why
    assert window_problem(model.config) == why
    assert "sliding-window" in packing_supported(model.get_decoder())


def test_a_full_attention_model_keeps_the_shared_prefix():
    model = random_lm("Llama", 2, 32, 64, 2, 2, 64, attn_implementation="eager").eval()
    assert window_problem(model.config) is None and prefix_problem(model) is None
