"""Each distinct prompt through the decoder once, its samples' responses on its KV cache.

Two layouts of the same computation (:func:`shared_prefix_hidden`):

- padded: the distinct prompts as a ``[U, P]`` batch, the responses as ``[B, R - 1]`` on their
  prompts' caches (gathered per row), each row padded to the longest;
- packed: the prompts as one row of their ``sum(p)`` tokens and the responses as one row of
  their ``sum(r - 1)`` tokens, each attending through a block mask to its own prompt and its
  own earlier tokens (rotary positions as in its own row). No padding runs through the
  projections and MLPs, but attention's scores span the whole packed row: ``mode="auto"``
  packs when :func:`layout_costs` says that is cheaper (e.g. groups whose responses differ in
  length; not long rows, where the dense mask's quadratic cost wins).
"""

from __future__ import annotations

import torch
from torch import Tensor

PACK_MODES = ("auto", "off", "on")
# The packed row's masks hold (queries x keys) entries per layer call; past this many the
# padded layout runs whatever the costs say (64M fp32 entries: 256 MiB).
MAX_MASK_ENTRIES = 1 << 26


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


def layout_costs(
    prompt_lens: list[int], response_lens: list[int], token_flops: float, pair_flops: float
) -> tuple[float, float]:
    """``(padded, packed)``: a decoder layer's forward FLOPs in each layout, for the distinct
    prompts' lengths and every row's response tokens that run (its length - 1).
    ``token_flops``: per token through the layer's weights (2 x its parameters);
    ``pair_flops``: per (query, key) pair of attention (scores and weighted sum: 4 x heads x
    head size). Attention is counted over every pair the kernel computes: the padded batches'
    full rectangles, the packed rows' full query x key matrices.

    No padding: the same 10 tokens; pairs 4*4 + 2*3*(4+3) = 58 padded, 4*4 + 6*(4+6) = 76
    packed (each response also meets the other's keys):

    >>> layout_costs([4], [3, 3], token_flops=10, pair_flops=1)
    (158.0, 176.0)

    Responses of 1 and 7: padded 4 + 2*7 = 18 tokens and 16 + 2*7*11 = 170 pairs; packed
    4 + 8 = 12 tokens and 16 + 8*12 = 112 pairs:

    >>> layout_costs([4], [1, 7], token_flops=10, pair_flops=1)
    (350.0, 232.0)
    """
    u, b = len(prompt_lens), len(response_lens)
    p_max, r_max = max(prompt_lens), max(response_lens)
    p_tot, r_tot = sum(prompt_lens), sum(response_lens)
    padded = token_flops * (u * p_max + b * r_max) + pair_flops * (
        u * p_max * p_max + b * r_max * (p_max + r_max)
    )
    packed = token_flops * (p_tot + r_tot) + pair_flops * (p_tot * p_tot + r_tot * (p_tot + r_tot))
    return float(padded), float(packed)


def packing_supported(decoder) -> str | None:
    """Why ``decoder`` cannot run the packed layout (None when it can): it needs attention that
    takes a 4D mask (sdpa, eager) and no sliding-window layers (their caches drop keys)."""
    config = getattr(decoder, "config", None)
    if config is None:
        return "the decoder has no config"
    attn = getattr(config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} takes no 4D mask"
    return window_problem(config)


def window_problem(config) -> str | None:
    """Why a model with this config cannot share a prompt's pass between its responses in any
    layout (None when it can): sliding-window or linear-attention layers. Past the window, a
    response row after a padded prompt (and a packed cache, which drops keys) attends to other
    keys than the full sequence would: random Mistral and Gemma2 models with a window of 8 gave
    0.04-0.05 nats mean, up to 0.36 per token, 56-60% of the gradient off."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            return "the model has sliding-window or linear-attention layers"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    return None


def _layer_flops(decoder) -> tuple[float, float]:
    """``(token_flops, pair_flops)`` of one decoder layer (:func:`layout_costs`): the decoder's
    weights but its input embedding, over its layers (ZeRO-3's partitioned parameters counted at
    their full size)."""
    config = decoder.config
    layers = config.num_hidden_layers
    size = lambda p: getattr(p, "ds_numel", p.numel())  # noqa: E731
    params = sum(size(p) for p in decoder.parameters())
    params -= size(decoder.get_input_embeddings().weight)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2.0 * params / layers, 4.0 * heads * head_dim


def use_packed(decoder, mode: str, p_lens: list[int], r_lens: list[int]) -> bool:
    """Whether :func:`shared_prefix_hidden` packs a micro-batch whose distinct prompts have
    ``p_lens`` tokens and whose rows run ``r_lens`` response tokens, in ``mode`` (``on`` with a
    decoder that cannot pack is an error)."""
    if mode not in PACK_MODES:
        raise ValueError(f"pack must be one of {PACK_MODES}, got {mode!r}")
    if mode == "off":
        return False
    why = packing_supported(decoder)
    if mode == "on":
        if why is not None:
            raise ValueError(f"packed shared prefix: {why}")
        return True
    p_tot, r_tot = sum(p_lens), sum(r_lens)
    if why is not None or max(p_tot * p_tot, r_tot * (p_tot + r_tot)) > MAX_MASK_ENTRIES:
        return False
    padded, packed = layout_costs(p_lens, r_lens, *_layer_flops(decoder))
    return packed < padded


def shared_prefix_hidden(
    decoder, input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor, pack: str = "auto"
) -> Tensor:
    """The decoder's last hidden states ``[B, T, H]`` of right-padded ``prompt + response`` rows
    at the positions that predict response tokens (``prompt_lens[r] - 1`` up to the row's
    second-to-last token; other positions are 0), with each distinct prompt computed once.

    A group's n samples share their prompt: the prompts run once (with the KV cache kept,
    gradients included), then every row's response runs on its prompt's cache at positions
    ``prompt_len + j``. The same attention as one pass over the full rows, on ~(P + n R)
    instead of n (P + R) tokens per group. ``prompt_lens`` only decides what is shared: any
    split at or before a row's first scored position gives the same values (a response's first
    token is predicted from the prompt pass's last state). ``pack``: the layout (module
    docstring): ``auto`` (by :func:`layout_costs`), ``off`` (padded) or ``on`` (packed).
    """
    b, t = input_ids.shape
    device = input_ids.device
    prompt_lens = prompt_lens.to(device)
    first, which = distinct_prompts(input_ids, prompt_lens)
    which = which.to(device)
    resp_len = attention_mask.sum(1) - prompt_lens  # [B]
    runs = (resp_len - 1).clamp(min=0)  # response tokens that run: the last predicts none
    # ZeRO-3 gathers a module's weights at each call, forward and backward: every rank makes the
    # same calls, so a micro-batch whose responses run no token (all one token long) runs its
    # first row's first one anyway, its output joining the graph times zero.
    dummy = int(runs.sum()) == 0
    if dummy:
        runs[0] = 1  # runs is all zeros here (and its own tensor: clamp made it)
    p_list, r_list = prompt_lens[first].tolist(), runs.tolist()
    layout = _packed if use_packed(decoder, pack, p_list, r_list) else _padded
    flat_idx, values, h_resp = layout(decoder, input_ids, prompt_lens, which, first, runs, t)
    if dummy:
        flat_idx, values = flat_idx[:1], values[:1]
    hidden = _scatter(values[0], b, t, flat_idx, values)
    return hidden + 0 * h_resp.sum() if dummy else hidden


def _padded(decoder, input_ids, prompt_lens, which, first, runs, t):
    """(flat positions, their hidden states) of the prompt pass's last states and the responses'
    own, and the response pass's output: each distinct prompt a row, then each row's response
    on its prompt's cache, both padded to their longest."""
    b, device = input_ids.shape[0], input_ids.device
    p_len = prompt_lens[first]  # [U]
    p_max = int(p_len.max())
    p_mask = (torch.arange(p_max, device=device)[None] < p_len[:, None]).long()  # [U, P]
    prompts = input_ids[first, :p_max] * p_mask
    out = decoder(input_ids=prompts, attention_mask=p_mask, use_cache=True)
    h_prompt = out.last_hidden_state  # [U, P, H]
    # Position prompt_len - 1 predicts the first response token.
    flat_idx = [torch.arange(b, device=device) * t + prompt_lens - 1]
    values = [h_prompt[which, prompt_lens - 1]]  # [B, H]
    # The response's own positions predict its next tokens (the last predicts none).
    j = torch.arange(int(runs.max()), device=device)[None]  # [1, R - 1]
    r_mask = j < runs[:, None]  # [B, R - 1]
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
    return flat_idx, values, h_resp


def _scatter(like: Tensor, b: int, t: int, flat_idx: list, values: list) -> Tensor:
    flat = like.new_zeros(b * t, like.shape[-1])
    flat = flat.index_put((torch.cat(flat_idx),), torch.cat(values))
    return flat.view(b, t, -1)


def _mask(seen: Tensor, decoder) -> Tensor:
    """The ``[1, 1, Q, K]`` attention mask of a ``[Q, K]`` boolean one (True: the query sees
    the key) in the form the decoder's attention takes: sdpa the boolean one; eager an additive
    one in the weights' dtype (0 where seen, the dtype's lowest value elsewhere)."""
    if decoder.config._attn_implementation == "sdpa":
        return seen[None, None]
    dtype = decoder.get_input_embeddings().weight.dtype
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
    return mask.masked_fill_(~seen, torch.finfo(dtype).min)[None, None]


def _packed(decoder, input_ids, prompt_lens, which, first, runs, t):
    """As :func:`_padded`, the prompts as one row and the responses as another under block
    attention masks."""
    b, device = input_ids.shape[0], input_ids.device
    p_len = prompt_lens[first]  # [U]
    u = len(first)
    # Prompts as one row: prompt i's tokens at positions 0..p_i - 1.
    p_seg = torch.repeat_interleave(torch.arange(u, device=device), p_len)  # [Pt]
    p_start = torch.cumsum(p_len, 0) - p_len  # [U]
    p_pos = torch.arange(len(p_seg), device=device) - p_start[p_seg]  # [Pt]
    prompts = input_ids[torch.tensor(first, device=device)[p_seg], p_pos]  # [Pt]
    same = p_seg[:, None] == p_seg[None, :]  # [Pt, Pt]: causal within each prompt
    out = decoder(
        input_ids=prompts[None],
        attention_mask=_mask(same & (p_pos[None, :] <= p_pos[:, None]), decoder),
        position_ids=p_pos[None],
        use_cache=True,
    )
    h_prompt = out.last_hidden_state[0]  # [Pt, H]
    flat_idx = [torch.arange(b, device=device) * t + prompt_lens - 1]
    values = [h_prompt[p_start[which] + prompt_lens - 1]]  # [B, H]
    # Responses as one row: row r's tokens at positions prompt_len + j, j < runs[r].
    r_row = torch.repeat_interleave(torch.arange(b, device=device), runs)  # [Rt]
    r_start = torch.cumsum(runs, 0) - runs
    j = torch.arange(len(r_row), device=device) - r_start[r_row]
    pos = prompt_lens[r_row] + j  # [Rt]
    # Row r's query j sees its prompt's keys (all of them) and its own keys up to j.
    sees_prompt = which[r_row][:, None] == p_seg[None, :]  # [Rt, Pt]
    sees_row = (r_row[:, None] == r_row[None, :]) & (j[None, :] <= j[:, None])  # [Rt, Rt]
    mask = _mask(torch.cat([sees_prompt, sees_row], 1), decoder)
    h_resp = decoder(
        input_ids=input_ids[r_row, pos.clamp(max=t - 1)][None],
        attention_mask=mask,
        position_ids=pos[None],
        past_key_values=out.past_key_values,
        use_cache=True,
    ).last_hidden_state[0]  # [Rt, H]
    flat_idx.append(r_row * t + pos)
    values.append(h_resp)
    return flat_idx, values, h_resp
