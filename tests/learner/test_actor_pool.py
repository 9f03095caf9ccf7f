"""The test run's actor pool (tests/actor_pool.py) is sound: a learner rank built again in a
process that served another group trains exactly as the fresh one did, an hf rollout worker
generates exactly as the fresh one did, and an actor that died is never handed out again. Every
learner and rollout test whose group is not the first of the run's relies on this."""

from __future__ import annotations

import os

import pytest
import ray
import torch

from learner.config import LearnerConfig
from learner.group import LearnerGroup
from learner.loss import LossConfig
from tests.actor_pool import POOL, PooledRank, PooledWorker
from tests.helpers import train_batch


def _cfg(stage: int, **kw) -> LearnerConfig:
    return LearnerConfig(num_ranks=2, zero_stage=stage, lr=1e-3, micro_batch_size=3, **kw)


@pytest.fixture
def fresh_pool():
    """The pool's idle actors set aside (and kept for the modules after this one): the test's
    first group starts in fresh processes."""
    saved = {cls: POOL.idle.pop(cls) for cls in list(POOL.idle)}
    yield
    for cls, actors in saved.items():
        POOL.idle.setdefault(cls, []).extend(actors)


def _pids(group: LearnerGroup) -> list[int]:
    return ray.get([r.__ray_call__.remote(lambda _: os.getpid()) for r in group.ranks])


@pytest.mark.slow
def test_a_reused_rank_trains_bit_exactly_as_a_fresh_one_and_a_dead_one_is_dropped(
    ray_cluster, tiny_model_dir, fresh_pool
):
    from transformers import AutoModelForCausalLM

    _, batch = train_batch(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
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
    assert runs[0][0] == runs[1][0] == runs[2][0]  # one pair served all three, rank by rank
    (_, m0, w0), (_, m2, w2) = runs[0], runs[2]
    timeless = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))}  # noqa: E731
    assert timeless(m2) == timeless(m0) and m0["actor/optimizer_steps"] == 1
    for rank in (0, 1):
        assert w2[rank].keys() == w0[rank].keys()
        assert all(torch.equal(w2[rank][k], w0[rank][k]) for k in w0[rank])

    # A rank killed in a test is dropped when its group shuts down, and so is its peer: the
    # ranks of a group always share one history (a reused rank beside a fresh one hung in
    # ZeRO-3's start: DeepSpeed keeps process-wide state)
    survivor = group.ranks[0]
    ray.kill(group.ranks[1])
    group.shutdown()
    assert POOL.idle[PooledRank, 2] == []
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(survivor.__ray_call__.remote(lambda _: os.getpid()), timeout=60)


@pytest.mark.slow
def test_a_reused_hf_rollout_worker_generates_exactly_as_a_fresh_one(
    ray_cluster, tiny_model_dir, fresh_pool
):
    """An hf worker that served a group with another length limit and weights of its own
    (loaded from the learner side as a sync does) generates, in a new group, exactly what the
    fresh one did: the same tokens and log-probs."""
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.types import SamplingConfig

    prompts, params = ["12+7=", "3+4="], SamplingConfig(n=4, max_new_tokens=8, seed=3)
    runs = []
    for max_len in (64, 48, 64):
        group = RolloutGroup(RolloutConfig(engine="hf", num_workers=1, max_model_len=max_len,
                                           timeout_s=300), tiny_model_dir)  # fmt: skip
        pid = ray.get(group.workers[0].pid.remote())
        runs.append((pid, group.generate(prompts, params)))
        if max_len == 48:  # other weights in that process: the next group must not see them
            state = {k: torch.zeros_like(v) for k, v in _model(tiny_model_dir).state_dict().items()}
            ray.get(group.workers[0].load_weights.remote([ray.put(state)], 1))
        group.shutdown()
    assert runs[0][0] == runs[1][0] == runs[2][0]
    assert POOL.idle[PooledWorker, 1]
    first, last = runs[0][1], runs[2][1]
    assert [[s.response_ids for s in g.samples] for g in last] == [
        [s.response_ids for s in g.samples] for g in first
    ]
    assert [[s.logprobs for s in g.samples] for g in last] == [
        [s.logprobs for s in g.samples] for g in first
    ]


def _model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)
