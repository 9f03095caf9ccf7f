"""Each distinct prompt through the decoder once, its samples' responses on its KV cache."""

from __future__ import annotations

import torch
from torch import Tensor


def distinct_prompts(input_ids: Tensor, prompt_lens: Tensor) -> tuple[list[int], Tensor]:
    """``(first, which)``: the first row of each distinct prompt (``input_ids[r, :prompt_lens[r]]``)
    in row order, and each row's index into ``first`` ``[B]``.

    >>> ids = torch.tensor([[5, 6, 1], [5, 6, 2], [7, 1, 0], [5, 6, 3]])
    >>> distinct_prompts(ids, torch.tensor([2, 2, 1, 2]))
    ([0, 2], tensor([0, 0, 1, 0]))
    """
    seen: dict[tuple[int, ...], int] = {}
    first, which = [], []
    for row, (ids, n) in enumerate(zip(input_ids.tolist(), prompt_lens.tolist(), strict=True)):
        key = tuple(ids[:n])
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        which.append(seen[key])
    return first, torch.tensor(which, dtype=torch.long)


def shared_prefix_hidden(
    decoder, input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor
) -> Tensor:
    """The decoder's last hidden states ``[B, T, H]`` of right-padded ``prompt + response`` rows
    at the positions that predict response tokens (``prompt_lens[r] - 1`` up to the row's
    second-to-last token; other positions are 0), with each distinct prompt computed once.

    A group's n samples share their prompt: the prompts run once (``[U, P]``, U distinct, with
    the KV cache kept, gradients included), then every row's response runs on its prompt's
    cache (gathered per row) at positions ``prompt_len + j``. The same attention as one pass
    over the full rows, on ~(P + n R) instead of n (P + R) tokens per group. ``prompt_lens``
    only decides what is shared: any split at or before a row's first scored position gives the
    same values (a response's first token is predicted from the prompt pass's last state).
    """
    b, t = input_ids.shape
    device = input_ids.device
    prompt_lens = prompt_lens.to(device)
    first, which = distinct_prompts(input_ids, prompt_lens)
    which = which.to(device)
    p_len = prompt_lens[first]  # [U]
    p_max = int(p_len.max())
    p_mask = (torch.arange(p_max, device=device)[None] < p_len[:, None]).long()  # [U, P]
    prompts = input_ids[first, :p_max] * p_mask
    out = decoder(input_ids=prompts, attention_mask=p_mask, use_cache=True)
    h_prompt = out.last_hidden_state  # [U, P, H]
    resp_len = attention_mask.sum(1) - prompt_lens  # [B]
    r_max = int(resp_len.max())
    hidden_size = h_prompt.shape[-1]
    # Position prompt_len - 1 predicts the first response token.
    flat_idx = [torch.arange(b, device=device) * t + prompt_lens - 1]
    values = [h_prompt[which, prompt_lens - 1]]  # [B, H]
    if r_max > 1:  # the response's own positions predict its next tokens (the last predicts none)
        j = torch.arange(r_max - 1, device=device)[None]  # [1, R - 1]
        r_mask = j < resp_len[:, None]  # [B, R - 1]
        pos = prompt_lens[:, None] + j  # [B, R - 1]
        resp = input_ids.gather(1, pos.clamp(max=t - 1)) * r_mask
        cache = out.past_key_values
        cache.batch_select_indices(which)  # [U, ...] -> [B, ...]
        mask = torch.cat([p_mask[which], r_mask.long()], 1)  # [B, P + R - 1]
        h_resp = decoder(
            input_ids=resp,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state  # [B, R - 1, H]
        rows = torch.arange(b, device=device)[:, None].expand_as(pos)
        flat_idx.append((rows * t + pos)[r_mask])
        values.append(h_resp[r_mask])
    flat = h_prompt.new_zeros(b * t, hidden_size)
    flat = flat.index_put((torch.cat(flat_idx),), torch.cat(values))
    return flat.view(b, t, hidden_size)
