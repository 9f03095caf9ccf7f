r"""Per-token log-probs and entropy of a causal LM at a sampling temperature, computed without
materialising the [B, T, V] logits.

The engines sample from softmax(z / T) and report the log-probs of that distribution
(rollout/types.py), so the learner scores the same distribution: for the token at position t,

    logp_t = log_softmax(z_{t-1} / T)[x_t],   H_t = -sum_v p_v log p_v,  p = softmax(z_{t-1} / T)

for the current, old and reference policies alike (docs/ARCHITECTURE.md section 4). Position 0 gets
0, and so does every position outside ``token_mask`` when one is given (the learner scores response
tokens only: prompt and padding positions never enter the loss).

Memory (``learner.logits``): at real vocabularies the logits are the learner's largest buffer
(32 x 4k tokens x 152k vocabulary is ~40 GB in bf16 and ~80 GB as fp32 softmax input).

- ``full``: the model returns the [B, T, V] logits (model dtype); ``token_logprobs``
  (learner/tempered_logits.py) then runs the fp32 softmax in chunks of ``chunk_tokens`` positions.
- ``chunked`` (default): :func:`model_logprobs` runs the model's decoder to the final hidden
  states [B, T, H], keeps the N scored positions [N, H], and applies the output embedding
  (``lm_head``; tied or not), the soft-cap if the config has one, and the tempered fp32
  log-softmax / gather / entropy to ``num_chunks`` pieces of at most ``chunk_tokens`` positions.
  With gradients and several pieces each piece runs under activation checkpointing, so the
  forward keeps only log-probs and entropies and the backward recomputes one piece's logits at a
  time: peak logits memory ~ ``chunk_tokens`` x V x ~18 bytes (bf16 logits, fp32 z, log-softmax,
  p, p log p) instead of B x T x V x (2 + 4 + ...). A single piece is not recomputed: its saved
  softmax (~8 bytes per entry) stays within that peak, and the backward skips a second output
  projection (every rank plans as many pieces, so ZeRO-3's gathers still match).

Through DeepSpeed: the engine does its bookkeeping around ``engine(...)`` (forward prologue and
epilogue, ZeRO-3's start-of-forward hook that resets its parameter-fetch order, and backward
hooks on that call's *outputs* that start its backward prologue before any gradient reaches a
parameter). So the chunked computation runs *inside* one call of the engine: the HF module's
``forward`` is swapped for the chunked function for that call only (:func:`_forward_as`), and the
log-probs are the call's outputs. Sub-modules are called as modules, so ZeRO-3 gathers their
parameters with its module hooks, in the forward and in the checkpoint recomputation. ZeRO-3 also
gathers the output embedding once per piece (a collective; larger pieces mean fewer gathers):
every rank must run the same number of pieces, so a multi-rank caller passes ``chunks`` (the
learner plans it over all ranks: learner/batch.py ``plan_microbatches``).

Models whose logits are not ``lm_head(hidden)`` (logit scaling; anything the numeric check of
:func:`logits_problem` catches) use the full path; Gemma-style ``final_logit_softcapping`` is
applied per piece.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from learner.shared_prefix import shared_prefix_hidden, window_problem
from learner.tempered_logits import CHUNK_TOKENS, piece_intrinsic, piece_logprobs, token_logprobs

LOGITS_MODES = ("chunked", "full")
# Config keys that put something other than lm_head(hidden) into the logits and that the chunked
# path does not reproduce (Cohere multiplies by logit_scale, Granite divides by logits_scaling).
UNSUPPORTED_LOGIT_KEYS = ("logit_scale", "logits_scaling")


def scored_positions(token_mask: Tensor | None, shape: tuple[int, int]) -> int:
    """How many positions the chunked path scores for a ``[B, T]`` batch: the nonzero entries of
    ``token_mask[:, 1:]`` (all B * (T - 1) without a mask), at least 1 (an empty batch still
    runs one position, so that every parameter gets its (zero) gradient)."""
    b, t = shape
    n = b * max(t - 1, 0) if token_mask is None else int((token_mask[:, 1:] != 0).sum())
    return max(n, 1)


def num_chunks(positions: int, chunk_tokens: int) -> int:
    """Pieces of at most ``chunk_tokens`` positions: ceil(positions / chunk_tokens), >= 1.

    >>> num_chunks(4096, 2048), num_chunks(4097, 2048), num_chunks(1, 2048)
    (2, 3, 1)
    """
    return max(1, -(-positions // chunk_tokens))


def _head_chunk(
    head, hidden: Tensor, targets: Tensor, temperature, softcap, with_entropy, intrinsic=False
):
    logits = head(hidden)  # [c, V] model dtype
    if softcap is not None:  # Gemma 2/3: cap * tanh(logits / cap), in the model dtype as HF does
        logits = torch.tanh(logits / softcap) * softcap
    if intrinsic:
        return piece_intrinsic(logits, temperature)
    lp, ent = piece_logprobs(logits, targets, temperature, with_entropy)
    return (lp, ent) if with_entropy else (lp,)


def _softcap(module) -> float | None:
    config = getattr(module, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "final_logit_softcapping", None)


def _chunked_forward(
    module,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_mask: Tensor | None,
    temperature: float,
    with_entropy: bool,
    chunks: int,
    intrinsic: bool = False,
    prompt_lens: Tensor | None = None,
    pack: str = "auto",
) -> tuple[Tensor, ...]:
    """(logp [B, T], entropy [B, T]) or (logp,): decoder, then output embedding in pieces;
    ``intrinsic``: (entropy, self-certainty) instead (:func:`model_intrinsic`). With
    ``prompt_lens`` (and a ``token_mask`` on response positions only), each distinct prompt
    runs through the decoder once (learner/shared_prefix.py; ``pack``: its layout)."""
    b, t = input_ids.shape
    decoder = module.get_decoder()
    if prompt_lens is not None and token_mask is not None:
        hidden = shared_prefix_hidden(decoder, input_ids, attention_mask, prompt_lens, pack)
    else:
        hidden = decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
    # Flat position p = i * T + s predicts token p + 1 (same row while s < T - 1).
    want = torch.zeros(b, t, dtype=torch.bool, device=input_ids.device)
    want[:, :-1] = True if token_mask is None else token_mask[:, 1:] != 0
    pos = want.flatten().nonzero().squeeze(-1)  # [N]
    dummy = pos.numel() == 0  # nothing to score: run one position, scaled by 0 (see below)
    if dummy:
        pos = torch.zeros(1, dtype=torch.long, device=input_ids.device)
    flat = hidden.reshape(b * t, -1).index_select(0, pos)  # [N, H]
    targets = input_ids.flatten()[pos + 1] if not dummy else input_ids.flatten()[:1]  # [N]
    # Several pieces: recompute each in the backward (module docstring); one: keep its softmax.
    recompute = torch.is_grad_enabled() and flat.requires_grad and chunks > 1
    head, softcap = module.get_output_embeddings(), _softcap(module)
    pieces = []
    for h, y in zip(flat.tensor_split(chunks), targets.tensor_split(chunks), strict=True):
        args = (head, h, y, temperature, softcap, with_entropy, intrinsic)
        pieces.append(
            checkpoint(_head_chunk, *args, use_reentrant=False) if recompute else _head_chunk(*args)
        )
    outs = []
    for values in zip(*pieces, strict=True):
        got = torch.cat(values)  # [N] fp32
        zeros = got.new_zeros(b * t)
        # dummy: all zeros, but every parameter stays in the graph (ZeRO reduces each one)
        out = zeros + 0.0 * got.sum() if dummy else zeros.index_put((pos + 1,), got)
        outs.append(out.view(b, t))
    return tuple(outs)


@contextlib.contextmanager
def _forward_as(module: torch.nn.Module, fn):
    """``module(...)`` runs ``fn`` instead of ``module.forward`` (hooks included) in the block."""
    had = "forward" in module.__dict__
    saved = module.__dict__.get("forward")
    module.forward = fn
    try:
        yield
    finally:
        if had:
            module.forward = saved
        else:
            del module.forward


def _unwrap(model) -> torch.nn.Module:
    """The HF module: ``engine.module`` for a DeepSpeed engine, else the model itself."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _full_logprobs(model, input_ids, attention_mask, token_mask, **score):
    """:func:`model_logprobs`'s ``full`` path: the model's [B, T, V] logits, scored by
    ``token_logprobs`` (``score``: its keywords), 0 outside ``token_mask`` when one is given."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp, ent = token_logprobs(out, input_ids, **score)
    if token_mask is not None:
        keep = token_mask != 0
        logp = torch.where(keep, logp, 0.0)
        ent = None if ent is None else torch.where(keep, ent, 0.0)
    return logp, ent


def model_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    logits: str = "chunked",
    chunk_tokens: int = CHUNK_TOKENS,
    token_mask: Tensor | None = None,
    chunks: int | None = None,
    prompt_lens: Tensor | None = None,
    pack: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """``(logp [B, T], entropy [B, T] or None)`` of ``input_ids`` under ``model`` (a DeepSpeed
    engine or a transformers causal LM) at ``temperature``; 0 at position 0 and outside
    ``token_mask [B, T]``. ``logits``: ``chunked`` or ``full`` (module docstring). ``chunks``:
    the number of output-embedding pieces of the chunked path (default
    ``num_chunks(scored_positions, chunk_tokens)``; ZeRO-3 callers pass one equal on all ranks).
    ``prompt_lens [B]`` (chunked path, with a ``token_mask`` that is 0 on prompts): rows are
    right-padded ``prompt + response`` and each distinct prompt runs once
    (learner/shared_prefix.py; same values to float rounding, fewer tokens); ``pack``: padded
    or packed prompts and responses (``auto``: the cheaper; ``off``; ``on``).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits not in LOGITS_MODES:
        raise ValueError(f"logits must be one of {LOGITS_MODES}, got {logits!r}")
    if logits == "full":
        score = dict(temperature=temperature, with_entropy=with_entropy, chunk_tokens=chunk_tokens)
        return _full_logprobs(model, input_ids, attention_mask, token_mask, **score)
    if chunks is None:
        chunks = num_chunks(scored_positions(token_mask, tuple(input_ids.shape)), chunk_tokens)
    module = _unwrap(model)

    def forward(input_ids, attention_mask):
        return _chunked_forward(
            module,
            input_ids,
            attention_mask,
            token_mask,
            temperature,
            with_entropy,
            chunks,
            prompt_lens=prompt_lens,
            pack=pack,
        )

    with _forward_as(module, forward):
        outs = model(input_ids=input_ids, attention_mask=attention_mask)
    return outs[0], (outs[1] if with_entropy else None)


@torch.no_grad()
def model_intrinsic(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    token_mask: Tensor,
    *,
    temperature: float = 1.0,
    logits: str = "chunked",
    chunk_tokens: int = CHUNK_TOKENS,
    chunks: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(entropy [B, T], self_certainty [B, T])`` of the distributions that predicted each
    token where ``token_mask [B, T]`` is set (0 elsewhere and at position 0), under ``model`` at
    ``temperature``, without gradient: the intrinsic rewards of INTUITOR and RENT
    (reward/intrinsic.py). Same ``logits`` modes and ``chunks`` contract as
    :func:`model_logprobs` (the chunked path never builds the [B, T, V] logits)."""
    if logits == "full":
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        b, t = input_ids.shape
        width = max(1, chunk_tokens // max(b, 1))
        parts = [piece_intrinsic(out[:, s : min(s + width, t - 1)], temperature)
                 for s in range(0, t - 1, width)]  # fmt: skip
        pad = lambda xs: torch.nn.functional.pad(  # noqa: E731
            torch.cat(xs, 1) if xs else out.new_zeros(b, 0, dtype=torch.float32), (1, 0)
        )
        keep = token_mask != 0
        ent, cert = pad([p[0] for p in parts]), pad([p[1] for p in parts])
        return torch.where(keep, ent, 0.0), torch.where(keep, cert, 0.0)
    if logits not in LOGITS_MODES:
        raise ValueError(f"logits must be one of {LOGITS_MODES}, got {logits!r}")
    if chunks is None:
        chunks = num_chunks(scored_positions(token_mask, tuple(input_ids.shape)), chunk_tokens)
    module = _unwrap(model)

    def forward(input_ids, attention_mask):
        return _chunked_forward(
            module, input_ids, attention_mask, token_mask, temperature, False, chunks, True
        )

    with _forward_as(module, forward):
        ent, cert = model(input_ids=input_ids, attention_mask=attention_mask)
    return ent, cert


# Largest |log-prob| gap the self-checks below accept between two paths of the same math, by the
# model's dtype. fp32: float rounding only (measured ~1e-5 on SmolLM2-135M). bf16: the shared
# prefix changes where attention rounds (measured 0.191 nats max on SmolLM2-135M on CPU; the
# chunked logits 0); a broken path (a shifted position, a wrong prefix) is off by nats.
CHECK_TOLERANCE = {torch.float32: 1e-2, torch.bfloat16: 0.5, torch.float16: 0.5}


def check_tolerance(model) -> float:
    """The self-checks' tolerance for ``model``'s parameter dtype (:data:`CHECK_TOLERANCE`).

    >>> check_tolerance(torch.nn.Linear(2, 2)), check_tolerance(torch.nn.Linear(2, 2).bfloat16())
    (0.01, 0.5)
    """
    dtype = next(_unwrap(model).parameters()).dtype
    return CHECK_TOLERANCE.get(dtype, 1e-2)


def logits_problem(model, *, tolerance: float | None = None) -> str | None:
    """Why the chunked path would not reproduce ``model``'s logits (None when it does).

    Static checks (a decoder and an output embedding to call; no config key from
    ``UNSUPPORTED_LOGIT_KEYS``), then a numeric one: chunked and full log-probs of a fixed
    2 x 8-token batch must agree within ``tolerance`` (catches any other transform of the
    logits). Runs a forward pass: under ZeRO-3 every rank must call it. ``tolerance``: by
    the model's dtype unless given (:func:`check_tolerance`).
    """
    tolerance = check_tolerance(model) if tolerance is None else tolerance
    module = _unwrap(model)
    config = getattr(module, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in UNSUPPORTED_LOGIT_KEYS:
        value = getattr(text, key, None)
        if value is not None and value != 1:
            return f"the model config sets {key}={value} (logits are not lm_head(hidden))"
    get_decoder = getattr(module, "get_decoder", None)
    decoder = get_decoder() if get_decoder else None
    if decoder is None or decoder is module or module.get_output_embeddings() is None:
        return f"{type(module).__name__} has no separate decoder and output embedding"
    weight = module.get_output_embeddings().weight
    vocab = getattr(weight, "ds_shape", weight.shape)[0]  # ZeRO-3: the local shard is empty
    device = next(module.parameters()).device
    ids = (torch.arange(16, device=device).view(2, 8) * 7919 + 3) % vocab
    mask = torch.ones_like(ids)
    with torch.no_grad():
        full, _ = model_logprobs(model, ids, mask, logits="full")
        try:
            chunked, _ = model_logprobs(model, ids, mask, logits="chunked", chunks=2)
        except Exception as err:  # noqa: BLE001 - any failure means: use the full path
            return f"the chunked forward failed: {type(err).__name__}: {err}"
    gap = float((full - chunked).abs().max())
    if not math.isfinite(gap) or gap > tolerance:
        return f"chunked log-probs differ from the full logits' by {gap:.3g} (> {tolerance})"
    return None


def prefix_problem(model, *, tolerance: float | None = None, pack: str = "off") -> str | None:
    """Why ``shared_prefix_hidden`` (learner/shared_prefix.py) would not reproduce ``model``'s
    plain chunked log-probs (None when it does), in the ``pack`` layout: a fixed batch of two
    prompts (lengths 5 and 3) with two responses each (lengths 4 and 2) is scored both ways.
    Runs two forward passes: under ZeRO-3 every rank must call it. ``tolerance``: by the
    model's dtype unless given (:func:`check_tolerance`)."""
    module = _unwrap(model)
    why = window_problem(getattr(module, "config", None))
    if why is not None:  # (a check on short rows would pass: they never cross the window)
        return why
    tolerance = check_tolerance(model) if tolerance is None else tolerance
    weight = module.get_output_embeddings().weight
    vocab = getattr(weight, "ds_shape", weight.shape)[0]
    device = next(module.parameters()).device
    lens = [(5, 4), (5, 2), (3, 4), (3, 2)]
    ids = (torch.arange(36, device=device).view(4, 9) * 7919 + 3) % vocab
    ids[1, :5], ids[3, :3] = ids[0, :5], ids[2, :3]  # samples of one prompt share it
    mask = torch.zeros_like(ids)
    token_mask = torch.zeros(ids.shape, device=device)
    for r, (p, n) in enumerate(lens):
        mask[r, : p + n] = 1
        token_mask[r, p : p + n] = 1
    prompt_lens = torch.tensor([p for p, _ in lens], device=device)
    with torch.no_grad():
        plain, _ = model_logprobs(model, ids, mask, token_mask=token_mask)
        try:
            shared, _ = model_logprobs(
                model, ids, mask, token_mask=token_mask, prompt_lens=prompt_lens, pack=pack
            )
        except Exception as err:  # noqa: BLE001 - any failure means: compute every row in full
            return f"the shared-prefix forward failed: {type(err).__name__}: {err}"
    gap = float((plain - shared).abs().max())
    if not math.isfinite(gap) or gap > tolerance:
        return f"shared-prefix log-probs differ from the plain ones by {gap:.3g} (> {tolerance})"
    return None
