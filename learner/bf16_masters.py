"""bf16 training without a start-up dead zone: dithered fp32 masters (``learner.bf16_masters``).

DeepSpeed's bf16 mode keeps fp32 master weights and gives the model their bf16 rounding. It
builds the masters from the module after casting it to bf16, so every master starts exactly on
a bf16 grid point, and a weight cannot move until its master has drifted half a spacing (2^-9
to 2^-8 of its magnitude) from it: at lr 5e-6 Adam's ~lr per step needs tens of steps before
most weights move at all (bench_bf16_drift.py: 4% of SmolLM2's weights changed in 5 updates).

``dither`` offsets each trainable master once, after the engine is built, by d = u x s with u
uniform in (-0.5, 0.5) and s the bf16 spacing at the weight (half of it on the side below a
power of two, where the grid is twice as fine): the bf16 weights, and so the starting policy,
are unchanged (round(w + d) = w), but each master now sits at a uniform position inside its
rounding cell, so the first updates flip weights in proportion to their drift, as unbiased
rounding would. One seeded generator draws every parameter's full-size offsets on every rank,
so the offsets do not depend on how ZeRO partitions the masters. The masters are checkpointed
like any (a resume loads them; the dither is not drawn again over them). ``grid`` keeps
DeepSpeed's start (verl's and the paper authors' setup).

>>> x = torch.tensor([1.0, -1.0, 0.75, 3.0e-3, 0.0]).bfloat16().float()
>>> d = grid_offsets(x, torch.Generator().manual_seed(0))
>>> bool(((x + d).bfloat16().float() == x).all()), bool((d[:4] != 0).all()), float(d[4])
(True, True, 0.0)
"""

from __future__ import annotations

import torch
from torch import Tensor

BF16_BITS = 8  # significant bits of bfloat16 (7 stored, 1 implicit)


def grid_offsets(x: Tensor, generator: torch.Generator) -> Tensor:
    """Offsets ``d`` (``x``'s shape, float32) that keep every bf16 value of ``x`` where it
    rounds: |d| < half the spacing on its side (zeros stay zero)."""
    x = x.float()
    mantissa, exponent = torch.frexp(x)  # x = m * 2^e, |m| in [0.5, 1)
    spacing = torch.ldexp(torch.ones_like(x), exponent - BF16_BITS)
    u = (torch.rand(x.shape, generator=generator, dtype=torch.float64) - 0.5) * 0.999
    d = u.float() * spacing
    toward_zero = torch.sign(d) != torch.sign(x)
    d = torch.where((mantissa.abs() == 0.5) & toward_zero, d * 0.5, d)  # a power of two
    return torch.where(x == 0, torch.zeros_like(d), d)


def dither_masters(module: torch.nn.Module, seed: int) -> int:
    """Offset the fp32 master of every trainable parameter of a DeepSpeed bf16 engine's
    ``module`` by :func:`grid_offsets` (call on every rank, in the same order: ZeRO gathers a
    parameter's full master); returns the number of weights offset."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    generator = torch.Generator().manual_seed(seed)
    done = 0
    for p in module.parameters():
        if not p.requires_grad:
            continue
        full = safe_get_full_fp32_param(p)  # [p's full shape] fp32, gathered over the ranks
        if full is None:  # not a DeepSpeed-managed master (fp32 training)
            continue
        offsets = grid_offsets(full.detach().cpu(), generator).to(full.device)
        safe_set_full_fp32_param(p, full + offsets)
        done += full.numel()
    return done
