"""Issue 61, item 3, the driver's side: the verifier keys the driver forwards itself
(``verifier.call_timeout_s``, ``verifier.max_restarts``, ``verifier.alert_frac``), the
rollout group's (``rollout.num_workers``, ``max_restarts``, ``start_timeout_s``, ``timeout_s``)
and the learner group's (``learner.num_ranks``, ``timeout_s``, ``micro_batch_tokens``) reach
what they bound, each set to a non-default value (no Ray: actors and waits are
stand-ins)."""

from __future__ import annotations

import pytest

import launch.stages as stages
from comm.actors import ActorGroupError
from launch.config import TrainConfig
from reward.pool import PoolConfig


def _verifier(monkeypatch, **verifier) -> stages.Verifier:
    cfg = TrainConfig()
    for key, value in verifier.items():
        assert getattr(PoolConfig(), key) != value  # a non-default value
        setattr(cfg.verifier, key, value)
    monkeypatch.setattr(stages.Verifier, "_spawn", lambda self: object())  # no actor
    return stages.Verifier(cfg, placement=None, log=lambda line: None)


def test_call_timeout_s_bounds_the_wait_for_a_verification(monkeypatch):
    waits = []

    def settle(calls, timeout_s, what):
        waits.append(timeout_s)
        return {0: ([], 0, [])}  # verdicts, workers replaced, error texts

    monkeypatch.setattr(stages, "settle", settle)
    monkeypatch.setattr(stages, "score_truncated", lambda groups, verdicts, *a: verdicts)
    v = _verifier(monkeypatch, call_timeout_s=7.5)
    pending = stages.PendingVerdicts([], (), 0.0, "call", v.actor, 1.0)
    assert v.result(pending, "as_is") == [] and waits == [7.5]


def test_max_restarts_bounds_the_verifier_actors_restarts(monkeypatch):
    v = _verifier(monkeypatch, max_restarts=1)  # the default allows 3
    v.restart("died once")
    with pytest.raises(ActorGroupError, match="verifier.max_restarts reached"):
        v.restart("died twice")
    assert v.restarts == 1


def test_alert_frac_reaches_the_verifier_health_check():
    from launch.loop import Trainer
    from reward.tasks import Problem
    from tests.launch.test_loop_parts import FakeStages, _cfg, _trainer

    cfg = _cfg(dynamic=False)
    cfg.verifier.alert_frac = 0.05  # the default is 0.2
    trainer = _trainer(cfg, [Problem(f"p{i}", "q", "q", "1") for i in range(2)], FakeStages({}))
    assert isinstance(trainer, Trainer) and trainer.health.alert_frac == 0.05


class _Worker:
    """A stand-in rollout worker: ``ready.remote()`` and ``sleep.remote()`` return names."""

    class _Method:
        def __init__(self, value):
            self.value = value

        def remote(self, *args):
            return self.value

    def __init__(self, i: int):
        self.ready, self.sleep = self._Method(f"engine {i}"), self._Method(None)


def test_rollout_keys_reach_the_group(monkeypatch):
    """``rollout.num_workers``, ``max_restarts``, ``start_timeout_s`` and ``timeout_s`` (each
    non-default) bound the group's workers, restarts and waits."""
    import rollout.group as group
    from rollout.config import RolloutConfig

    cfg = RolloutConfig(num_workers=3, max_restarts=1, start_timeout_s=11.0, timeout_s=13.0)
    defaults = RolloutConfig()
    assert (defaults.num_workers, defaults.max_restarts) == (1, 3)
    assert (defaults.start_timeout_s, defaults.timeout_s) == (900.0, 600.0)
    spawned, waits = [], []
    monkeypatch.setattr(
        group.RolloutGroup, "_spawn", lambda self, i: spawned.append(i) or _Worker(i)
    )

    def get(refs, timeout_s, what):
        waits.append((what, timeout_s))
        return list(refs)

    monkeypatch.setattr(group, "get", get)
    g = group.RolloutGroup(cfg, "model", "float32")
    assert spawned == [0, 1, 2] and g.engines == ["engine 0", "engine 1", "engine 2"]
    g.sleep()
    g.restart(1, "died once")
    with pytest.raises(ActorGroupError, match=r"rollout.max_restarts \(1\) reached"):
        g.restart(1, "died twice")
    assert waits == [("starting rollout workers", 11.0), ("sleep", 13.0),
                     ("restarting rollout worker 1", 11.0)]  # fmt: skip


class _Rank:
    """A stand-in learner rank: what LearnerGroup asks of it while starting."""

    def __init__(self, args):
        self.args = args
        self.address = _Worker._Method(("127.0.0.1", 29500))
        self.init = _Worker._Method("up")


def test_learner_keys_reach_the_ranks_and_the_groups_waits(monkeypatch):
    """``learner.num_ranks``, ``timeout_s`` and ``micro_batch_tokens`` (non-default) shape the
    group, and every rank is built from the run's own config object (what the rank reads of
    it inside DeepSpeed's start, ``seed``, ``bf16_masters``, ``tis_cap``, only slow tests
    cover: tests/learner/test_bf16_masters.py, test_checkpoint.py)."""
    import learner.group as group
    from learner.config import LearnerConfig
    from learner.loss import LossConfig

    cfg = LearnerConfig(num_ranks=3, timeout_s=17.0, micro_batch_tokens=512, seed=5)
    defaults = LearnerConfig()
    assert (defaults.num_ranks, defaults.timeout_s, defaults.micro_batch_tokens) == (2, 900.0, None)
    spawned, waits = [], []

    def spawn(cls, count, *args, **kwargs):
        spawned.append((args, kwargs))
        return [_Rank(args)]

    def get(refs, timeout_s, what):
        waits.append((what, timeout_s))
        return list(refs)

    monkeypatch.setattr(group, "spawn_actor_group", spawn)
    monkeypatch.setattr(group, "get", get)
    g = group.LearnerGroup(cfg, LossConfig(), "model", dtype="bfloat16", resources=(0.5, 0.0))
    assert [a[:3] for a, _ in spawned] == [(r, 3, cfg) for r in range(3)]
    assert all(a[5] == "bfloat16" and k["num_cpus"] == 0.5 for a, k in spawned)
    assert [k["first_bundle"] for _, k in spawned] == [0, 1, 2]
    assert waits == [("learner rank 0 address", 17.0), ("starting DeepSpeed learner ranks", 17.0)]
    assert g.micro_batch_tokens == 512
