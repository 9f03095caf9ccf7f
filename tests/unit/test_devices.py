"""Device and executor choices of the GPU paths, decided on CPU (issue 26 items 2, 3, 8): what an
actor reserved decides its device and collective backend, not ``torch.cuda.is_available()``;
vLLM with tensor parallelism inside a Ray actor runs its own multiprocessing executor; the hf
engine draws its samples from CPU generators, wherever the model runs."""

from __future__ import annotations

import pytest
import torch

from comm.devices import dist_backend, reserved_device
from rollout.vllm_engine import executor_backend


def test_an_actor_without_reserved_gpus_never_picks_cuda(monkeypatch):
    # A CPU actor on a GPU node sees CUDA (Ray may leave the devices visible): before issue 26
    # it picked CUDA and NCCL from torch.cuda.is_available().
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert reserved_device(0.0) == "cpu" and dist_backend(reserved_device(0.0)) == "gloo"
    assert reserved_device(1.0) == "cuda" and dist_backend(reserved_device(1.0)) == "nccl"
    assert reserved_device(0.5) == "cuda"  # a fractional GPU is still a GPU


def test_reserved_gpus_that_cuda_cannot_see_are_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="reserved 1 GPU"):
        reserved_device(1.0)


def test_tensor_parallel_engines_use_vllms_multiprocessing_executor():
    # Inside a Ray actor that holds 2 GPUs, vLLM would pick its Ray executor, which refuses a
    # placement-group bundle with more than one GPU (vllm 0.33 v1/executor/ray_utils.py).
    assert executor_backend(1) is None  # vLLM's default (in-process)
    assert executor_backend(2) == "mp" and executor_backend(8) == "mp"


def test_hf_engine_generators_live_where_the_draw_happens():
    # The uniform draws are made on the CPU, so the generators must be CPU generators whatever
    # device the model is on (a CUDA generator with a CPU draw raises), and a (prompt, sample)
    # stream is the same on every device.
    from rollout.hf_engine import _draw, sample_generators
    from rollout.shares import whole

    gens = sample_generators(7, whole(2, 3))
    assert len(gens) == 6 and all(g.device.type == "cpu" for g in gens)
    logp = torch.log_softmax(torch.randn(6, 5, generator=torch.Generator().manual_seed(0)), -1)
    a = _draw(logp, sample_generators(7, whole(2, 3)))
    b = _draw(logp, sample_generators(7, whole(2, 3)))
    assert torch.equal(a, b) and a.device == logp.device
