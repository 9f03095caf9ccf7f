"""Segment (per-group) statistics over a flat batch, vectorised with scatter ops.

A step's rewards arrive as one flat tensor ``rewards [N]`` with ``group_ids [N]``: any integer
ids, not necessarily contiguous, sorted or of equal group size. :func:`segment_groups` maps them
to groups ``0..M-1`` (ascending id) once; every statistic after that is a scatter/segment op.
There is no Python loop over groups anywhere here.

The usual RLVR batch (G samples per prompt, a prompt's samples adjacent, ids ascending) is
recognised as *regular*: then segment ops are reductions over a ``[M, G]`` view and per-group
values broadcast back without an index gather (several times faster at 1M rewards). Callers
never branch on it: they use :meth:`Groups.per_sample` and :meth:`Groups.broadcast`.

Shared by the ACR monitor (``diagnostics/acr.py``) and the advantage estimators
(``learner/advantage.py``) so that both agree bit for bit on which groups are collapsed.

>>> g = segment_groups(torch.tensor([7, 3, 7, 3, 3]))
>>> g.ids.tolist(), g.index.tolist(), g.size.tolist(), g.width
([3, 7], [1, 0, 1, 0, 0], [3, 2], None)
>>> mean, m2 = segment_moments(torch.tensor([1.0, 0.0, 3.0, 0.0, 3.0]), g)
>>> mean.tolist(), m2.tolist()
([1.0, 2.0], [6.0, 2.0])
>>> segment_groups(torch.tensor([4, 4, 9, 9])).width   # regular: 2 groups of 2, ascending
2
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

# Dense relabelling (bincount over the id range) is used when ids are non-negative and their
# range is at most this many times the number of samples; otherwise a sort (torch.unique).
_DENSE_RANGE_FACTOR = 4


@dataclass(frozen=True, eq=False)
class Groups:
    """The grouping of a flat batch of N samples into M groups."""

    ids: Tensor  # [M] the distinct group ids, ascending
    size: Tensor  # [M] long, samples per group
    inverse: Tensor | None = None  # [N] long group of each sample; None when regular
    width: int | None = None  # G when regular: every group is G adjacent samples, ids ascending

    @property
    def num(self) -> int:
        return int(self.ids.numel())

    @cached_property
    def index(self) -> Tensor:
        """``[N]`` long: the group (0..M-1) of each sample."""
        if self.inverse is not None:
            return self.inverse
        return torch.arange(self.num)[:, None].expand(-1, self.width).reshape(-1)

    def per_sample(self, values: Tensor) -> Tensor:
        """Per-sample ``values [N]`` shaped to combine with :meth:`broadcast` output."""
        return values.reshape(-1, self.width) if self.width is not None else values

    def broadcast(self, per_group: Tensor) -> Tensor:
        """Per-group ``[M]`` -> a tensor that lines up with :meth:`per_sample` output."""
        return per_group[:, None] if self.width is not None else per_group[self.index]


def segment_groups(group_ids: Tensor) -> Groups:
    """Relabel arbitrary integer ``group_ids [N]`` to groups ``0..M-1`` in ascending id order."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    ids64 = group_ids.long()
    n = ids64.numel()
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return Groups(ids=empty, size=empty, inverse=empty)
    if n == 1 or bool((ids64[1:] >= ids64[:-1]).all()):  # ascending: O(N), no sort
        ids, size = torch.unique_consecutive(ids64, return_counts=True)
        g = int(size[0])
        if bool((size == g).all()):
            return Groups(ids=ids, size=size, width=g)
        inverse = torch.repeat_interleave(torch.arange(ids.numel()), size)
        return Groups(ids=ids, size=size, inverse=inverse)
    lo, hi = int(ids64.min()), int(ids64.max())
    if lo >= 0 and hi < _DENSE_RANGE_FACTOR * n + 16:
        # O(N + range): mark present ids, number them in order, look each sample up.
        counts = torch.bincount(ids64, minlength=hi + 1)  # [hi+1]
        present = counts > 0
        rank = torch.cumsum(present, 0) - 1  # [hi+1], rank of each present id
        ids = present.nonzero().squeeze(1)
        return Groups(ids=ids, size=counts[present], inverse=rank[ids64])
    ids, inverse, size = torch.unique(ids64, sorted=True, return_inverse=True, return_counts=True)
    return Groups(ids=ids, size=size, inverse=inverse)


def segment_sum(values: Tensor, groups: Groups) -> Tensor:
    """Sum of ``values [N]`` per group -> ``[M]``."""
    if groups.width is not None:
        return values.reshape(-1, groups.width).sum(1)
    out = torch.zeros(groups.num, dtype=values.dtype, device=values.device)
    return out.index_add_(0, groups.index, values)


def segment_max(values: Tensor, groups: Groups) -> Tensor:
    """Max of ``values [N]`` per group -> ``[M]``."""
    if groups.width is not None:
        return values.reshape(-1, groups.width).amax(1)
    out = torch.full((groups.num,), -torch.inf, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, groups.index, values, reduce="amax", include_self=True)


def segment_moments(values: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
    """Per-group mean ``[M]`` and sum of squared deviations from it ``m2 [M]`` (two-pass).

    Two passes (mean first, then squared deviations) rather than ``E[x^2] - E[x]^2``: the latter
    cancels catastrophically for nearly equal rewards, which is exactly the collapse case.
    """
    mean = segment_sum(values, groups) / groups.size.to(values.dtype)
    dev = groups.per_sample(values) - groups.broadcast(mean)
    return mean, segment_sum((dev * dev).reshape(-1), groups)


def collapsed_groups(m2: Tensor, size: Tensor, tau: float) -> Tensor:
    """Collapse test of docs/ARCHITECTURE.md section 4: ``sigma_pop < tau`` or a single sample ->
    ``[M]`` bool.

    ``sigma_pop = sqrt(m2 / G) < tau``, tested as ``m2 < tau^2 * G`` (no division or root).
    """
    return (m2 < (tau * tau) * size) | (size <= 1)
