"""Which device an actor computes on, from what it reserved (issue 26).

An actor that reserved no GPU computes on the CPU with gloo even on a GPU node where CUDA is
visible to it (Ray need not hide the devices from a zero-GPU actor); one that reserved a GPU
(or a fraction of one) uses CUDA and NCCL, and says so clearly when CUDA is not there.
"""

from __future__ import annotations

import torch


def reserved_device(num_gpus: float) -> str:
    """``"cuda"`` when the actor reserved GPUs, else ``"cpu"``.

    >>> reserved_device(0.0)
    'cpu'
    """
    if num_gpus <= 0:
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"this actor reserved {num_gpus:g} GPU(s) but CUDA is not available in its process "
            "(no driver, or CUDA_VISIBLE_DEVICES hides the devices)"
        )
    return "cuda"


def dist_backend(device: str) -> str:
    """The torch.distributed backend for ``device``: NCCL on CUDA, gloo on the CPU."""
    return "nccl" if device == "cuda" else "gloo"
