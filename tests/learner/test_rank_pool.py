"""The test run's learner rank pool (tests/rank_pool.py) is sound: a rank built again in a
process that served another group trains exactly as the fresh one did, and a rank that died is
never handed out again. Every learner test after the first of its module relies on this."""

from __future__ import annotations

import os

import pytest
import ray
import torch

from learner.config import LearnerConfig
from learner.group import LearnerGroup
from learner.loss import LossConfig
from tests.helpers import train_batch
from tests.rank_pool import POOL


def _cfg(stage: int, **kw) -> LearnerConfig:
    return LearnerConfig(num_ranks=2, zero_stage=stage, lr=1e-3, micro_batch_size=3, **kw)


def _pids(group: LearnerGroup) -> list[int]:
    return ray.get([r.__ray_call__.remote(lambda _: os.getpid()) for r in group.ranks])


@pytest.mark.slow
def test_a_reused_rank_trains_bit_exactly_as_a_fresh_one_and_a_dead_one_is_dropped(
    ray_cluster, tiny_model_dir
):
    from transformers import AutoModelForCausalLM

    _, batch = train_batch(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    POOL.drain()  # fresh processes for the first group
    runs = []
    # ZeRO-2 in fresh processes, then ZeRO-3 in bf16
    # in the same processes (another partitioning, dtype and set of DeepSpeed groups), then
    # ZeRO-2 again there: it must reproduce the first bit for bit.
    for cfg in (_cfg(2), _cfg(3, dtype="bfloat16"), _cfg(2)):
        group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
        metrics = group.train_on(batch)
        runs.append((_pids(group), metrics, group.export_weights(every_rank=True)))
        if len(runs) < 3:
            group.shutdown()
    assert sorted(runs[0][0]) == sorted(runs[1][0]) == sorted(runs[2][0])  # one pair served all
    (_, m0, w0), (_, m2, w2) = runs[0], runs[2]
    timeless = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))}  # noqa: E731
    assert timeless(m2) == timeless(m0) and m0["actor/optimizer_steps"] == 1
    for rank in (0, 1):
        assert w2[rank].keys() == w0[rank].keys()
        assert all(torch.equal(w2[rank][k], w0[rank][k]) for k in w0[rank])

    # A rank killed in a test is dropped when its group shuts down; the live one is kept.
    ray.kill(group.ranks[1])
    group.shutdown()
    idle = POOL.idle[1]
    assert len(idle) == 1
    survivor = ray.get(idle[0].__ray_call__.remote(lambda _: os.getpid()))
    assert survivor == runs[2][0][0]
