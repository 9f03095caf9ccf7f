"""Issue 61, item 3, the driver's side: the verifier keys the driver forwards itself
(``verifier.call_timeout_s``, ``verifier.max_restarts``, ``verifier.alert_frac``) reach what
they bound, each set to a non-default value (no Ray: the actor and the wait are stand-ins)."""

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
